-- The failure workflow (issue 17 part A): subscription options non_retryable, on_dead and
-- dead_letter_topic, view eventbox.blocked_keys, and retry / skip / redrive releasing what a dead
-- message held back. Needs no broker: inbox rows are inserted directly and handlers run through
-- eventbox.process(), which runs the workers' code path; dead letters are checked as the outbox
-- rows the relay would publish.
--
-- Deterministic only when no handler worker serves this database (see handlers.sql).
\set SHOW_CONTEXT never
\set VERBOSITY default

SELECT current_setting('eventbox.handler_workers') = '0'
           OR current_setting('eventbox.database') <> current_database() AS no_handler_worker_here;

-- ---- setup ---------------------------------------------------------------------------------
CREATE ROLE regress_dl_runner;
CREATE SCHEMA regress_dl;
GRANT USAGE ON SCHEMA regress_dl TO regress_dl_runner;
-- What handlers did, in the order they did it, and how each message must fail (SQLSTATE).
CREATE TABLE regress_dl.effects (n bigserial, message_id text, key text);
CREATE TABLE regress_dl.failing (message_id text PRIMARY KEY, sqlstate text NOT NULL);
GRANT SELECT ON regress_dl.failing TO regress_dl_runner;
GRANT INSERT ON regress_dl.effects TO regress_dl_runner;
GRANT USAGE ON SEQUENCE regress_dl.effects_n_seq TO regress_dl_runner;
CREATE FUNCTION regress_dl.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    state text;
BEGIN
    INSERT INTO regress_dl.effects (message_id, key)
    VALUES (msg.message_id, convert_from(msg.key, 'UTF8'));
    SELECT f.sqlstate INTO state FROM regress_dl.failing f WHERE f.message_id = msg.message_id;
    IF state = '22P02' THEN
        PERFORM 'not a number'::int;                      -- a cast that fails: class 22
    ELSIF state IS NOT NULL THEN
        RAISE EXCEPTION 'message % refused', msg.message_id USING ERRCODE = state;
    END IF;
END $$;

-- Inbox rows as the ingest worker would store them: message id topic/partition/offset.
CREATE FUNCTION pg_temp.put(sub text, p int, o bigint, key text)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", key,
                                headers, payload)
    VALUES (sub, 'orders/' || p || '/' || o, 'orders', p, o, convert_to(key, 'UTF8'),
            jsonb_build_object('event_type', 'OrderCreated', 'trace', 't' || o),
            jsonb_build_object('o', o))
$$;
CREATE FUNCTION pg_temp.states(sub text) RETURNS TABLE (message_id text, status text,
                                                        attempts int, last_error text)
LANGUAGE sql AS $$
    SELECT i.message_id, i.status, i.attempts, i.last_error FROM eventbox.inbox i
     WHERE i.subscription = sub ORDER BY i."partition", i."offset"
$$;
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- ---- options: defaults, validation, create and alter -------------------------------------
SELECT eventbox.create_subscription('dl_defaults', ARRAY['orders']);
SELECT non_retryable, on_dead, dead_letter_topic FROM eventbox.subscriptions
 WHERE name = 'dl_defaults';
-- Every bad value is refused with a SQLSTATE and a hint, and leaves nothing behind.
SELECT eventbox.create_subscription('dl_bad', ARRAY['orders'], non_retryable => '{2}');
SELECT eventbox.create_subscription('dl_bad', ARRAY['orders'], non_retryable => '{22P0x1}');
SELECT eventbox.create_subscription('dl_bad', ARRAY['orders'], non_retryable => '{22,NULL}');
SELECT eventbox.create_subscription('dl_bad', ARRAY['orders'], non_retryable => NULL);
SELECT eventbox.create_subscription('dl_bad', ARRAY['orders'], on_dead => 'stop');
SELECT eventbox.create_subscription('dl_bad', ARRAY['orders'], on_dead => NULL);
SELECT eventbox.create_subscription('dl_bad', ARRAY['orders'], ordering => 'none',
                                    on_dead => 'block_key');
SELECT eventbox.create_subscription('dl_bad', ARRAY['orders'], dead_letter_topic => 'bad topic');
SELECT eventbox.create_subscription('dl_bad', ARRAY['orders'], dead_letter_topic => '');
SELECT count(*) AS bad_subscriptions FROM eventbox.subscriptions WHERE name = 'dl_bad';
-- Codes are kept in upper case, each once, sorted.
SELECT eventbox.alter_subscription('dl_defaults', non_retryable => '{23514,22,40p01,22}',
                                   on_dead => 'block_key', dead_letter_topic => 'orders.dlt');
SELECT non_retryable, on_dead, dead_letter_topic FROM eventbox.subscriptions
 WHERE name = 'dl_defaults';
SELECT pg_temp.try($$SELECT eventbox.alter_subscription('dl_defaults', ordering => 'none')$$);
SELECT pg_temp.try($$SELECT eventbox.alter_subscription('dl_defaults', on_dead => 'x')$$);
SELECT pg_temp.try($$SELECT eventbox.alter_subscription('dl_defaults', non_retryable => '{x}')$$);
-- NULL keeps an option, '' clears the topic, '{}' retries everything.
SELECT eventbox.alter_subscription('dl_defaults', non_retryable => '{}', dead_letter_topic => '');
SELECT non_retryable, on_dead, dead_letter_topic FROM eventbox.subscriptions
 WHERE name = 'dl_defaults';
SELECT eventbox.drop_subscription('dl_defaults');

-- ---- non-retryable errors: dead at the first attempt ---------------------------------------
SELECT eventbox.create_subscription('dl_nr', ARRAY['orders'], max_attempts => 5,
                                    ordering => 'key');
SELECT eventbox.register_handler('dl_nr', 'regress_dl.handle(eventbox.inbox)'::regprocedure,
                                 run_as => 'regress_dl_runner');
SELECT pg_temp.put('dl_nr', 0, o, 'k' || o) FROM generate_series(0, 4) o;
INSERT INTO regress_dl.failing VALUES
    ('orders/0/0', '22P02'),   -- a failing cast: class 22, in the default list
    ('orders/0/1', '23514'),   -- a check constraint: in the default list
    ('orders/0/2', 'P0001'),   -- a plain RAISE: retried
    ('orders/0/3', 'QE001');   -- the handler refuses the message: never retried
SELECT eventbox.process('dl_nr');
SELECT * FROM pg_temp.states('dl_nr');
-- With non_retryable '{}', only the refusal (QE001) is dead at once.
SELECT eventbox.alter_subscription('dl_nr', non_retryable => '{}');
UPDATE eventbox.inbox SET status = 'received', attempts = 0, last_error = NULL,
                          next_attempt_at = NULL WHERE subscription = 'dl_nr';
SELECT eventbox.process('dl_nr');
SELECT message_id, status, attempts FROM pg_temp.states('dl_nr');
SELECT eventbox.drop_subscription('dl_nr');
DELETE FROM regress_dl.failing;
DELETE FROM regress_dl.effects;

-- ---- on_dead 'block_key': later messages of the dead one's key wait, other keys flow -------
SELECT eventbox.create_subscription('dl_block', ARRAY['orders'], max_attempts => 1,
                                    on_dead => 'block_key', dead_letter_topic => 'orders.dlt');
SELECT eventbox.register_handler('dl_block', 'regress_dl.handle(eventbox.inbox)'::regprocedure,
                                 run_as => 'regress_dl_runner');
-- Partition 0: a, b, a, b, a, NULL, NULL; the first 'a' and the first NULL-key message fail.
SELECT pg_temp.put('dl_block', 0, 0, 'a'), pg_temp.put('dl_block', 0, 1, 'b'),
       pg_temp.put('dl_block', 0, 2, 'a'), pg_temp.put('dl_block', 0, 3, 'b'),
       pg_temp.put('dl_block', 0, 4, 'a'), pg_temp.put('dl_block', 0, 5, NULL),
       pg_temp.put('dl_block', 0, 6, NULL);
INSERT INTO regress_dl.failing VALUES ('orders/0/0', 'P0001'), ('orders/0/5', 'P0001');
-- process() runs passes until nothing is left to run: the dead messages, the other keys, and
-- nothing more later.
SELECT eventbox.process('dl_block') AS first, eventbox.process('dl_block') AS second;
SELECT message_id, status, attempts FROM pg_temp.states('dl_block');
-- Key 'a' is held behind orders/0/0; a NULL key blocks only itself.
SELECT topic, "partition", convert_from(key, 'UTF8') AS key, message_id, "offset", status,
       error, held, since <= now() AS since_ok
  FROM eventbox.blocked_keys;
-- The metrics count blocked keys and held messages per subscription.
SELECT name, value FROM eventbox.metrics
 WHERE name IN ('eventbox_blocked_keys', 'eventbox_held_messages')
   AND labels->>'subscription' = 'dl_block' ORDER BY name;
-- Held messages were never attempted.
SELECT message_id, key FROM regress_dl.effects ORDER BY n;
-- The dead letters: one per dead message, in the same transaction as the dead mark, with the
-- original key, value and headers and the error headers.
SELECT topic, convert_from(key, 'UTF8') AS key, convert_from(payload, 'UTF8') AS payload,
       jsonb_pretty(headers) AS headers
  FROM eventbox.outbox WHERE topic = 'orders.dlt' ORDER BY id;
-- More messages of key 'a' keep waiting.
SELECT pg_temp.put('dl_block', 0, 7, 'a'), pg_temp.put('dl_block', 0, 8, 'c');
SELECT eventbox.process('dl_block');
SELECT message_id, status FROM pg_temp.states('dl_block') WHERE status <> 'processed';
SELECT held FROM eventbox.blocked_keys;

-- retry() of the dead message, still failing: it is dead again, its key stays blocked, and no
-- second block row appears.
SELECT eventbox.retry('dl_block', 'orders/0/0');
SELECT eventbox.process('dl_block');
SELECT message_id, status, attempts FROM pg_temp.states('dl_block')
 WHERE message_id IN ('orders/0/0', 'orders/0/2', 'orders/0/4', 'orders/0/7');
SELECT count(*) AS blocks, sum(held) AS held FROM eventbox.blocked_keys;

-- retry() once the cause is fixed: the dead message runs first, then what it held back, in
-- offset order.
DELETE FROM regress_dl.failing WHERE message_id = 'orders/0/0';
DELETE FROM regress_dl.effects;
SELECT eventbox.retry('dl_block', 'orders/0/0');
SELECT eventbox.process('dl_block'), eventbox.process('dl_block');
SELECT message_id, key FROM regress_dl.effects ORDER BY n;
SELECT count(*) AS blocks FROM eventbox.blocked_keys;
SELECT count(*) AS block_rows FROM eventbox.key_blocks;

-- skip() releases too: a new poison message of key 'b', two behind it, then skip.
DELETE FROM regress_dl.effects;
SELECT pg_temp.put('dl_block', 0, 9, 'b'), pg_temp.put('dl_block', 0, 10, 'b'),
       pg_temp.put('dl_block', 0, 11, 'b');
INSERT INTO regress_dl.failing VALUES ('orders/0/9', '22P02');
SELECT eventbox.process('dl_block'), eventbox.process('dl_block');
SELECT convert_from(key, 'UTF8') AS key, message_id, held, error FROM eventbox.blocked_keys;
SELECT eventbox.skip('dl_block', 'orders/0/9');
SELECT eventbox.process('dl_block');
SELECT message_id, key FROM regress_dl.effects ORDER BY n;
SELECT count(*) AS blocks FROM eventbox.blocked_keys;

-- redrive() releases the keys of every dead message it moves (once they are processed).
DELETE FROM regress_dl.effects;
SELECT pg_temp.put('dl_block', 1, o, 'k' || (o % 2)) FROM generate_series(0, 5) o;
INSERT INTO regress_dl.failing VALUES ('orders/1/0', 'P0001'), ('orders/1/1', 'P0001');
SELECT eventbox.process('dl_block'), eventbox.process('dl_block'), eventbox.process('dl_block');
SELECT "partition", convert_from(key, 'UTF8') AS key, message_id, held FROM eventbox.blocked_keys
 ORDER BY 1, 2;
DELETE FROM regress_dl.failing;
DELETE FROM regress_dl.effects;
SELECT eventbox.redrive('dl_block');
SELECT eventbox.process('dl_block'), eventbox.process('dl_block');
SELECT message_id, key FROM regress_dl.effects ORDER BY n;
SELECT count(*) AS blocks FROM eventbox.blocked_keys;

-- A message whose attempt a crash cut short (its pass's claim is still there) goes dead the
-- same way: block and dead letter in the transaction that settles the claim.
DELETE FROM regress_dl.effects;
SELECT pg_temp.put('dl_block', 2, 0, 'z'), pg_temp.put('dl_block', 2, 1, 'z');
INSERT INTO eventbox.handler_claims (subscription, topic, "partition", message_ids, attempts)
VALUES ('dl_block', 'orders', 2, '{orders/2/0}', '{0}');
SELECT eventbox.process('dl_block');
SELECT message_id, status, attempts, last_error FROM pg_temp.states('dl_block')
 WHERE message_id LIKE 'orders/2/%';
SELECT convert_from(key, 'UTF8') AS key, message_id, held FROM eventbox.blocked_keys;
SELECT headers->>'__eventbox.errors.message_id' AS dead_letter_of,
       headers->>'__connect.errors.exception.message' AS message,
       headers ? '__connect.errors.exception.class.name' AS has_sqlstate
  FROM eventbox.outbox WHERE topic = 'orders.dlt' ORDER BY id DESC LIMIT 1;

-- Exactly once: a pass rolled back with its caller's transaction leaves neither the dead mark,
-- nor the block, nor the dead letter.
SELECT eventbox.skip('dl_block', 'orders/2/0');
SELECT eventbox.process('dl_block');
SELECT pg_temp.put('dl_block', 3, 0, 'r');
INSERT INTO regress_dl.failing VALUES ('orders/3/0', '22P02');
SELECT count(*) AS dead_letters_before FROM eventbox.outbox WHERE topic = 'orders.dlt' \gset
SELECT count(*) AS blocks_before FROM eventbox.key_blocks \gset
BEGIN;
SELECT eventbox.process('dl_block');
SELECT status FROM eventbox.inbox WHERE message_id = 'orders/3/0';
SELECT count(*) - :dead_letters_before AS new_dead_letters FROM eventbox.outbox
 WHERE topic = 'orders.dlt';
SELECT count(*) - :blocks_before AS new_blocks FROM eventbox.key_blocks;
ROLLBACK;
SELECT status FROM eventbox.inbox WHERE message_id = 'orders/3/0';
SELECT count(*) - :dead_letters_before AS new_dead_letters FROM eventbox.outbox
 WHERE topic = 'orders.dlt';
SELECT count(*) - :blocks_before AS new_blocks FROM eventbox.key_blocks;

-- Back to on_dead 'continue': the keys are released at once.
SELECT eventbox.process('dl_block');
SELECT count(*) AS blocks FROM eventbox.blocked_keys;
SELECT eventbox.alter_subscription('dl_block', on_dead => 'continue');
SELECT count(*) AS blocks FROM eventbox.key_blocks;
-- Dropping the subscription removes its blocks with its messages.
SELECT eventbox.alter_subscription('dl_block', on_dead => 'block_key');
SELECT pg_temp.put('dl_block', 3, 1, 'r');
INSERT INTO regress_dl.failing VALUES ('orders/3/1', '22P02');
SELECT eventbox.process('dl_block');
SELECT count(*) AS blocks FROM eventbox.key_blocks;
SELECT eventbox.drop_subscription('dl_block');
SELECT count(*) AS blocks FROM eventbox.key_blocks;

-- ---- ordering 'key': a dead key and a key waiting for a retry, the other keys flow ---------
DELETE FROM regress_dl.effects;
DELETE FROM regress_dl.failing;
SELECT eventbox.create_subscription('dl_key', ARRAY['orders'], ordering => 'key', max_attempts => 3,
                                    backoff => '1 hour', backoff_max => '1 hour',
                                    on_dead => 'block_key');
SELECT eventbox.register_handler('dl_key', 'regress_dl.handle(eventbox.inbox)'::regprocedure,
                                 run_as => 'regress_dl_runner');
SELECT pg_temp.put('dl_key', 0, o, k) FROM (VALUES (0, 'a'), (1, 'b'), (2, 'a'), (3, 'b'),
                                                   (4, 'c'), (5, 'a'), (6, 'c')) v(o, k);
INSERT INTO regress_dl.failing VALUES ('orders/0/0', 'QE001'), ('orders/0/1', 'P0001');
SELECT eventbox.process('dl_key');
SELECT message_id, status, attempts FROM pg_temp.states('dl_key');
SELECT convert_from(key, 'UTF8') AS key, message_id, status, held FROM eventbox.blocked_keys
 WHERE subscription = 'dl_key';
-- skip() of the dead one: key 'a' runs in offset order; 'b' still waits for its retry.
DELETE FROM regress_dl.effects;
SELECT eventbox.skip('dl_key', 'orders/0/0');
SELECT eventbox.process('dl_key');
SELECT message_id, key FROM regress_dl.effects ORDER BY n;
SELECT eventbox.drop_subscription('dl_key');

-- ---- loops through other subscriptions (issue 27, item 2) ---------------------------------
-- A dead letter that comes back to the subscription that wrote it, through other subscriptions'
-- dead-letter topics, names it: in __connect.errors.connector.name when it comes straight back,
-- in __eventbox.errors.subscriptions (every subscription that dead-lettered it, in order) when
-- it went through others. It goes dead without a dead letter, its last_error says why; a dead
-- message that names other subscriptions only is dead-lettered, the trail extended.
DELETE FROM regress_dl.failing;
SELECT eventbox.create_subscription('dl_loop', ARRAY['orders'], max_attempts => 1,
                                    dead_letter_topic => 'orders.dlt');
SELECT eventbox.register_handler('dl_loop', 'regress_dl.handle(eventbox.inbox)'::regprocedure,
                                 run_as => 'regress_dl_runner');
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", headers,
                            payload)
VALUES ('dl_loop', 'own', 'orders', 0, 0,
        '{"__connect.errors.connector.name": "dl_loop"}', '{}'),
       ('dl_loop', 'other', 'orders', 0, 1,
        '{"__connect.errors.connector.name": "dl_other", "__eventbox.errors.subscriptions": "dl_other"}',
        '{}'),
       ('dl_loop', 'through', 'orders', 0, 2,
        '{"__connect.errors.connector.name": "dl_other", "__eventbox.errors.subscriptions": "dl_loop,dl_other"}',
        '{}'),
       ('dl_loop', 'plain', 'orders', 0, 3, '{}', '{}');
INSERT INTO regress_dl.failing
SELECT id, 'P0001' FROM unnest(ARRAY['own', 'other', 'through', 'plain']) id;
SELECT eventbox.process('dl_loop');
SELECT message_id, status, attempts, last_error FROM pg_temp.states('dl_loop');
SELECT headers->>'__eventbox.errors.message_id' AS dead_letter_of,
       headers->>'__connect.errors.connector.name' AS connector,
       headers->>'__eventbox.errors.subscriptions' AS subscriptions
  FROM eventbox.outbox WHERE topic = 'orders.dlt'
   AND headers->>'__connect.errors.connector.name' = 'dl_loop' ORDER BY id;
-- The same when a crash counted its last attempt (the claim a killed pass left).
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", headers,
                            payload)
VALUES ('dl_loop', 'own-crashed', 'orders', 1, 0,
        '{"__connect.errors.connector.name": "dl_loop"}', '{}');
INSERT INTO eventbox.handler_claims (subscription, topic, "partition", message_ids, attempts)
VALUES ('dl_loop', 'orders', 1, '{own-crashed}', '{0}');
SELECT eventbox.process('dl_loop');
SELECT message_id, status, attempts, last_error FROM pg_temp.states('dl_loop')
 WHERE message_id = 'own-crashed';
SELECT count(*) AS dead_letters FROM eventbox.outbox WHERE topic = 'orders.dlt'
   AND headers->>'__connect.errors.connector.name' = 'dl_loop';
SELECT eventbox.drop_subscription('dl_loop');
DELETE FROM regress_dl.failing;

-- ---- cleanup ---------------------------------------------------------------------------------
DELETE FROM eventbox.outbox;
DROP SCHEMA regress_dl CASCADE;
DROP ROLE regress_dl_runner;
