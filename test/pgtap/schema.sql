-- pgTAP: the shape of what CREATE EXTENSION pg_eventbox installs (docs/reference/functions.md).
BEGIN;
CREATE EXTENSION IF NOT EXISTS pg_eventbox;

SELECT plan(113);

-- Extension and schema.
SELECT has_extension('eventbox', 'pg_eventbox', 'pg_eventbox is installed in schema eventbox');
SELECT is((SELECT extversion FROM pg_extension WHERE extname = 'pg_eventbox'), '0.6.0',
          'extension version is 0.6.0');
SELECT is((SELECT extrelocatable FROM pg_extension WHERE extname = 'pg_eventbox'), false,
          'extension is not relocatable');
SELECT has_schema('eventbox');

-- eventbox.outbox: exactly these columns, with these types, nullability and defaults.
SELECT has_table('eventbox', 'outbox', 'table eventbox.outbox exists');
SELECT columns_are('eventbox', 'outbox', ARRAY[
    'id', 'message_id', 'topic', 'key', 'payload', 'headers', 'created_at', 'status', 'attempts',
    'next_attempt_at', 'sent_at', 'kafka_partition', 'kafka_offset', 'last_error',
    'cause_subscription', 'cause_received_at']);

CREATE TEMP TABLE expected_columns (col name, typ text, not_null boolean, def text);
INSERT INTO expected_columns VALUES
    ('id',              'bigint',                   true,  'eventbox.next_outbox_id()'),
    ('message_id',      'uuid',                     true,  NULL),
    ('topic',           'text',                     true,  NULL),
    ('key',             'bytea',                    false, NULL),
    ('payload',         'bytea',                    false, NULL),
    ('headers',         'jsonb',                    true,  '{}'),
    ('created_at',      'timestamp with time zone', true,  'now()'),
    ('status',          'text',                     true,  'pending'),
    ('attempts',        'integer',                  true,  '0'),
    ('next_attempt_at', 'timestamp with time zone', false, NULL),
    ('sent_at',         'timestamp with time zone', false, NULL),
    ('kafka_partition', 'integer',                  false, NULL),
    ('kafka_offset',    'bigint',                   false, NULL),
    ('last_error',      'text',                     false, NULL),
    ('cause_subscription', 'text',                  false, NULL),
    ('cause_received_at', 'timestamp with time zone', false, NULL);

-- 16 has_column + 16 col_type_is + 16 not-null checks = 48
SELECT has_column('eventbox', 'outbox', col, 'outbox has column ' || col)
  FROM expected_columns ORDER BY col;
SELECT col_type_is('eventbox', 'outbox', col, typ, 'outbox.' || col || ' is ' || typ)
  FROM expected_columns ORDER BY col;
SELECT CASE WHEN not_null THEN col_not_null('eventbox', 'outbox', col, 'outbox.' || col || ' is NOT NULL')
            ELSE col_is_null('eventbox', 'outbox', col, 'outbox.' || col || ' allows NULL') END
  FROM expected_columns ORDER BY col;
-- 5 defaults checked by value, 11 columns without a default = 16
SELECT col_default_is('eventbox', 'outbox', col, def, 'outbox.' || col || ' defaults to ' || def)
  FROM expected_columns WHERE def IS NOT NULL AND col <> 'id' ORDER BY col;
SELECT is((SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d
            JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
           WHERE d.adrelid = 'eventbox.outbox'::regclass AND a.attname = 'id'),
          'eventbox.next_outbox_id()', 'outbox.id defaults to eventbox.next_outbox_id()');
SELECT col_hasnt_default('eventbox', 'outbox', col, 'outbox.' || col || ' has no default')
  FROM expected_columns WHERE def IS NULL ORDER BY col;

-- Keys and constraints.
SELECT col_is_pk('eventbox', 'outbox', 'id', 'outbox.id is the primary key');
SELECT col_is_unique('eventbox', 'outbox', ARRAY['message_id'], 'outbox.message_id is unique');
SELECT col_has_check('eventbox', 'outbox', 'status', 'outbox.status has a check constraint');
SELECT col_has_check('eventbox', 'outbox', 'attempts', 'outbox.attempts has a check constraint');
SELECT col_has_check('eventbox', 'outbox', 'headers', 'outbox.headers has a check constraint');
SELECT throws_ok($$INSERT INTO eventbox.outbox (message_id, topic, status)
                   VALUES (gen_random_uuid(), 't', 'bogus')$$, '23514', NULL,
                 'status outside pending|sent|failed is refused');
SELECT throws_ok($$INSERT INTO eventbox.outbox (message_id, topic, attempts)
                   VALUES (gen_random_uuid(), 't', -1)$$, '23514', NULL,
                 'negative attempts are refused');
SELECT throws_ok($$INSERT INTO eventbox.outbox (message_id, topic, headers)
                   VALUES (gen_random_uuid(), 't', '[]')$$, '23514', NULL,
                 'headers that are not an object are refused');
SELECT lives_ok($$INSERT INTO eventbox.outbox (message_id, topic, status)
                  SELECT gen_random_uuid(), 't', s FROM unnest(ARRAY['pending', 'sent', 'failed']) s$$,
                'every documented status is accepted');
SELECT is((SELECT relpersistence::text FROM pg_class WHERE oid = 'eventbox.outbox'::regclass), 'p',
          'outbox is a permanent (WAL-logged) table');

-- The relay's indexes: pending rows by id (partial), sent rows by sent_at (partial).
SELECT has_index('eventbox', 'outbox', 'outbox_pending_idx', 'id', 'outbox_pending_idx is on (id)');
SELECT is((SELECT pg_get_expr(indpred, indrelid) FROM pg_index
            WHERE indexrelid = 'eventbox.outbox_pending_idx'::regclass),
          '(status = ''pending''::text)', 'outbox_pending_idx covers only pending rows');
SELECT has_index('eventbox', 'outbox', 'outbox_sent_idx', 'sent_at', 'outbox_sent_idx is on (sent_at)');
SELECT is((SELECT pg_get_expr(indpred, indrelid) FROM pg_index
            WHERE indexrelid = 'eventbox.outbox_sent_idx'::regclass),
          '(status = ''sent''::text)', 'outbox_sent_idx covers only sent rows');

-- The id sequence: CACHE 1 (ids in allocation order across sessions), owned by outbox.id.
SELECT has_sequence('eventbox', 'outbox_id_seq', 'sequence eventbox.outbox_id_seq exists');
SELECT is((SELECT seqcache FROM pg_sequence WHERE seqrelid = 'eventbox.outbox_id_seq'::regclass),
          1::bigint, 'outbox_id_seq has CACHE 1');
SELECT is((SELECT seqtypid::regtype::text FROM pg_sequence
            WHERE seqrelid = 'eventbox.outbox_id_seq'::regclass), 'bigint', 'outbox_id_seq is bigint');
SELECT is(pg_get_serial_sequence('eventbox.outbox', 'id'), 'eventbox.outbox_id_seq',
          'outbox_id_seq is owned by outbox.id');

-- pg_dump carries the outbox rows and the sequence position.
SELECT ok((SELECT 'eventbox.outbox'::regclass = ANY (extconfig) FROM pg_extension
            WHERE extname = 'pg_eventbox'), 'outbox is registered with pg_extension_config_dump');
SELECT ok((SELECT 'eventbox.outbox_id_seq'::regclass = ANY (extconfig) FROM pg_extension
            WHERE extname = 'pg_eventbox'), 'outbox_id_seq is registered with pg_extension_config_dump');
SELECT is((SELECT extcondition[array_position(extconfig, 'eventbox.outbox'::regclass)]
             FROM pg_extension WHERE extname = 'pg_eventbox'), '',
          'the whole outbox is dumped (no filter)');

-- Views.
SELECT has_view('eventbox', 'outbox_stats', 'view eventbox.outbox_stats exists');
SELECT has_view('eventbox', 'workers', 'view eventbox.workers exists');

-- send(): two overloads, same signature apart from the payload type.
SELECT has_function('eventbox', 'send', ARRAY['text', 'jsonb', 'text', 'jsonb', 'uuid'],
                    'eventbox.send(text, jsonb, text, jsonb, uuid) exists');
SELECT has_function('eventbox', 'send', ARRAY['text', 'bytea', 'text', 'jsonb', 'uuid'],
                    'eventbox.send(text, bytea, text, jsonb, uuid) exists');
SELECT function_returns('eventbox', 'send', ARRAY['text', 'jsonb', 'text', 'jsonb', 'uuid'], 'uuid',
                        'send(jsonb) returns uuid');
SELECT function_returns('eventbox', 'send', ARRAY['text', 'bytea', 'text', 'jsonb', 'uuid'], 'uuid',
                        'send(bytea) returns uuid');
SELECT is(pg_get_function_arguments('eventbox.send(text, jsonb, text, jsonb, uuid)'::regprocedure),
          'topic text, payload jsonb, key text DEFAULT NULL::text, headers jsonb DEFAULT ''{}''::jsonb, message_id uuid DEFAULT NULL::uuid',
          'send(jsonb) has the documented argument names and defaults');
SELECT is(pg_get_function_arguments('eventbox.send(text, bytea, text, jsonb, uuid)'::regprocedure),
          'topic text, payload bytea, key text DEFAULT NULL::text, headers jsonb DEFAULT ''{}''::jsonb, message_id uuid DEFAULT NULL::uuid',
          'send(bytea) has the documented argument names and defaults');
-- SECURITY INVOKER without settings: a definer's SET search_path cost every call a GUC nest
-- level; send() stores its row itself (by OID, no privilege check on the table) and pins
-- search_path only around the SQL INSERT a table with triggers needs.
SELECT isnt_definer('eventbox', 'send', ARRAY['text', 'jsonb', 'text', 'jsonb', 'uuid'],
                    'send(jsonb) is SECURITY INVOKER');
SELECT isnt_definer('eventbox', 'send', ARRAY['text', 'bytea', 'text', 'jsonb', 'uuid'],
                    'send(bytea) is SECURITY INVOKER');
SELECT is((SELECT proconfig FROM pg_proc
            WHERE oid = 'eventbox.send(text, jsonb, text, jsonb, uuid)'::regprocedure),
          NULL, 'send(jsonb) has no SET clause');
SELECT is((SELECT proconfig FROM pg_proc
            WHERE oid = 'eventbox.send(text, bytea, text, jsonb, uuid)'::regprocedure),
          NULL, 'send(bytea) has no SET clause');
-- Not STRICT: a NULL payload is a tombstone and must reach the function.
SELECT isnt_strict('eventbox', 'send', ARRAY['text', 'jsonb', 'text', 'jsonb', 'uuid'],
                   'send(jsonb) is not STRICT');
SELECT isnt_strict('eventbox', 'send', ARRAY['text', 'bytea', 'text', 'jsonb', 'uuid'],
                   'send(bytea) is not STRICT');
SELECT volatility_is('eventbox', 'send', ARRAY['text', 'jsonb', 'text', 'jsonb', 'uuid'], 'volatile',
                     'send(jsonb) is VOLATILE');
SELECT volatility_is('eventbox', 'send', ARRAY['text', 'bytea', 'text', 'jsonb', 'uuid'], 'volatile',
                     'send(bytea) is VOLATILE');
SELECT is((SELECT proparallel::text FROM pg_proc
            WHERE oid = 'eventbox.send(text, jsonb, text, jsonb, uuid)'::regprocedure), 'u',
          'send(jsonb) is PARALLEL UNSAFE (it writes)');

-- Helper functions: not definers, nothing pinned they would need.
SELECT has_function('eventbox', 'next_outbox_id', '{}'::name[], 'eventbox.next_outbox_id() exists');
SELECT isnt_definer('eventbox', 'next_outbox_id', '{}'::name[], 'next_outbox_id() is not SECURITY DEFINER');
SELECT has_function('eventbox', 'workers', '{}'::name[], 'eventbox.workers() exists');
SELECT isnt_definer('eventbox', 'workers', '{}'::name[], 'workers() is not SECURITY DEFINER');

-- Every SECURITY DEFINER function pins its search_path.
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text FROM pg_proc p
       WHERE p.pronamespace = 'eventbox'::regnamespace AND p.prosecdef
         AND NOT coalesce(p.proconfig::text[] && ARRAY['search_path=pg_catalog, pg_temp'], false)$$,
    'every SECURITY DEFINER function has search_path=pg_catalog, pg_temp');

SELECT * FROM finish();
ROLLBACK;
