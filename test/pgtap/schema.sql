-- pgTAP: the shape of what CREATE EXTENSION pg_eventbox installs (docs/reference/functions.md).
BEGIN;
CREATE EXTENSION IF NOT EXISTS pg_eventbox;

SELECT plan(108);

-- Extension and schema.
SELECT has_extension('eventbox', 'pg_eventbox', 'pg_eventbox is installed in schema eventbox');
SELECT is((SELECT extversion FROM pg_extension WHERE extname = 'pg_eventbox'), '0.6.0',
          'extension version is 0.6.0');
SELECT is((SELECT extrelocatable FROM pg_extension WHERE extname = 'pg_eventbox'), false,
          'extension is not relocatable');
SELECT has_schema('eventbox');

-- eventbox.outbox: a view over the rotated tables (docs/design/outbox-rotation.md) with exactly
-- the old table's columns, in its order, with its types.
SELECT has_view('eventbox', 'outbox', 'view eventbox.outbox exists');
SELECT columns_are('eventbox', 'outbox', ARRAY[
    'id', 'message_id', 'topic', 'key', 'payload', 'headers', 'created_at', 'status', 'attempts',
    'next_attempt_at', 'sent_at', 'kafka_partition', 'kafka_offset', 'last_error',
    'cause_subscription', 'cause_received_at']);
SELECT is((SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute
            WHERE attrelid = 'eventbox.outbox'::regclass AND attnum > 0),
          ARRAY['id', 'message_id', 'topic', 'key', 'payload', 'headers', 'created_at', 'status',
                'attempts', 'next_attempt_at', 'sent_at', 'kafka_partition', 'kafka_offset',
                'last_error', 'cause_subscription', 'cause_received_at'],
          'outbox columns are in the old table''s order');

CREATE TEMP TABLE expected_columns (col name, typ text, not_null boolean, def text);
INSERT INTO expected_columns VALUES
    ('id',              'bigint',                   true,  NULL),
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

-- 16 has_column + 16 col_type_is = 32
SELECT has_column('eventbox', 'outbox', col, 'outbox has column ' || col)
  FROM expected_columns ORDER BY col;
SELECT col_type_is('eventbox', 'outbox', col, typ, 'outbox.' || col || ' is ' || typ)
  FROM expected_columns ORDER BY col;
-- What an INSERT into the view gets: 4 defaults checked by value, 12 columns without one (id
-- is drawn by the INSERT trigger, an explicit one refused) = 16
SELECT col_default_is('eventbox', 'outbox', col, def, 'outbox.' || col || ' defaults to ' || def)
  FROM expected_columns WHERE def IS NOT NULL ORDER BY col;
SELECT col_hasnt_default('eventbox', 'outbox', col, 'outbox.' || col || ' has no default')
  FROM expected_columns WHERE def IS NULL ORDER BY col;

-- The rotated tables: the message columns, NOT NULL where the old table's were, a primary key
-- on id, message_id unique, no other index, autovacuum off, WAL-logged. 3 x 7 = 21
CREATE TEMP TABLE rotated (n int);
INSERT INTO rotated VALUES (0), (1), (2);
SELECT has_table('eventbox', 'outbox_rows_' || n, 'table eventbox.outbox_rows_' || n || ' exists')
  FROM rotated ORDER BY n;
SELECT is((SELECT array_agg(format('%s %s%s', attname, format_type(atttypid, atttypmod),
                                   CASE WHEN attnotnull THEN ' not null' ELSE '' END)
                            ORDER BY attnum)
             FROM pg_attribute WHERE attrelid = format('eventbox.outbox_rows_%s', n)::regclass
              AND attnum > 0 AND NOT attisdropped),
          ARRAY['id bigint not null', 'message_id uuid not null', 'topic text not null',
                'key bytea', 'payload bytea', 'headers jsonb not null',
                'created_at timestamp with time zone not null', 'cause_subscription text',
                'cause_received_at timestamp with time zone'],
          'outbox_rows_' || n || ' has the message columns')
  FROM rotated ORDER BY n;
SELECT col_is_pk('eventbox', 'outbox_rows_' || n, 'id', 'outbox_rows_' || n || '.id is the primary key')
  FROM rotated ORDER BY n;
SELECT col_is_unique('eventbox', 'outbox_rows_' || n, ARRAY['message_id'],
                     'outbox_rows_' || n || '.message_id is unique')
  FROM rotated ORDER BY n;
SELECT indexes_are('eventbox', 'outbox_rows_' || n,
                   ARRAY['outbox_rows_' || n || '_pkey', 'outbox_rows_' || n || '_message_id_key'],
                   'outbox_rows_' || n || ' has no partial index (rows are never updated)')
  FROM rotated ORDER BY n;
SELECT is((SELECT reloptions FROM pg_class WHERE oid = format('eventbox.outbox_rows_%s', n)::regclass),
          ARRAY['autovacuum_enabled=off'], 'outbox_rows_' || n || ' is not vacuumed (TRUNCATE empties it)')
  FROM rotated ORDER BY n;
SELECT is((SELECT relpersistence::text FROM pg_class
            WHERE oid = format('eventbox.outbox_rows_%s', n)::regclass), 'p',
          'outbox_rows_' || n || ' is a permanent (WAL-logged) table')
  FROM rotated ORDER BY n;

-- The view's INSERT trigger checks what the old table's constraints checked.
SELECT throws_ok($$INSERT INTO eventbox.outbox (message_id, topic, status)
                   VALUES (gen_random_uuid(), 't', 'bogus')$$, '23514', NULL,
                 'status outside pending|sent|failed is refused');
SELECT throws_ok($$INSERT INTO eventbox.outbox (message_id, topic, attempts)
                   VALUES (gen_random_uuid(), 't', -1)$$, '23514', NULL,
                 'negative attempts are refused');
SELECT throws_ok($$INSERT INTO eventbox.outbox (message_id, topic, headers)
                   VALUES (gen_random_uuid(), 't', '[]')$$, '23514', NULL,
                 'headers that are not an object are refused');
SELECT throws_ok($$INSERT INTO eventbox.outbox (message_id, topic) VALUES (NULL, 't')$$, '23502',
                 NULL, 'a NULL message_id is refused');
SELECT throws_ok($$INSERT INTO eventbox.outbox (id, message_id, topic) VALUES (1, gen_random_uuid(), 't')$$,
                 '0A000', NULL, 'an explicit id is refused');
SELECT lives_ok($$INSERT INTO eventbox.outbox (message_id, topic, status)
                  SELECT gen_random_uuid(), 't', s FROM unnest(ARRAY['pending', 'sent', 'failed']) s$$,
                'every documented status is accepted');

-- The id sequence: CACHE 1 (ids in allocation order across sessions).
SELECT has_sequence('eventbox', 'outbox_id_seq', 'sequence eventbox.outbox_id_seq exists');
SELECT is((SELECT seqcache FROM pg_sequence WHERE seqrelid = 'eventbox.outbox_id_seq'::regclass),
          1::bigint, 'outbox_id_seq has CACHE 1');
SELECT is((SELECT seqtypid::regtype::text FROM pg_sequence
            WHERE seqrelid = 'eventbox.outbox_id_seq'::regclass), 'bigint', 'outbox_id_seq is bigint');

-- pg_dump carries the outbox's tables, its positions and the sequence, unfiltered.
SELECT is((SELECT array_agg(c::regclass::text ORDER BY c::regclass::text)
             FROM pg_extension, unnest(extconfig, extcondition) AS u(c, cond)
            WHERE extname = 'pg_eventbox' AND c::regclass::text LIKE 'eventbox.outbox%'
              AND cond = ''),
          ARRAY['eventbox.outbox_acks_0', 'eventbox.outbox_acks_1', 'eventbox.outbox_acks_2',
                'eventbox.outbox_held', 'eventbox.outbox_id_seq', 'eventbox.outbox_rows_0',
                'eventbox.outbox_rows_1', 'eventbox.outbox_rows_2', 'eventbox.outbox_state'],
          'the outbox''s tables, positions and sequence are dumped whole');

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
