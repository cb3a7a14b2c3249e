-- Handlers, failures (docs/design/guarantees.md, docs/design/handlers.md): a failed message
-- waits for its retry with a backoff that doubles and runs from the failure, goes dead after
-- exactly max_attempts, a backoff too large to store never fails the call, and a message whose
-- last attempt never finished (a claim left behind) gets that attempt counted.
-- The handlers_* suites (handlers_register, _process, _failures, _ordering, _run_as,
-- _operations) each start from sql/include/handlers_setup.sql and end with
-- sql/include/handlers_cleanup.sql. Needs no broker: inbox rows are inserted directly.

-- pg_regress sets PG_ABS_SRCDIR to its --inputdir: the top of the repository.
\getenv abs_srcdir PG_ABS_SRCDIR
\set handlers_setup :abs_srcdir '/sql/include/handlers_setup.sql'
\set handlers_cleanup :abs_srcdir '/sql/include/handlers_cleanup.sql'
\i :handlers_setup

-- ---- process: retry with backoff, dead after exactly max_attempts --------------------------

TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('retries', ARRAY['orders'], max_attempts => 3,
                                   backoff => '1 hour', backoff_max => '10 hours');
SELECT eventbox.register_handler('retries', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/0', 'record');
SELECT pg_temp.put('retries', 'orders', 0, 0);
-- Attempt 1 fails: retry after backoff * [1/2, 1] = 30 to 60 minutes, the error kept.
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('retries');
RESET ROLE;
SELECT status, attempts, next, done, last_error FROM msgs WHERE sub = 'retries';
SELECT next_attempt_at - now() BETWEEN interval '29 minutes' AND interval '60 minutes'
       AS first_backoff FROM eventbox.inbox WHERE subscription = 'retries';
-- Not due yet: nothing runs.
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('retries');
RESET ROLE;
SELECT status, attempts, next FROM msgs WHERE sub = 'retries';
-- Attempt 2 fails: the backoff doubled, 1 to 2 hours.
SELECT pg_temp.due('retries');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('retries');
RESET ROLE;
SELECT status, attempts, next, done, last_error FROM msgs WHERE sub = 'retries';
SELECT next_attempt_at - now() BETWEEN interval '59 minutes' AND interval '120 minutes'
       AS second_backoff FROM eventbox.inbox WHERE subscription = 'retries';
-- Attempt 3 = max_attempts fails: dead, with the last error and no retry time.
SELECT pg_temp.due('retries');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('retries');
RESET ROLE;
SELECT status, attempts, next, done, last_error FROM msgs WHERE sub = 'retries';
-- Dead messages are not run again.
SELECT pg_temp.due('retries');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('retries');
RESET ROLE;
SELECT status, attempts FROM msgs WHERE sub = 'retries';
-- The failed attempts left no effect.
SELECT count(*) AS effects FROM regress_eventbox_fn.effects;
-- max_attempts 1: the first failure is final.
SET ROLE regress_eventbox_owner;
SELECT eventbox.alter_subscription('retries', max_attempts => 1);
RESET ROLE;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/1', 'record');
SELECT pg_temp.put('retries', 'orders', 0, 1);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('retries');
RESET ROLE;
SELECT message_id, status, attempts, next, last_error FROM msgs WHERE sub = 'retries'
 ORDER BY message_id;
TRUNCATE regress_eventbox_fn.failing;

-- The backoff runs from the failure, not from the start of the caller's transaction: a call
-- made late in a transaction does not run a failed message again at once. (Fails before the
-- fix: next_attempt_at is now() + delay, now() being the transaction's start, so after the
-- 1.5 s sleep the retry is due at once and the same call runs it two or three times.)
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('slow', ARRAY['orders'], max_attempts => 10,
                                   backoff => '1 second', backoff_max => '1 hour');
SELECT eventbox.register_handler('slow', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/0', 'record');
SELECT pg_temp.put('slow', 'orders', 0, 0);
BEGIN;
SELECT pg_sleep(1.5);
SET LOCAL ROLE regress_eventbox_owner;
SELECT eventbox.process('slow') = 1 AS one_message_handled;
RESET ROLE;
SELECT attempts = 1 AS one_attempt, status FROM msgs WHERE sub = 'slow';
ROLLBACK;
TRUNCATE regress_eventbox_fn.failing;

-- A backoff whose retry time cannot be stored is refused when the subscription is created, or
-- clamped when a message fails: never an error that aborts the whole call. (Fails before the
-- fix: create_subscription accepts it, and process() ends in ERROR 22008 "interval out of
-- range" at the first failure, which rolls back the other messages of the call too.)
SET ROLE regress_eventbox_owner;
SELECT pg_temp.sqlstate_of($$SELECT eventbox.create_subscription('huge', ARRAY['orders'],
    backoff => '1000000 years', backoff_max => '1000000 years')$$) IN ('ok', '22023')
       AS created_or_refused;
SELECT pg_temp.sqlstate_of($$SELECT eventbox.register_handler('huge',
    'regress_eventbox_fn.record(eventbox.inbox)', run_as => 'regress_eventbox_runner')$$)
       IN ('ok', '42704') AS registered_if_created;
RESET ROLE;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/0', 'record');
SELECT pg_temp.put('huge', 'orders', 0, 0), pg_temp.put('huge', 'orders', 1, 0);
SET ROLE regress_eventbox_owner;
SELECT pg_temp.sqlstate_of($$SELECT eventbox.process('huge')$$) IN ('ok', '42704')
       AS process_did_not_fail;
RESET ROLE;
SELECT count(*) >= 0 AS dropped
  FROM (SELECT eventbox.drop_subscription(name) FROM eventbox.subscriptions
         WHERE name = 'huge') AS d;
DELETE FROM eventbox.inbox WHERE subscription = 'huge';
TRUNCATE regress_eventbox_fn.failing;

-- ---- process: a message whose last attempt never finished ----------------------------------

-- A worker's pass claims a lane's messages (eventbox.handler_claims, committed before they run)
-- and empties the claim with their last outcome. A claim left behind means the backend running
-- them died: a message still waiting with the attempts it had when claimed gets that attempt
-- counted; with attempts left it runs again, alone; without, it goes dead unrun. A message whose
-- outcome committed since (attempts moved on) is not counted again.
TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('crashed', ARRAY['orders'], max_attempts => 2,
                                   backoff => '1 hour', backoff_max => '10 hours');
SELECT eventbox.register_handler('crashed', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", status,
                            attempts)
VALUES ('crashed', 'orders/0/0', 'orders', 0, 0, 'received', 1),
       ('crashed', 'orders/1/0', 'orders', 1, 0, 'received', 0),
       ('crashed', 'orders/3/0', 'orders', 3, 0, 'retry', 1);
SELECT pg_temp.put('crashed', 'orders', 2, 0);
SELECT pg_temp.due('crashed');
INSERT INTO eventbox.handler_claims (subscription, topic, "partition", message_ids, attempts)
VALUES ('crashed', 'orders', 0, ARRAY['orders/0/0'], ARRAY[1]),
       ('crashed', 'orders', 1, ARRAY['orders/1/0'], ARRAY[0]),
       ('crashed', 'orders', 3, ARRAY['orders/3/0'], ARRAY[0]);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('crashed');
RESET ROLE;
SELECT message_id, status, attempts, next, last_error FROM msgs WHERE sub = 'crashed'
 ORDER BY message_id;
SELECT * FROM fx ORDER BY message_id;
-- The settled claims are empty (process() runs in the caller's transaction and claims nothing).
SELECT "partition", message_ids, attempts FROM eventbox.handler_claims
 WHERE subscription = 'crashed' ORDER BY 1;

\i :handlers_cleanup
