-- Handlers, operations (docs/reference/functions.md, docs/reference/bad-input.md): retry,
-- redrive, skip and replay, their refusals, and that none is open to a role that does not own
-- the subscription.
-- The handlers_* suites (handlers_register, _process, _failures, _ordering, _run_as,
-- _operations) each start from sql/include/handlers_setup.sql and end with
-- sql/include/handlers_cleanup.sql. Needs no broker: inbox rows are inserted directly.

-- pg_regress sets PG_ABS_SRCDIR to its --inputdir: the top of the repository.
\getenv abs_srcdir PG_ABS_SRCDIR
\set handlers_setup :abs_srcdir '/sql/include/handlers_setup.sql'
\set handlers_cleanup :abs_srcdir '/sql/include/handlers_cleanup.sql'
\i :handlers_setup

-- ---- operations: retry, redrive, skip, replay ----------------------------------------------

TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('ops', ARRAY['orders', 'refunds'], max_attempts => 1,
                                   backoff => '1 hour', backoff_max => '10 hours');
SELECT eventbox.register_handler('ops', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
-- Four messages that die (X, X, Y and an untyped one), one processed, one received.
INSERT INTO regress_eventbox_fn.failing
SELECT 'orders/' || p || '/0', 'record' FROM generate_series(0, 3) AS p;
SELECT pg_temp.put('ops', 'orders', 0, 0, 'X'), pg_temp.put('ops', 'orders', 1, 0, 'X'),
       pg_temp.put('ops', 'orders', 2, 0, 'Y'), pg_temp.put('ops', 'orders', 3, 0),
       pg_temp.put('ops', 'orders', 4, 0, 'X');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ops');
RESET ROLE;
SELECT pg_temp.put('ops', 'orders', 5, 0, 'X');
TRUNCATE regress_eventbox_fn.failing;
SELECT message_id, event_type, status, attempts FROM msgs WHERE sub = 'ops' ORDER BY message_id;

-- retry: a dead message again, attempts from zero, due now.
SET ROLE regress_eventbox_owner;
SELECT eventbox.retry('ops', 'orders/0/0');
RESET ROLE;
SELECT message_id, status, attempts, next, last_error FROM msgs
 WHERE sub = 'ops' AND message_id = 'orders/0/0';
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ops');
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE sub = 'ops' AND message_id = 'orders/0/0';
-- A processed message is not run again; unknown messages and subscriptions.
SET ROLE regress_eventbox_owner;
SELECT eventbox.retry('ops', 'orders/0/0');
:show_sqlstate
SELECT eventbox.retry('ops', 'orders/9/9');
:show_sqlstate
SELECT eventbox.retry('ops', NULL);
:show_sqlstate
SELECT eventbox.retry('nope', 'orders/0/0');
:show_sqlstate
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE sub = 'ops' AND message_id = 'orders/0/0';

-- redrive: dead -> retry, by event type or all; returns how many.
SET ROLE regress_eventbox_owner;
SELECT eventbox.redrive('ops', 'Y');
RESET ROLE;
SELECT message_id, status, attempts, next FROM msgs WHERE sub = 'ops' AND status <> 'processed'
 ORDER BY message_id;
SET ROLE regress_eventbox_owner;
SELECT eventbox.redrive('ops', 'Z');
SELECT eventbox.redrive('ops');
RESET ROLE;
SELECT message_id, status, attempts, next FROM msgs WHERE sub = 'ops' AND status <> 'processed'
 ORDER BY message_id;
SET ROLE regress_eventbox_owner;
SELECT eventbox.redrive('ops');
SELECT eventbox.redrive('nope');
:show_sqlstate
SELECT eventbox.process('ops');
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE sub = 'ops' ORDER BY message_id;

-- skip: received, retry, dead or unparsable -> ignored, noting who skipped it.
SELECT pg_temp.put('ops', 'orders', 6, 0, 'X');
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", status,
                            attempts, next_attempt_at, last_error)
VALUES ('ops', 'orders/7/0', 'orders', 7, 0, 'dead', 1, NULL, 'P0001: boom'),
       ('ops', 'orders/8/0', 'orders', 8, 0, 'unparsable', 0, NULL, NULL),
       ('ops', 'orders/9/0', 'orders', 9, 0, 'retry', 1, now() + interval '1 hour', 'P0001: boom');
SET ROLE regress_eventbox_owner;
SELECT eventbox.skip('ops', 'orders/6/0');
SELECT eventbox.skip('ops', 'orders/7/0');
SELECT eventbox.skip('ops', 'orders/8/0');
SELECT eventbox.skip('ops', 'orders/9/0');
RESET ROLE;
SELECT message_id, status, attempts, done, last_error FROM msgs
 WHERE sub = 'ops' AND message_id IN ('orders/6/0', 'orders/7/0', 'orders/8/0', 'orders/9/0')
 ORDER BY message_id;
-- Processed and ignored messages cannot be skipped; unknown ones.
SET ROLE regress_eventbox_owner;
SELECT eventbox.skip('ops', 'orders/0/0');
:show_sqlstate
SELECT eventbox.skip('ops', 'orders/6/0');
:show_sqlstate
SELECT eventbox.skip('ops', 'orders/9/9');
:show_sqlstate
SELECT eventbox.skip('nope', 'orders/6/0');
:show_sqlstate
-- An ignored message can be retried.
SELECT eventbox.retry('ops', 'orders/6/0');
SELECT eventbox.process('ops');
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE sub = 'ops' AND message_id = 'orders/6/0';

-- replay: sets the partition's next offset, backwards or forwards.
SET ROLE regress_eventbox_owner;
SELECT eventbox.replay('ops', 'orders', 0, 5);
SELECT eventbox.replay('ops', 'refunds', 3, 0);
SELECT eventbox.replay('ops', 'orders', 0, 2);
RESET ROLE;
SELECT subscription, topic, "partition", next_offset FROM eventbox.offsets
 WHERE subscription = 'ops' ORDER BY 2, 3;
SET ROLE regress_eventbox_owner;
SELECT eventbox.replay('ops', 'payments', 0, 0);
:show_sqlstate
SELECT eventbox.replay('ops', NULL, 0, 0);
:show_sqlstate
SELECT eventbox.replay('ops', 'orders', -1, 0);
:show_sqlstate
SELECT eventbox.replay('ops', 'orders', 0, -1);
:show_sqlstate
SELECT eventbox.replay('ops', 'orders', NULL, 0);
:show_sqlstate
SELECT eventbox.replay('nope', 'orders', 0, 0);
:show_sqlstate
RESET ROLE;
-- None of the operations is open to a role that does not own the subscription.
SET ROLE regress_eventbox_stranger;
SELECT eventbox.retry('ops', 'orders/1/0');
:show_sqlstate
SELECT eventbox.redrive('ops');
:show_sqlstate
SELECT eventbox.skip('ops', 'orders/1/0');
:show_sqlstate
SELECT eventbox.replay('ops', 'orders', 0, 0);
:show_sqlstate
RESET ROLE;
SELECT subscription, topic, "partition", next_offset FROM eventbox.offsets
 WHERE subscription = 'ops' ORDER BY 2, 3;
SELECT message_id, status, attempts FROM msgs WHERE sub = 'ops' ORDER BY message_id;

\i :handlers_cleanup
