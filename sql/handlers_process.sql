-- Handlers, eventbox.process() (docs/reference/functions.md, docs/design/guarantees.md):
-- effects and status commit together in the caller's transaction, processed and ignored
-- messages, max_messages, bad calls, a disabled subscription, every-type and typed handlers
-- with one subtransaction per message, a handler that changes its own message, calls by a
-- role that does not own the subscription, the caller's settings left alone, a nested call
-- refused, and a handler redefined within a session.
-- The handlers_* suites (handlers_register, _process, _failures, _ordering, _run_as,
-- _operations) each start from sql/include/handlers_setup.sql and end with
-- sql/include/handlers_cleanup.sql. Needs no broker: inbox rows are inserted directly.

-- pg_regress sets PG_ABS_SRCDIR to its --inputdir: the top of the repository.
\getenv abs_srcdir PG_ABS_SRCDIR
\set handlers_setup :abs_srcdir '/sql/include/handlers_setup.sql'
\set handlers_cleanup :abs_srcdir '/sql/include/handlers_cleanup.sql'
\i :handlers_setup

-- ---- process: processed, ignored, effects commit with the status ----------------------------

SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('basic', ARRAY['orders'], backoff => '1 hour',
                                   backoff_max => '10 hours');
SELECT eventbox.register_handler('basic', 'regress_eventbox_fn.record(eventbox.inbox)', 'A',
                                 'regress_eventbox_runner');
RESET ROLE;
-- One message with a handler, one of another type and one without a type: those two are
-- ignored ('ignore' is the default for unhandled messages).
SELECT pg_temp.put('basic', 'orders', 0, 0, 'A'),
       pg_temp.put('basic', 'orders', 0, 1, 'B'),
       pg_temp.put('basic', 'orders', 0, 2);
SELECT * FROM msgs WHERE sub = 'basic' ORDER BY message_id;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('basic');
RESET ROLE;
SELECT * FROM msgs WHERE sub = 'basic' ORDER BY message_id;
-- The handler ran once, as runner, on the row with its attempt counted, with the pinned
-- search_path.
SELECT message_id, handler, run_as, attempts, search_path FROM regress_eventbox_fn.effects;
-- Nothing is due now.
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('basic');
RESET ROLE;

-- process() works in the caller's transaction: rolled back, it leaves no effect, no status
-- and no counted attempt; committed, effect and status come together.
SELECT pg_temp.put('basic', 'orders', 0, 3, 'A');
BEGIN;
SET LOCAL ROLE regress_eventbox_owner;
SELECT eventbox.process('basic');
RESET ROLE;
SELECT status, attempts FROM msgs WHERE message_id = 'orders/0/3';
SELECT * FROM fx WHERE message_id = 'orders/0/3';
ROLLBACK;
SELECT status, attempts, next, done FROM msgs WHERE message_id = 'orders/0/3';
SELECT * FROM fx WHERE message_id = 'orders/0/3';
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('basic');
RESET ROLE;
SELECT status, attempts, next, done FROM msgs WHERE message_id = 'orders/0/3';
SELECT * FROM fx WHERE message_id = 'orders/0/3';

-- max_messages bounds a call.
SELECT pg_temp.put('basic', 'orders', 1, 0, 'A'), pg_temp.put('basic', 'orders', 1, 1, 'A'),
       pg_temp.put('basic', 'orders', 1, 2, 'A');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('basic', 2);
SELECT eventbox.process('basic', 2);
SELECT eventbox.process('basic', 2);
RESET ROLE;
SELECT message_id, status FROM msgs WHERE sub = 'basic' AND message_id LIKE 'orders/1/%'
 ORDER BY message_id;
-- A call reads only as many messages of a lane as it still takes: 3 of lane 2, then 2 of the
-- 8 of lane 3, not 5 (what it returned from the todo index: the rows read, and a row for each
-- lane found with work).
SELECT count(*) FROM (SELECT pg_temp.put('basic', 'orders', 2, g, 'A')
                        FROM generate_series(0, 2) g) lane_2;
SELECT count(*) FROM (SELECT pg_temp.put('basic', 'orders', 3, g, 'A')
                        FROM generate_series(0, 7) g) lane_3;
BEGIN;
SELECT pg_stat_get_xact_tuples_returned('eventbox.inbox_todo_idx'::regclass) AS before \gset
SET LOCAL ROLE regress_eventbox_owner;
SELECT eventbox.process('basic', 5);
RESET ROLE;
SELECT pg_stat_get_xact_tuples_returned('eventbox.inbox_todo_idx'::regclass) - :before
       AS todo_entries_returned;
COMMIT;
SELECT count(*) FILTER (WHERE status = 'processed') AS processed, count(*) AS messages
  FROM msgs WHERE sub = 'basic' AND message_id ~ '^orders/[23]/';
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('basic');
RESET ROLE;

-- Bad calls.
SET ROLE regress_eventbox_owner;
SELECT eventbox.process(NULL);
:show_sqlstate
SELECT eventbox.process('basic', 0);
:show_sqlstate
SELECT eventbox.process('basic', -1);
:show_sqlstate
SELECT eventbox.process('nope');
:show_sqlstate
-- A disabled subscription is not processed; enabled again, it is.
RESET ROLE;
SELECT pg_temp.put('basic', 'orders', 0, 4, 'A');
SET ROLE regress_eventbox_owner;
SELECT eventbox.alter_subscription('basic', enabled => false);
SELECT eventbox.process('basic');
SELECT eventbox.alter_subscription('basic', enabled => true);
SELECT eventbox.process('basic');
RESET ROLE;
SELECT message_id, status FROM msgs WHERE message_id = 'orders/0/4';

-- ---- process: every-type and typed handlers, one subtransaction per message ----------------

TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('both', ARRAY['orders'], backoff => '1 hour',
                                   backoff_max => '10 hours');
-- Registered in this order, they run in this order; each as its own run_as.
SELECT eventbox.register_handler('both', 'regress_eventbox_fn.record(eventbox.inbox)', 'A',
                                 'regress_eventbox_runner');
SELECT eventbox.register_handler('both', 'regress_eventbox_fn.also(eventbox.inbox)');
RESET ROLE;
GRANT SELECT, INSERT ON regress_eventbox_fn.effects TO regress_eventbox_owner;
GRANT SELECT ON regress_eventbox_fn.failing TO regress_eventbox_owner;
-- A: both handlers; B and no type: the every-type one only.
SELECT pg_temp.put('both', 'orders', 0, 0, 'A'), pg_temp.put('both', 'orders', 0, 1, 'B'),
       pg_temp.put('both', 'orders', 0, 2);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('both');
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE sub = 'both' ORDER BY message_id;
-- In run order: one partition.
SELECT message_id, handler, run_as, attempts FROM regress_eventbox_fn.effects ORDER BY n;
-- When the second handler of a message fails, the first one's effects are rolled back with it;
-- a message of another partition in the same call keeps its effects.
TRUNCATE regress_eventbox_fn.effects;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/1/0', 'also');
SELECT pg_temp.put('both', 'orders', 1, 0, 'A'), pg_temp.put('both', 'orders', 2, 0, 'A');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('both');
RESET ROLE;
SELECT message_id, status, attempts, next, done, last_error FROM msgs
 WHERE sub = 'both' AND message_id IN ('orders/1/0', 'orders/2/0') ORDER BY message_id;
SELECT message_id, handler, run_as, attempts FROM regress_eventbox_fn.effects
 ORDER BY message_id, n;
-- The messages of a transaction run in one subtransaction until one fails: that one's error is
-- kept (it is not run twice), the ones before it run again, each in a subtransaction of its
-- own, and the ones after it run each in its own. Effects: exactly once for every message that
-- succeeded, none for the failed one. Calls of record(): 3/0 twice, 4/0 and 5/0 once.
TRUNCATE regress_eventbox_fn.effects, regress_eventbox_fn.failing;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/4/0', 'also');
SELECT pg_temp.put('both', 'orders', 3, 0, 'A'), pg_temp.put('both', 'orders', 4, 0, 'A'),
       pg_temp.put('both', 'orders', 5, 0, 'A');
SELECT setval('regress_eventbox_fn.record_calls', 1, false);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('both');
RESET ROLE;
SELECT nextval('regress_eventbox_fn.record_calls') - 1 AS record_calls;
SELECT message_id, status, attempts, last_error FROM msgs
 WHERE sub = 'both' AND message_id IN ('orders/3/0', 'orders/4/0', 'orders/5/0')
 ORDER BY message_id;
SELECT message_id, handler, count(*) FROM regress_eventbox_fn.effects
 GROUP BY message_id, handler ORDER BY message_id, handler;
TRUNCATE regress_eventbox_fn.failing;

-- ---- process: a handler that changes its own message through the API -----------------------

-- The processed mark finds the row where the pass read it; a handler that moved it (here with
-- eventbox.retry() on its own message) leaves it elsewhere, and the mark finds it by id: the
-- message ends processed with one attempt, and its effects are there once.
TRUNCATE regress_eventbox_fn.effects;
CREATE FUNCTION regress_eventbox_fn.self_retry(msg eventbox.inbox) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO regress_eventbox_fn.effects
        (message_id, topic, "partition", "offset", handler, run_as, attempts, search_path)
    VALUES (msg.message_id, msg.topic, msg."partition", msg."offset", 'self_retry', current_user,
            msg.attempts, current_setting('search_path'));
    PERFORM eventbox.retry(msg.subscription, msg.message_id);
END $$;
GRANT EXECUTE ON FUNCTION regress_eventbox_fn.self_retry(eventbox.inbox) TO regress_eventbox_owner;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('selfop', ARRAY['orders']);
SELECT eventbox.register_handler('selfop', 'regress_eventbox_fn.self_retry(eventbox.inbox)',
                                 run_as => 'regress_eventbox_owner');
RESET ROLE;
SELECT pg_temp.put('selfop', 'orders', 0, 0);
SELECT pg_temp.put('selfop', 'orders', 0, 1);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('selfop');
SELECT eventbox.process('selfop');
RESET ROLE;
SELECT message_id, status, attempts, next, last_error FROM msgs WHERE sub = 'selfop'
 ORDER BY message_id;
SELECT message_id, handler, run_as, attempts FROM regress_eventbox_fn.effects
 ORDER BY message_id;

-- ---- process: by a role that does not own the subscription ---------------------------------

SELECT pg_temp.put('basic', 'orders', 0, 5, 'A');
SET ROLE regress_eventbox_stranger;
SELECT eventbox.process('basic');
:show_sqlstate
SELECT eventbox.process('basic', 1);
:show_sqlstate
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE message_id = 'orders/0/5' AND sub = 'basic';
-- The owner may.
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('basic');
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE message_id = 'orders/0/5' AND sub = 'basic';

-- ---- process() leaves the caller's settings alone ------------------------------------------

-- A search_path the session got from the database's settings is the same after a call, and
-- so is what RESET goes back to. (Fails before the fix: process() pins the handler's
-- search_path as a new session default, so the session keeps "$user", public.)
SELECT current_database() AS dbname \gset
ALTER DATABASE :"dbname" SET search_path = regress_eventbox_fn, public;
\c -
SHOW search_path;
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", event_type)
VALUES ('basic', 'orders/0/6', 'orders', 0, 6, 'A');
SELECT eventbox.process('basic');
SHOW search_path;
RESET search_path;
SHOW search_path;
ALTER DATABASE :"dbname" RESET search_path;
\c -

\i :handlers_cleanup

-- ---- a handler calling eventbox.process() --------------------------------------------------

-- Last, in a transaction that is rolled back: before the fix this crashes the backend
-- (segfault: the nested pass resets the memory and the lane state the outer pass is still
-- using), which ends this file here and restarts the server. A nested call must be refused
-- with an error; the handler then fails like any other and the message waits for its retry.
BEGIN;
CREATE ROLE regress_eventbox_nested;
GRANT USAGE ON SCHEMA eventbox TO regress_eventbox_nested;
GRANT EXECUTE ON FUNCTION
    eventbox.create_subscription,
    eventbox.register_handler(text, regprocedure, text, name, boolean),
    eventbox.process(text, integer)
  TO regress_eventbox_nested;
CREATE FUNCTION pg_temp.nested(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM eventbox.process('nested');
END $$;
GRANT EXECUTE ON FUNCTION pg_temp.nested(eventbox.inbox) TO regress_eventbox_nested;
SET LOCAL ROLE regress_eventbox_nested;
SELECT eventbox.create_subscription('nested', ARRAY['orders'], backoff => '1 hour',
                                   backoff_max => '10 hours');
SELECT eventbox.register_handler('nested', 'pg_temp.nested(eventbox.inbox)');
RESET ROLE;
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset")
VALUES ('nested', 'orders/0/0', 'orders', 0, 0), ('nested', 'orders/0/1', 'orders', 0, 1),
       ('nested', 'orders/1/0', 'orders', 1, 0);
SET LOCAL ROLE regress_eventbox_nested;
SELECT eventbox.process('nested');
RESET ROLE;
SELECT message_id, status, attempts, last_error ~ '^[0-9A-Z]{5}: ' AS failed_with_sqlstate
  FROM eventbox.inbox WHERE subscription = 'nested' ORDER BY message_id;
ROLLBACK;

-- Handlers are called directly (fmgr), their call set up once per function: a changed function
-- (another language, a SET clause, SECURITY DEFINER) is called as it is now, within a session.
BEGIN;
CREATE ROLE regress_eventbox_redef;
CREATE TABLE pg_temp.redef_seen (message_id text, how text, who name, datestyle text);
GRANT INSERT ON pg_temp.redef_seen TO regress_eventbox_redef;
CREATE FUNCTION pg_temp.redef(msg eventbox.inbox) RETURNS void LANGUAGE sql AS $$
    INSERT INTO pg_temp.redef_seen VALUES (msg.message_id, 'sql', current_user,
                                          current_setting('datestyle'))
$$;
GRANT EXECUTE ON FUNCTION pg_temp.redef(eventbox.inbox) TO regress_eventbox_redef;
SELECT eventbox.create_subscription('redef', ARRAY['orders']);
SELECT eventbox.register_handler('redef', 'pg_temp.redef(eventbox.inbox)',
                                 run_as => 'regress_eventbox_redef');
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset")
VALUES ('redef', 'r1', 'orders', 0, 0), ('redef', 'r2', 'orders', 0, 1),
       ('redef', 'r3', 'orders', 0, 2);
SELECT eventbox.process('redef', 1);
CREATE OR REPLACE FUNCTION pg_temp.redef(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pg_temp.redef_seen VALUES (msg.message_id, 'plpgsql', current_user,
                                          current_setting('datestyle'));
END $$;
SELECT eventbox.process('redef', 1);
ALTER FUNCTION pg_temp.redef(eventbox.inbox) SET datestyle = 'German, DMY';
SELECT eventbox.process('redef', 1);
SELECT message_id, how, who, datestyle FROM pg_temp.redef_seen ORDER BY message_id;
ROLLBACK;
