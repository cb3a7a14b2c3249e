-- Batch handlers (docs/guide/handlers.md "Batch handlers", docs/design/handlers.md,
-- docs/reference/bad-input.md): registration with batch => true and its refusals, one call per
-- chunk of a lane's messages in offset order, a failing chunk split until the failing message
-- is alone (it alone retried or dead, the others processed, whatever the ordering holds back),
-- send()'s lineage inside a batch handler, mixed batch and plain handlers, dry runs.
-- The handlers_* suites each start from sql/include/handlers_setup.sql and end with
-- sql/include/handlers_cleanup.sql. Needs no broker: inbox rows are inserted directly.

-- pg_regress sets PG_ABS_SRCDIR to its --inputdir: the top of the repository.
\getenv abs_srcdir PG_ABS_SRCDIR
\set handlers_setup :abs_srcdir '/sql/include/handlers_setup.sql'
\set handlers_cleanup :abs_srcdir '/sql/include/handlers_cleanup.sql'
\i :handlers_setup

-- A batch handler: one effects row per message of the chunk, and one row per call in calls;
-- fails (the whole call) when a message of the chunk is listed in failing for 'batch'.
CREATE TABLE regress_eventbox_fn.calls (n int GENERATED ALWAYS AS IDENTITY, size int,
                                        first_id text);
GRANT SELECT, INSERT ON regress_eventbox_fn.calls TO regress_eventbox_runner;
-- (unnest() rather than a variable of type eventbox.inbox: declaring one needs USAGE on the
-- schema eventbox, which the run_as role need not have.)
CREATE FUNCTION regress_eventbox_fn.batch(msgs eventbox.inbox[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    bad text;
BEGIN
    INSERT INTO regress_eventbox_fn.calls (size, first_id)
    VALUES (cardinality(msgs), (msgs[1]).message_id);
    INSERT INTO regress_eventbox_fn.effects
        (message_id, topic, "partition", "offset", handler, run_as, attempts, search_path)
    SELECT m.message_id, m.topic, m."partition", m."offset", 'batch', current_user, m.attempts,
           current_setting('search_path')
      FROM unnest(msgs) WITH ORDINALITY AS m ORDER BY m.ordinality;
    SELECT min(m.message_id) INTO bad
      FROM unnest(msgs) AS m JOIN regress_eventbox_fn.failing f
           ON f.message_id = m.message_id AND f.handler = 'batch';
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'batch failed on %', bad;
    END IF;
END $$;
-- Sends one message per element, without lineage headers of its own.
CREATE FUNCTION regress_eventbox_fn.batch_send(msgs eventbox.inbox[]) RETURNS void
LANGUAGE sql AS $$
    SELECT eventbox.send('batch.out', jsonb_build_object('from', m.message_id))
      FROM unnest(msgs) WITH ORDINALITY AS m ORDER BY m.ordinality
$$;
REVOKE ALL ON FUNCTION regress_eventbox_fn.batch(eventbox.inbox[]),
                       regress_eventbox_fn.batch_send(eventbox.inbox[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION regress_eventbox_fn.batch(eventbox.inbox[]),
                          regress_eventbox_fn.batch_send(eventbox.inbox[])
  TO regress_eventbox_runner;
GRANT USAGE ON SCHEMA eventbox TO regress_eventbox_runner;
GRANT EXECUTE ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid)
  TO regress_eventbox_runner;
CREATE TEMP VIEW hb AS
SELECT subscription, event_type, handler, batch FROM eventbox.handlers;

-- ---- registration and its refusals -----------------------------------------------------------

SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('bat', ARRAY['orders'], backoff => '1 hour',
                                   backoff_max => '10 hours', max_attempts => 2,
                                   ordering => 'none');
-- A function of eventbox.inbox[] with batch => true.
SELECT eventbox.register_handler('bat', 'regress_eventbox_fn.batch(eventbox.inbox[])',
                                 run_as => 'regress_eventbox_runner', batch => true);
-- batch => true with a plain handler's signature, and with another one.
SELECT eventbox.register_handler('bat', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 event_type => 'X', batch => true);
:after_error
SELECT eventbox.register_handler('bat', 'regress_eventbox_fn.text_arg(text)', batch => true);
:after_error
-- An eventbox.inbox[] function without batch => true (the default is false).
SELECT eventbox.register_handler('bat', 'regress_eventbox_fn.batch(eventbox.inbox[])',
                                 event_type => 'X');
:after_error
-- batch => NULL.
SELECT eventbox.register_handler('bat', 'regress_eventbox_fn.batch(eventbox.inbox[])',
                                 event_type => 'X', batch => NULL);
:after_error
-- The same function again.
SELECT eventbox.register_handler('bat', 'regress_eventbox_fn.batch(eventbox.inbox[])',
                                 run_as => 'regress_eventbox_runner', batch => true);
:after_error
RESET ROLE;
SELECT * FROM hb ORDER BY handler;

-- ---- one call per chunk, in offset order -----------------------------------------------------

SELECT pg_temp.put('bat', 'orders', 0, o) FROM generate_series(0, 9) o;
SELECT pg_temp.put('bat', 'orders', 1, o) FROM generate_series(0, 2) o;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('bat');
RESET ROLE;
-- One call per lane, each with its messages in offset order.
SELECT size, first_id FROM regress_eventbox_fn.calls ORDER BY n;
SELECT message_id, run_as, attempts, search_path FROM regress_eventbox_fn.effects ORDER BY n;
SELECT status, count(*), bool_and(done) AS done FROM msgs WHERE sub = 'bat' GROUP BY status;

-- ---- a failing chunk is split until the failing message is alone -----------------------------

TRUNCATE regress_eventbox_fn.calls, regress_eventbox_fn.effects;
SELECT pg_temp.put('bat', 'orders', 0, o) FROM generate_series(10, 17) o;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/15', 'batch');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('bat');
RESET ROLE;
-- 8 fail, then 4 succeed, 4 fail, 2 fail, 1 succeeds, the failing one alone fails, and (with
-- ordering 'none') the 2 after it succeed: the calls that succeeded (the failed calls' rows
-- were rolled back with them).
SELECT size, first_id FROM regress_eventbox_fn.calls ORDER BY n;
-- Only the effects of the calls that succeeded stay, each message's once.
SELECT message_id, count(*) FROM regress_eventbox_fn.effects GROUP BY 1 ORDER BY 1;
SELECT message_id, status, attempts, next, last_error FROM msgs
 WHERE sub = 'bat' AND status <> 'processed' ORDER BY message_id;
-- Its retry runs it alone; the second attempt is the last (max_attempts 2): dead.
SELECT pg_temp.due('bat');
TRUNCATE regress_eventbox_fn.calls;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('bat');
RESET ROLE;
SELECT size, first_id FROM regress_eventbox_fn.calls ORDER BY n;
SELECT message_id, status, attempts, last_error FROM msgs
 WHERE sub = 'bat' AND status <> 'processed' ORDER BY message_id;
DELETE FROM regress_eventbox_fn.failing;

-- ---- ordering 'partition': the messages after the failing one wait ---------------------------

SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('batp', ARRAY['orders'], backoff => '1 hour',
                                   backoff_max => '10 hours');
SELECT eventbox.register_handler('batp', 'regress_eventbox_fn.batch(eventbox.inbox[])',
                                 run_as => 'regress_eventbox_runner', batch => true);
RESET ROLE;
TRUNCATE regress_eventbox_fn.calls, regress_eventbox_fn.effects;
SELECT pg_temp.put('batp', 'orders', 0, o) FROM generate_series(0, 5) o;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/2', 'batch');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('batp');
RESET ROLE;
SELECT size, first_id FROM regress_eventbox_fn.calls ORDER BY n;
SELECT message_id, status, attempts, next FROM msgs WHERE sub = 'batp' ORDER BY message_id;
SELECT message_id, count(*) FROM regress_eventbox_fn.effects GROUP BY 1 ORDER BY 1;
-- Once it succeeds, the rest follows in one chunk.
DELETE FROM regress_eventbox_fn.failing;
SELECT pg_temp.due('batp');
TRUNCATE regress_eventbox_fn.calls;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('batp');
RESET ROLE;
SELECT size, first_id FROM regress_eventbox_fn.calls ORDER BY n;
SELECT status, count(*) FROM msgs WHERE sub = 'batp' GROUP BY status;

-- ---- send() in a batch handler: the chunk's first message is the cause -----------------------

SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('bats', ARRAY['orders']);
SELECT eventbox.register_handler('bats', 'regress_eventbox_fn.batch_send(eventbox.inbox[])',
                                 run_as => 'regress_eventbox_runner', batch => true);
RESET ROLE;
SELECT pg_temp.put('bats', 'orders', 0, o) FROM generate_series(0, 2) o;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('bats');
RESET ROLE;
SELECT convert_from(payload, 'UTF8') AS payload, headers->>'causation_id' AS causation_id,
       headers->>'correlation_id' AS correlation_id
  FROM eventbox.outbox WHERE topic = 'batch.out' ORDER BY id;
DELETE FROM eventbox.outbox WHERE topic = 'batch.out';

-- ---- a batch handler beside a plain one: each message alone, the batch one as an array -------

SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('batm', ARRAY['orders']);
SELECT eventbox.register_handler('batm', 'regress_eventbox_fn.batch(eventbox.inbox[])',
                                 run_as => 'regress_eventbox_runner', batch => true);
SELECT eventbox.register_handler('batm', 'regress_eventbox_fn.record(eventbox.inbox)', 'A',
                                 'regress_eventbox_runner');
RESET ROLE;
TRUNCATE regress_eventbox_fn.calls, regress_eventbox_fn.effects;
-- Type A runs record and batch (one message a call), untyped ones batch in chunks.
SELECT pg_temp.put('batm', 'orders', 0, 0), pg_temp.put('batm', 'orders', 0, 1),
       pg_temp.put('batm', 'orders', 0, 2, 'A'), pg_temp.put('batm', 'orders', 0, 3),
       pg_temp.put('batm', 'orders', 0, 4);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('batm');
RESET ROLE;
SELECT size, first_id FROM regress_eventbox_fn.calls ORDER BY n;
SELECT message_id, handler FROM regress_eventbox_fn.effects ORDER BY n;
SELECT status, count(*) FROM msgs WHERE sub = 'batm' GROUP BY status;

-- ---- dry runs report each message on its own -------------------------------------------------

SELECT pg_temp.put('batp', 'orders', 0, 6), pg_temp.put('batp', 'orders', 0, 7);
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/7', 'batch');
TRUNCATE regress_eventbox_fn.calls;
SELECT message_id, outcome, sqlstate
  FROM eventbox.dry_run('batp', ARRAY['orders/0/6', 'orders/0/7']) ORDER BY message_id;
SELECT count(*) AS calls_kept FROM regress_eventbox_fn.calls;
DELETE FROM regress_eventbox_fn.failing;

-- ---- unregister ------------------------------------------------------------------------------

SET ROLE regress_eventbox_owner;
SELECT eventbox.unregister_handler('batm', 'regress_eventbox_fn.batch(eventbox.inbox[])');
RESET ROLE;
SELECT * FROM hb WHERE subscription = 'batm';

REVOKE ALL ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid) FROM regress_eventbox_runner;
REVOKE ALL ON SCHEMA eventbox FROM regress_eventbox_runner;
\i :handlers_cleanup
