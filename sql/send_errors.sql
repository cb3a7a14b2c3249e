-- eventbox.send(): every bad input is refused at call time with a clear ERROR, a SQLSTATE and a
-- hint, and nothing is stored.
--
-- The default verbosity shows the message, DETAIL and HINT. The SQLSTATE is printed by
-- :after_error below rather than with VERBOSITY verbose, whose LOCATION lines carry source line
-- numbers of the extension and of PostgreSQL and would make this file break on unrelated edits.
SELECT eventbox.truncate_outbox();
\set SHOW_CONTEXT never
\set after_error 'SELECT :''LAST_ERROR_SQLSTATE'' AS sqlstate, count(*) AS rows_stored FROM eventbox.outbox;'

-- Topic: required, 1 to 249 characters of [a-zA-Z0-9._-], not "." or "..".
SELECT eventbox.send(NULL, '{}'::jsonb);
:after_error
SELECT eventbox.send(NULL, '\x00'::bytea);
:after_error
SELECT eventbox.send('', '{}'::jsonb);
:after_error
SELECT eventbox.send('', '\x00'::bytea);
:after_error
SELECT eventbox.send(repeat('t', 250), '{}'::jsonb);
:after_error
SELECT eventbox.send(repeat('t', 250), '\x00'::bytea);
:after_error
SELECT eventbox.send('.', '{}'::jsonb);
:after_error
SELECT eventbox.send('..', '{}'::jsonb);
:after_error
SELECT eventbox.send('orders created', '{}'::jsonb);
:after_error
SELECT eventbox.send('orders/created', '{}'::jsonb);
:after_error
SELECT eventbox.send('é', '{}'::jsonb);
:after_error
SELECT eventbox.send('ordersé', '\x00'::bytea);
:after_error
SELECT eventbox.send('orders:v1', '{}'::jsonb);
:after_error
-- Control characters are shown escaped, never raw.
SELECT eventbox.send(E'orders\n', '{}'::jsonb);
:after_error
SELECT eventbox.send(E'a\tb', '{}'::jsonb);
:after_error

-- Error texts are sent to clients as they are: they must be valid in the server encoding
-- (UTF-8 here), or a client with another client_encoding gets a conversion error instead of
-- this one. Checked for a non-ASCII character and for a long topic shortened in the message.
CREATE FUNCTION pg_temp.send_error_text_is_valid(topic text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    state text;
    msg text;
    detail text;
    hint text;
BEGIN
    PERFORM eventbox.send(topic, '{}'::jsonb);
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    BEGIN
        PERFORM convert_to(msg || detail || hint, 'UTF8');  -- verifies the encoding
        RETURN state || ': valid UTF-8';
    EXCEPTION WHEN character_not_in_repertoire THEN
        RETURN state || ': NOT valid UTF-8';
    END;
END $$;
SELECT length(t) AS length, right(t, 3) AS ends_with, pg_temp.send_error_text_is_valid(t) AS error_text
  FROM (VALUES ('é'), ('prix€'), ('😀'), ('a b'),
               -- the space is named in the detail; the message shows the first 80 bytes
               (' ' || repeat('a', 78) || 'é'), (' ' || repeat('a', 77) || '€'),
               (' ' || repeat('a', 76) || '😀')) v(t);

-- Headers: a flat JSON object of string values.
SELECT eventbox.send('t', '{}'::jsonb, headers => '["event_type", "OrderCreated"]');
:after_error
SELECT eventbox.send('t', '{}'::jsonb, headers => '"event_type=OrderCreated"');
:after_error
SELECT eventbox.send('t', '{}'::jsonb, headers => '42');
:after_error
SELECT eventbox.send('t', '{}'::jsonb, headers => 'null');
:after_error
SELECT eventbox.send('t', '\x00'::bytea, headers => '[]');
:after_error
SELECT eventbox.send('t', '{}'::jsonb, headers => '{"attempt": 1}');
:after_error
SELECT eventbox.send('t', '{}'::jsonb, headers => '{"event_type": {"name": "OrderCreated"}}');
:after_error
SELECT eventbox.send('t', '{}'::jsonb, headers => '{"trace": null}');
:after_error
SELECT eventbox.send('t', '{}'::jsonb, headers => '{"flag": true}');
:after_error
SELECT eventbox.send('t', '{}'::jsonb, headers => '{"ids": ["a", "b"]}');
:after_error
-- Only the bad header is named, wherever it is.
SELECT eventbox.send('t', '{}'::jsonb, headers => '{"a": "ok", "b": "ok", "c": 3}');
:after_error

-- Header names: not empty, not the reserved message_id.
SELECT eventbox.send('t', '{}'::jsonb, headers => '{"": "x"}');
:after_error
SELECT eventbox.send('t', '{}'::jsonb, headers => '{"message_id": "0190a6d2-0000-7000-8000-000000000001"}');
:after_error
SELECT eventbox.send('t', '\x00'::bytea, headers => '{"event_type": "A", "message_id": "x"}');
:after_error

-- CR and LF in header names and values would break header-based protocols downstream.
SELECT eventbox.send('t', '{}'::jsonb, headers => '{"a\rb": "x"}');
:after_error
SELECT eventbox.send('t', '{}'::jsonb, headers => '{"a\nb": "x"}');
:after_error
SELECT eventbox.send('t', '{}'::jsonb, headers => '{"name": "x\ry"}');
:after_error
SELECT eventbox.send('t', '{}'::jsonb, headers => '{"name": "x\ny"}');
:after_error
SELECT eventbox.send('t', '{}'::jsonb, headers => '{"name": "line\r\n"}');
:after_error
-- A name that both carries a line break and has a non-string value: still shown escaped.
SELECT eventbox.send('t', '{}'::jsonb, headers => '{"a\nb": 1}');
:after_error
-- NUL cannot reach send(): jsonb itself refuses \u0000 in text, before send() is called.
SELECT '{"a": "\u0000"}'::jsonb;
:after_error
SELECT eventbox.send('t', '{}'::jsonb, headers => '{"a": "\u0000"}');
:after_error
SELECT eventbox.send('t', '{}'::jsonb, headers => '{"\u0000": "a"}');
:after_error

-- Size: the record as the producer counts it must fit in eventbox.max_message_bytes (default
-- 1000000): key + value + every header with its two length varints (the message_id header:
-- 1 + 10 + 1 + 36 = 48 bytes) + 36 bytes of record fields. It is a server-wide setting.
SHOW eventbox.max_message_bytes;
SET eventbox.max_message_bytes = 2048;
:after_error
-- bytea payload of 999911 bytes + key 'k' (1) + header h=v (1+1+1+1) + 48 + 36 = 1000000
-- bytes: accepted.
SELECT eventbox.send('big', convert_to(repeat('a', 999911), 'UTF8'), key => 'k',
                     headers => '{"h": "v"}') IS NOT NULL AS accepted_at_limit;
SELECT octet_length(payload) AS payload_bytes FROM eventbox.outbox WHERE topic = 'big';
SELECT eventbox.truncate_outbox();
-- One byte more is refused.
SELECT eventbox.send('big', convert_to(repeat('a', 999912), 'UTF8'), key => 'k',
                     headers => '{"h": "v"}');
:after_error
-- jsonb payloads count their JSON text: {"x": "..."} is 9 bytes plus the string.
SELECT eventbox.send('big', jsonb_build_object('x', repeat('a', 1000000)));
:after_error
-- The key and the headers count too.
SELECT eventbox.send('big', '{}'::jsonb, key => repeat('k', 1000000));
:after_error
SELECT eventbox.send('big', '{}'::jsonb, headers => jsonb_build_object('h', repeat('v', 1000000)));
:after_error
SELECT eventbox.send('big', NULL::bytea, key => repeat('k', 999917));
:after_error
-- Headers are counted with their framing: 100,000 one-character headers with empty values are
-- 300,000 bytes on the wire. And at most 1000 headers (besides message_id): consumers parse all
-- of a record's headers before any, and librdkafka-based ones fail on very many.
SELECT eventbox.send('hdrs', '{}'::jsonb,
                     headers => (SELECT jsonb_object_agg('h' || g, '') FROM generate_series(1, 1001) g));
:after_error
SELECT eventbox.send('hdrs', '{}'::jsonb,
                     headers => (SELECT jsonb_object_agg('h' || g, '') FROM generate_series(1, 1000) g))
       IS NOT NULL AS thousand_headers_accepted;
SELECT eventbox.truncate_outbox();

-- Duplicate explicit message_id: the unique violation from the outbox comes through with its
-- own SQLSTATE (23505) and detail, not as an internal error.
SELECT eventbox.send('dup', '{"n": 1}'::jsonb, message_id => '0190a6d2-0000-7000-8000-0000000000d1');
SELECT eventbox.send('dup', '{"n": 2}'::jsonb, message_id => '0190a6d2-0000-7000-8000-0000000000d1');
:after_error
SELECT eventbox.send('dup', '\x02'::bytea, message_id => '0190a6d2-0000-7000-8000-0000000000d1');
:after_error
SELECT convert_from(payload, 'UTF8') AS kept_payload FROM eventbox.outbox;
-- message_id is unique per rotated table (docs/design/outbox-rotation.md): with another table
-- open, a given id still queued in the first is refused the same way, on send()'s direct path,
-- on its SQL path (an INSERT into the view) and for a new id nowhere.
BEGIN;
INSERT INTO eventbox.outbox_state (n, state) VALUES (0, 'closed'), (1, 'open');
SAVEPOINT s;
SELECT eventbox.send('dup', '{"n": 3}'::jsonb, message_id => '0190a6d2-0000-7000-8000-0000000000d1');
ROLLBACK TO SAVEPOINT s;
INSERT INTO eventbox.outbox (message_id, topic) VALUES ('0190a6d2-0000-7000-8000-0000000000d1', 'dup');
ROLLBACK TO SAVEPOINT s;
SELECT eventbox.send('dup', '{"n": 4}'::jsonb, message_id => '0190a6d2-0000-7000-8000-0000000000d3')
    IS NOT NULL AS sent;
SELECT r.n, convert_from(r.payload, 'UTF8') AS payload FROM eventbox._outbox_rows r
 WHERE r.topic = 'dup' ORDER BY r.id;
ROLLBACK;
SELECT eventbox.truncate_outbox();

-- Inside a transaction, the failed send aborts it: the earlier send is not published either.
BEGIN;
SELECT eventbox.send('dup', '{"n": 1}'::jsonb, message_id => '0190a6d2-0000-7000-8000-0000000000d2')
    IS NOT NULL AS sent;
SELECT eventbox.send('dup', '{"n": 2}'::jsonb, message_id => '0190a6d2-0000-7000-8000-0000000000d2');
SELECT 1;
COMMIT;
SELECT count(*) AS rows_stored FROM eventbox.outbox;

-- The SQLSTATEs can be caught by condition name; after a caught error the session and the
-- transaction go on, and earlier sends stay.
DO $$
DECLARE
    state text;
BEGIN
    PERFORM eventbox.send('caught', '{"n": 1}'::jsonb,
                          message_id => '0190a6d2-0000-7000-8000-0000000000d3');
    BEGIN
        PERFORM eventbox.send('caught', '{"n": 2}'::jsonb,
                              message_id => '0190a6d2-0000-7000-8000-0000000000d3');
    EXCEPTION WHEN unique_violation THEN
        GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE;
        RAISE NOTICE 'unique_violation caught (%)', state;
    END;
    BEGIN
        PERFORM eventbox.send('bad topic', '{"n": 3}'::jsonb);
    EXCEPTION WHEN invalid_parameter_value THEN
        GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE;
        RAISE NOTICE 'invalid_parameter_value caught (%)', state;
    END;
    BEGIN
        PERFORM eventbox.send('caught', '{"n": 4}'::jsonb, headers => '{"a": 1}');
    EXCEPTION WHEN invalid_parameter_value THEN
        GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE;
        RAISE NOTICE 'invalid_parameter_value caught (%)', state;
    END;
    BEGIN
        PERFORM eventbox.send('caught', convert_to(repeat('a', 1000000), 'UTF8'));
    EXCEPTION WHEN program_limit_exceeded THEN
        GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE;
        RAISE NOTICE 'program_limit_exceeded caught (%)', state;
    END;
    BEGIN
        PERFORM eventbox.send(NULL, '{"n": 5}'::jsonb);
    EXCEPTION WHEN null_value_not_allowed THEN
        GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE;
        RAISE NOTICE 'null_value_not_allowed caught (%)', state;
    END;
    PERFORM eventbox.send('caught', '{"n": 6}'::jsonb);
END $$;
SELECT topic, convert_from(payload, 'UTF8') AS payload FROM eventbox.outbox ORDER BY id;
SELECT eventbox.truncate_outbox();

-- An untyped NULL or string payload matches both overloads: cast it.
SELECT eventbox.send('t', NULL);
:after_error
SELECT eventbox.send('t', '{"a": 1}');
:after_error
-- A payload that is not JSON is refused by the jsonb cast, before send() runs.
SELECT eventbox.send('t', '{"a": 1'::jsonb);
:after_error

-- A read-only transaction (and so a hot standby) refuses send() as it refuses an INSERT: 25006,
-- which drivers and poolers take as "reconnect to the primary" (issue 27, item 3).
BEGIN READ ONLY;
SELECT eventbox.send('orders', '{}'::jsonb);
ROLLBACK;
:after_error
BEGIN READ ONLY;
SELECT eventbox.send('orders', '\x00'::bytea, key => 'k');
ROLLBACK;
:after_error
BEGIN READ ONLY;
SELECT eventbox.next_outbox_id();
ROLLBACK;
:after_error
