-- eventbox.send(): both overloads store one pending outbox row per call, in the caller's
-- transaction. Ids and timestamps vary between runs, so rows are shown without them.
SELECT eventbox.truncate_outbox();
\pset null '(null)'

-- jsonb payload with every default: the returned id is the row's message_id, the payload is
-- stored as the JSON text bytes, the row waits as pending with no attempt made.
BEGIN;
SELECT eventbox.send('orders', '{"id": 42, "total": 99.5}'::jsonb) AS m1 \gset
SELECT message_id = :'m1' AS returned_id_is_stored, topic, key,
       convert_from(payload, 'UTF8') AS payload_text,
       convert_from(payload, 'UTF8')::jsonb = '{"id": 42, "total": 99.5}' AS payload_round_trips,
       headers, status, attempts, next_attempt_at, sent_at, kafka_partition, kafka_offset,
       last_error, created_at = now() AS created_in_this_transaction
  FROM eventbox.outbox;
COMMIT;

-- key and headers; the key is stored as the text's UTF-8 bytes.
SELECT eventbox.send('orders', '{"id": 43}'::jsonb, key => 'clé-43',
                     headers => '{"event_type": "OrderCreated", "source": "shop"}') AS m2 \gset
SELECT topic, key, convert_from(key, 'UTF8') AS key_text, convert_from(payload, 'UTF8') AS payload,
       headers, status, attempts
  FROM eventbox.outbox WHERE message_id = :'m2';

-- Positional arguments in declared order: topic, payload, key, headers, message_id.
SELECT eventbox.send('orders', '{"id": 44}'::jsonb, '44', '{"event_type": "OrderPaid"}',
                     '0190a6d2-0000-7000-8000-000000000044');
SELECT topic, convert_from(key, 'UTF8') AS key, headers, status
  FROM eventbox.outbox WHERE message_id = '0190a6d2-0000-7000-8000-000000000044';

-- An explicit message_id is returned and stored as given (any uuid version).
SELECT eventbox.send('orders', '{"id": 45}'::jsonb,
                     message_id => 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11');
SELECT eventbox.send('raw', '\x01'::bytea, message_id => '00000000-0000-0000-0000-000000000000');
SELECT message_id, topic FROM eventbox.outbox
 WHERE message_id IN ('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
                      '00000000-0000-0000-0000-000000000000')
 ORDER BY topic;

-- bytea payload: raw bytes are kept exactly, also when they are not UTF-8.
SELECT eventbox.send('raw', '\x00ff80c3287b'::bytea, key => 'k1') AS m3 \gset
SELECT topic, key, payload, octet_length(payload) AS bytes, headers, status
  FROM eventbox.outbox WHERE message_id = :'m3';

-- A NULL payload is a tombstone (a Kafka record with a null value), for both overloads.
SELECT eventbox.send('compacted', NULL::jsonb, key => 'gone-1') AS m4 \gset
SELECT eventbox.send('compacted', NULL::bytea, key => 'gone-2') AS m5 \gset
SELECT convert_from(key, 'UTF8') AS key, payload, payload IS NULL AS is_tombstone, status
  FROM eventbox.outbox WHERE message_id IN (:'m4', :'m5') ORDER BY id;

-- JSON null is a value, not a tombstone; so are scalars, arrays and empty objects.
SELECT eventbox.send('json', 'null'::jsonb) AS j1 \gset
SELECT eventbox.send('json', '"text"'::jsonb) AS j2 \gset
SELECT eventbox.send('json', '[1, "two", null]'::jsonb) AS j3 \gset
SELECT eventbox.send('json', '{}'::jsonb) AS j4 \gset
SELECT eventbox.send('json', '{"name": "café", "emoji": "\ud83d\ude00", "n": 1.50}'::jsonb) AS j5 \gset
SELECT convert_from(payload, 'UTF8') AS payload_text, octet_length(payload) AS bytes
  FROM eventbox.outbox WHERE message_id IN (:'j1', :'j2', :'j3', :'j4', :'j5') ORDER BY id;

-- An empty key is a key (empty bytes), distinct from no key.
SELECT eventbox.send('keys', '{}'::jsonb, key => '') AS k1 \gset
SELECT eventbox.send('keys', '{}'::jsonb, key => NULL) AS k2 \gset
SELECT message_id = :'k1' AS empty_key_row, key, key IS NULL AS no_key
  FROM eventbox.outbox WHERE message_id IN (:'k1', :'k2') ORDER BY id;

-- NULL headers are stored as an empty object; an empty object stays empty.
SELECT eventbox.send('headers', '{}'::jsonb, headers => NULL) AS h1 \gset
SELECT eventbox.send('headers', '{}'::jsonb, headers => '{}') AS h2 \gset
SELECT eventbox.send('headers', '{}'::jsonb,
                     headers => '{"ce_type": "a.b", "tab": "a\tb", "space": " ", "empty": "", "é": "ü"}')
    AS h3 \gset
SELECT headers FROM eventbox.outbox WHERE message_id IN (:'h1', :'h2', :'h3') ORDER BY id;

-- Legal topic names: letters, digits, '.', '_', '-'; up to 249 characters; dots other than
-- exactly "." and "..".
SELECT eventbox.send(t, '{}'::jsonb) IS NOT NULL AS accepted, length(t) AS length, left(t, 20) AS topic
  FROM (VALUES ('a'), ('A.b_c-D9'), ('...'), ('.hidden'), ('__consumer_like'),
               ('0123456789'), (repeat('x', 249))) v(t);

-- Generated ids: distinct, RFC 9562 version 7 (version nibble 7, variant 10xx), and their
-- first 48 bits are the Unix time in milliseconds.
CREATE TEMP TABLE ids AS
SELECT g, eventbox.send('many', jsonb_build_object('n', g)) AS id
  FROM generate_series(1, 200) g;
SELECT count(*) AS ids, count(DISTINCT id) AS distinct_ids,
       bool_and(substr(id::text, 15, 1) = '7') AS all_version_7,
       bool_and(substr(id::text, 20, 1) IN ('8', '9', 'a', 'b')) AS all_variant_rfc,
       bool_and(abs(('x' || lpad(substr(replace(id::text, '-', ''), 1, 12), 16, '0'))::bit(64)::bigint
                    - (extract(epoch FROM clock_timestamp()) * 1000)::bigint) < 600000)
           AS timestamps_are_now
  FROM ids;
-- Within a session the timestamp part never goes backwards (time-ordered ids).
SELECT bool_and(prev IS NULL OR substr(id::text, 1, 13) >= substr(prev::text, 1, 13)) AS time_ordered
  FROM (SELECT id, lag(id) OVER (ORDER BY g) AS prev FROM ids) s;
-- Every generated id is stored, with its own payload.
SELECT count(*) AS stored
  FROM ids JOIN eventbox.outbox o ON o.message_id = ids.id
 WHERE o.topic = 'many' AND o.payload = convert_to(jsonb_build_object('n', ids.g)::text, 'UTF8');
-- Rows get increasing ids in the order they were sent.
SELECT bool_and(prev_id IS NULL OR id > prev_id) AS ids_increase_in_send_order
  FROM (SELECT o.id, lag(o.id) OVER (ORDER BY ids.g) AS prev_id
          FROM ids JOIN eventbox.outbox o ON o.message_id = ids.id) s;
DROP TABLE ids;

SELECT count(*) AS rows_so_far FROM eventbox.outbox;

-- Published iff the transaction commits: rolled back sends leave nothing behind.
BEGIN;
SELECT eventbox.send('rolled-back', '{"n": 1}'::jsonb) IS NOT NULL AS sent;
SELECT eventbox.send('rolled-back', '\xdead'::bytea) IS NOT NULL AS sent;
SELECT count(*) AS visible_inside FROM eventbox.outbox WHERE topic = 'rolled-back';
ROLLBACK;
SELECT count(*) AS after_rollback FROM eventbox.outbox WHERE topic = 'rolled-back';

-- A savepoint rolled back takes only its own sends with it.
BEGIN;
SELECT eventbox.send('savepoint', '{"n": 1}'::jsonb) IS NOT NULL AS sent;
SAVEPOINT s1;
SELECT eventbox.send('savepoint', '{"n": 2}'::jsonb) IS NOT NULL AS sent;
ROLLBACK TO SAVEPOINT s1;
SELECT eventbox.send('savepoint', '{"n": 3}'::jsonb) IS NOT NULL AS sent;
COMMIT;
SELECT convert_from(payload, 'UTF8') AS payload FROM eventbox.outbox
 WHERE topic = 'savepoint' ORDER BY id;

-- A failed statement aborts the whole transaction, earlier sends included.
BEGIN;
SELECT eventbox.send('aborted', '{"n": 1}'::jsonb) IS NOT NULL AS sent;
SELECT 1 / 0;
COMMIT;
SELECT count(*) AS after_abort FROM eventbox.outbox WHERE topic = 'aborted';

-- send() from PL/pgSQL (nested SPI) and from a trigger, in the caller's transaction.
CREATE TABLE orders (id int PRIMARY KEY, total numeric);
CREATE FUNCTION orders_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM eventbox.send('orders.created', to_jsonb(NEW), key => NEW.id::text,
                          headers => '{"event_type": "OrderCreated"}');
    RETURN NEW;
END $$;
CREATE TRIGGER orders_outbox AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION orders_outbox();
INSERT INTO orders SELECT g, g * 10 FROM generate_series(1, 3) g;
BEGIN;
INSERT INTO orders VALUES (4, 40);
ROLLBACK;
SELECT convert_from(key, 'UTF8') AS key, convert_from(payload, 'UTF8') AS payload, headers
  FROM eventbox.outbox WHERE topic = 'orders.created' ORDER BY id;
DO $$
BEGIN
    FOR i IN 1..5 LOOP
        PERFORM eventbox.send('plpgsql', jsonb_build_object('i', i), key => 'same-key');
    END LOOP;
END $$;
SELECT string_agg(convert_from(payload, 'UTF8'), ' ' ORDER BY id) AS payloads_in_id_order
  FROM eventbox.outbox WHERE topic = 'plpgsql';
DROP TABLE orders;
DROP FUNCTION orders_outbox();

-- A caller's search_path does not matter: send() pins its own.
CREATE SCHEMA regress_shadow;
CREATE TABLE regress_shadow.outbox (LIKE eventbox.outbox);
SET search_path = regress_shadow, public;
SELECT eventbox.send('search-path', '{}'::jsonb) IS NOT NULL AS sent;
RESET search_path;
SELECT count(*) AS in_shadow FROM regress_shadow.outbox;
SELECT count(*) AS in_outbox FROM eventbox.outbox WHERE topic = 'search-path';
DROP SCHEMA regress_shadow CASCADE;

-- Dropping and re-creating the extension in the same session: send() finds the new outbox
-- (its kept plan and the id default's cached sequence must not point at the dropped ones).
SELECT eventbox.send('before-recreate', '{}'::jsonb) IS NOT NULL AS sent;
DROP EXTENSION pg_eventbox;
CREATE EXTENSION pg_eventbox;
SELECT eventbox.send('after-recreate', '{}'::jsonb) IS NOT NULL AS sent;
SELECT eventbox.send('after-recreate', '\x00'::bytea) IS NOT NULL AS sent;
SELECT topic, status, attempts FROM eventbox.outbox ORDER BY id;

SELECT eventbox.truncate_outbox();

-- send() writes its row directly (no executor per call): the row has the columns' defaults,
-- is visible to the rest of the transaction, and goes with a rollback.
BEGIN;
SELECT eventbox.send('direct', '{"a": 1}'::jsonb, headers => NULL) IS NOT NULL AS sent;
SELECT eventbox.send('direct', NULL::bytea, key => 'k') IS NOT NULL AS sent;
SELECT topic, key, convert_from(payload, 'UTF8') AS payload, headers, status, attempts,
       created_at = now() AS created_now, next_attempt_at, sent_at, last_error,
       id = (SELECT max(id) FROM eventbox.outbox) AS newest
  FROM eventbox.outbox WHERE topic = 'direct' ORDER BY id;
ROLLBACK;
SELECT count(*) AS after_rollback FROM eventbox.outbox WHERE topic = 'direct';
-- A savepoint rolled back takes its sends with it.
BEGIN;
SELECT eventbox.send('direct', '{"n": 1}'::jsonb) IS NOT NULL AS sent;
SAVEPOINT s;
SELECT eventbox.send('direct', '{"n": 2}'::jsonb) IS NOT NULL AS sent;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT convert_from(payload, 'UTF8') AS kept FROM eventbox.outbox WHERE topic = 'direct';
SELECT eventbox.truncate_outbox();
-- The outbox's rows are in the open one of the rotated tables (docs/guide/outbox.md): triggers
-- and indexes on the rows go there.
SELECT format('eventbox.outbox_rows_%s', eventbox._outbox_open_table()) AS open_rows \gset
SELECT :'open_rows' AS open_rows;
-- An outbox table someone gave a trigger: send() goes through SQL, so the trigger fires.
CREATE TABLE public.send_audit (topic text, headers jsonb);
CREATE FUNCTION public.send_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.send_audit VALUES (NEW.topic, NEW.headers);
    RETURN NEW;
END $$;
CREATE TRIGGER send_audit BEFORE INSERT ON :open_rows
    FOR EACH ROW EXECUTE FUNCTION public.send_audit();
SELECT eventbox.send('audited', '{}'::jsonb) IS NOT NULL AS sent;
SELECT * FROM public.send_audit;
SELECT topic, status FROM eventbox.outbox;
DROP TRIGGER send_audit ON :open_rows;
DROP FUNCTION public.send_audit();
DROP TABLE public.send_audit;
SELECT eventbox.truncate_outbox();
-- send() works out the outbox's indexes once and keeps that while they stay the same: an index
-- created or dropped later in the session is taken in at the next call.
SELECT eventbox.send('shape', '{}'::jsonb) IS NOT NULL AS sent;
CREATE INDEX outbox_shape_test ON :open_rows (topic) WHERE topic = 'shape2';
SELECT eventbox.send('shape2', '{}'::jsonb) IS NOT NULL AS sent;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM :open_rows WHERE topic = 'shape2';
SELECT count(*) AS in_new_index FROM eventbox.outbox WHERE topic = 'shape2';
DROP INDEX eventbox.outbox_shape_test;
SELECT eventbox.send('shape2', '{}'::jsonb) IS NOT NULL AS sent_after_drop;
-- An expression index (the executor sets those up per statement): send() goes through SQL.
CREATE INDEX outbox_shape_expr ON :open_rows (lower(topic));
SELECT eventbox.send('Shape3', '{}'::jsonb) IS NOT NULL AS sent;
EXPLAIN (COSTS OFF) SELECT count(*) FROM :open_rows WHERE lower(topic) = 'shape3';
SELECT count(*) AS in_expression_index FROM eventbox.outbox WHERE lower(topic) = 'shape3';
DROP INDEX eventbox.outbox_shape_expr;
-- So does one of another index type (some keep state between insertions).
CREATE INDEX outbox_shape_hash ON :open_rows USING hash (topic);
SELECT eventbox.send('shape5', '{}'::jsonb) IS NOT NULL AS sent;
EXPLAIN (COSTS OFF) SELECT count(*) FROM :open_rows WHERE topic = 'shape5';
SELECT count(*) AS in_hash_index FROM eventbox.outbox WHERE topic = 'shape5';
DROP INDEX eventbox.outbox_shape_hash;
RESET enable_seqscan;
RESET enable_bitmapscan;
-- An index whose creation is rolled back (whole transaction or savepoint) is forgotten again.
BEGIN;
CREATE INDEX outbox_shape_rb ON :open_rows (topic);
SELECT eventbox.send('shape6', '{}'::jsonb) IS NOT NULL AS sent;
ROLLBACK;
SELECT eventbox.send('shape6', '{}'::jsonb) IS NOT NULL AS sent_after_rollback;
BEGIN;
SAVEPOINT s;
CREATE INDEX outbox_shape_rb ON :open_rows (topic);
SELECT eventbox.send('shape7', '{}'::jsonb) IS NOT NULL AS sent;
ROLLBACK TO SAVEPOINT s;
SELECT eventbox.send('shape7', '{}'::jsonb) IS NOT NULL AS sent_after_savepoint_rollback;
COMMIT;
SELECT topic, count(*) FROM eventbox.outbox WHERE topic IN ('shape6', 'shape7') GROUP BY topic
 ORDER BY topic;
-- Nothing stays open between calls: the transaction that sent may still truncate the outbox.
BEGIN;
SELECT eventbox.send('shape', '{}'::jsonb) IS NOT NULL AS sent;
SELECT eventbox.truncate_outbox();
SELECT eventbox.send('shape4', '{}'::jsonb) IS NOT NULL AS sent;
COMMIT;
SELECT topic FROM eventbox.outbox;
SELECT eventbox.truncate_outbox();
