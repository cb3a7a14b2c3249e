-- Handlers, ordering (docs/design/guarantees.md, docs/design/handlers.md): what a message
-- waiting for its retry holds back with ordering 'partition', 'key' and 'none', waiting
-- messages that do not hide later due ones from a call, and unhandled messages kept
-- (unhandled => 'keep') until a handler comes.
-- The handlers_* suites (handlers_register, _process, _failures, _ordering, _run_as,
-- _operations) each start from sql/include/handlers_setup.sql and end with
-- sql/include/handlers_cleanup.sql. Needs no broker: inbox rows are inserted directly.

-- pg_regress sets PG_ABS_SRCDIR to its --inputdir: the top of the repository.
\getenv abs_srcdir PG_ABS_SRCDIR
\set handlers_setup :abs_srcdir '/sql/include/handlers_setup.sql'
\set handlers_cleanup :abs_srcdir '/sql/include/handlers_cleanup.sql'
\i :handlers_setup

-- ---- process: ordering ---------------------------------------------------------------------

-- 'partition': a message waiting for its retry holds back the later messages of its partition
-- (neither run nor counted), not those of other partitions or topics.
TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('ordp', ARRAY['orders', 'refunds'], backoff => '1 hour',
                                   backoff_max => '10 hours');
SELECT eventbox.register_handler('ordp', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/0', 'record');
SELECT pg_temp.put('ordp', 'orders', 0, 0), pg_temp.put('ordp', 'orders', 0, 1),
       pg_temp.put('ordp', 'orders', 0, 2), pg_temp.put('ordp', 'orders', 1, 0),
       pg_temp.put('ordp', 'orders', 1, 1), pg_temp.put('ordp', 'refunds', 0, 0);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordp');
RESET ROLE;
SELECT message_id, status, attempts, next FROM msgs WHERE sub = 'ordp' ORDER BY message_id;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordp');
RESET ROLE;
-- Fixed and due: the partition goes on, in offset order.
TRUNCATE regress_eventbox_fn.failing;
SELECT pg_temp.due('ordp');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordp');
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE sub = 'ordp' ORDER BY message_id;
SELECT topic, "partition", "offset", attempts FROM regress_eventbox_fn.effects
 ORDER BY topic, "partition", n;

-- 'key': it holds back only the later messages with the same key (messages without a key are
-- one key of their own).
TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('ordk', ARRAY['orders'], ordering => 'key',
                                   backoff => '1 hour', backoff_max => '10 hours');
SELECT eventbox.register_handler('ordk', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/0', 'record'), ('orders/0/3', 'record');
SELECT pg_temp.put('ordk', 'orders', 0, 0, key => 'a'), pg_temp.put('ordk', 'orders', 0, 1, key => 'b'),
       pg_temp.put('ordk', 'orders', 0, 2, key => 'a'), pg_temp.put('ordk', 'orders', 0, 3),
       pg_temp.put('ordk', 'orders', 0, 4), pg_temp.put('ordk', 'orders', 0, 5, key => 'b');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordk');
RESET ROLE;
SELECT message_id, key, status, attempts, next FROM msgs WHERE sub = 'ordk' ORDER BY message_id;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordk');
RESET ROLE;
TRUNCATE regress_eventbox_fn.failing;
SELECT pg_temp.due('ordk');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordk');
RESET ROLE;
SELECT message_id, key, status, attempts FROM msgs WHERE sub = 'ordk' ORDER BY message_id;
SELECT "offset", attempts FROM regress_eventbox_fn.effects ORDER BY n;

-- 'none': it holds back nothing.
TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('ordn', ARRAY['orders'], ordering => 'none',
                                   backoff => '1 hour', backoff_max => '10 hours');
SELECT eventbox.register_handler('ordn', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/0', 'record');
SELECT pg_temp.put('ordn', 'orders', 0, 0, key => 'a'), pg_temp.put('ordn', 'orders', 0, 1, key => 'a'),
       pg_temp.put('ordn', 'orders', 0, 2);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordn');
RESET ROLE;
SELECT message_id, key, status, attempts, next FROM msgs WHERE sub = 'ordn' ORDER BY message_id;
TRUNCATE regress_eventbox_fn.failing;

-- Messages that wait do not hide later due messages of their partition from a call, however
-- many of them come first. (Fails before the fix: a pass reads only the first max_messages
-- messages of each partition - the first 1000 with ordering 'key' - so waiting messages there
-- stop every later one; the handler workers pass 64 as max_messages.)
-- 'none', with max_messages => 2: two waiting retries, then a due message.
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", status,
                            attempts, next_attempt_at)
VALUES ('ordn', 'orders/1/0', 'orders', 1, 0, 'retry', 1, now() + interval '1 hour'),
       ('ordn', 'orders/1/1', 'orders', 1, 1, 'retry', 1, now() + interval '1 hour');
SELECT pg_temp.put('ordn', 'orders', 1, 2);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordn', 2) AS none_window;
SELECT eventbox.process('ordn') IS NOT NULL AS drained;
RESET ROLE;
SELECT message_id, status, attempts, next FROM msgs WHERE sub = 'ordn' AND message_id LIKE 'orders/1/%'
 ORDER BY message_id;
-- 'key': key 'a' waits and has 1000 more messages; then one message with key 'b'.
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", key, status,
                            attempts, next_attempt_at)
VALUES ('ordk', 'orders/1/0', 'orders', 1, 0, 'a', 'retry', 1, now() + interval '1 hour');
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", key)
SELECT 'ordk', 'orders/1/' || o, 'orders', 1, o, 'a' FROM generate_series(1, 1000) AS o;
SELECT pg_temp.put('ordk', 'orders', 1, 1001, key => 'b');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordk') AS key_window;
RESET ROLE;
SELECT key, status, count(*) FROM msgs WHERE sub = 'ordk' AND message_id LIKE 'orders/1/%'
 GROUP BY 1, 2 ORDER BY 1, 2;
DELETE FROM eventbox.inbox WHERE subscription = 'ordk' AND "partition" = 1;

-- ---- process: unhandled messages kept ------------------------------------------------------

TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('keep', ARRAY['orders'], unhandled => 'keep',
                                   backoff => '1 hour', backoff_max => '10 hours');
SELECT eventbox.register_handler('keep', 'regress_eventbox_fn.record(eventbox.inbox)', 'A',
                                 'regress_eventbox_runner');
RESET ROLE;
-- Kept messages stay 'received', uncounted, and do not hold back the later ones.
SELECT pg_temp.put('keep', 'orders', 0, 0, 'B'), pg_temp.put('keep', 'orders', 0, 1, 'A'),
       pg_temp.put('keep', 'orders', 0, 2);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('keep');
RESET ROLE;
SELECT message_id, event_type, status, attempts, next, done FROM msgs WHERE sub = 'keep'
 ORDER BY message_id;
-- A handler registered later gets them.
SET ROLE regress_eventbox_owner;
SELECT eventbox.register_handler('keep', 'regress_eventbox_fn.record(eventbox.inbox)', 'B',
                                 'regress_eventbox_runner');
SELECT eventbox.process('keep');
RESET ROLE;
SELECT message_id, event_type, status, attempts FROM msgs WHERE sub = 'keep' ORDER BY message_id;
-- Kept messages do not use up a call's max_messages either. (Fails before the fix: the two
-- kept messages fill the window of two and the call handles nothing.)
SELECT pg_temp.put('keep', 'orders', 1, 0, 'C'), pg_temp.put('keep', 'orders', 1, 1, 'C'),
       pg_temp.put('keep', 'orders', 1, 2, 'A');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('keep', 2) AS keep_window;
SELECT eventbox.process('keep') IS NOT NULL AS drained;
RESET ROLE;
SELECT message_id, event_type, status, attempts FROM msgs WHERE sub = 'keep' ORDER BY message_id;
-- Back to 'ignore': the kept ones are ignored now.
SET ROLE regress_eventbox_owner;
SELECT eventbox.alter_subscription('keep', unhandled => 'ignore');
SELECT eventbox.process('keep');
RESET ROLE;
SELECT message_id, event_type, status, attempts, done FROM msgs WHERE sub = 'keep'
 ORDER BY message_id;

\i :handlers_cleanup
