-- pgTAP: the inbox part of what CREATE EXTENSION pg_eventbox installs
-- (docs/reference/functions.md, docs/guide/security.md): the subscriptions, inbox and offsets
-- tables, their views, the subscription API and its internal functions, and who may use them.
BEGIN;
CREATE EXTENSION IF NOT EXISTS pg_eventbox;

SELECT plan(342);

-- ---- tables: exactly these columns, with these types, nullability and defaults -------------

SELECT has_table('eventbox', 'subscriptions', 'table eventbox.subscriptions exists');
SELECT has_table('eventbox', 'inbox', 'table eventbox.inbox exists');
SELECT has_table('eventbox', 'offsets', 'table eventbox.offsets exists');
SELECT columns_are('eventbox', 'subscriptions', ARRAY[
    'name', 'topics', 'owner', 'start_from', 'ordering', 'max_attempts', 'backoff', 'backoff_max',
    'message_id_field', 'unhandled', 'batch_size', 'group_id', 'enabled', 'created_at',
    'non_retryable', 'on_dead', 'dead_letter_topic', 'message_id_rule', 'backfill', 'source', 'keep_raw',
    'value_format', 'key_format', 'membership']);
SELECT columns_are('eventbox', 'inbox', ARRAY[
    'subscription', 'message_id', 'topic', 'partition', 'offset', 'key', 'headers', 'payload',
    'raw_payload', 'event_type', 'status', 'attempts', 'next_attempt_at', 'received_at',
    'processed_at', 'last_error', 'mode', 'key_payload', 'raw_headers']);
SELECT columns_are('eventbox', 'offsets', ARRAY[
    'subscription', 'topic', 'partition', 'next_offset', 'high_watermark', 'updated_at',
    'backfill_until']);
-- Conflicting duplicates (issue 17): the row kept and the record that conflicted.
SELECT has_table('eventbox', 'conflicts', 'table eventbox.conflicts exists');
SELECT columns_are('eventbox', 'conflicts', ARRAY[
    'subscription', 'message_id', 'stored_topic', 'stored_partition', 'stored_offset', 'topic',
    'partition', 'offset', 'detected_at']);

CREATE TEMP TABLE expected_columns (tbl name, col name, typ text, not_null boolean, def text);
INSERT INTO expected_columns VALUES
    ('subscriptions', 'name',             'text',                     true,  NULL),
    ('subscriptions', 'topics',           'text[]',                   true,  NULL),
    ('subscriptions', 'owner',            'regrole',                  true,  NULL),
    ('subscriptions', 'start_from',       'text',                     true,  'earliest'),
    ('subscriptions', 'ordering',         'text',                     true,  'partition'),
    ('subscriptions', 'max_attempts',     'integer',                  true,  '10'),
    ('subscriptions', 'backoff',          'interval',                 true,  '00:00:01'),
    ('subscriptions', 'backoff_max',      'interval',                 true,  '00:10:00'),
    ('subscriptions', 'message_id_field', 'text',                     false, NULL),
    ('subscriptions', 'unhandled',        'text',                     true,  'ignore'),
    ('subscriptions', 'batch_size',       'integer',                  true,  '1000'),
    ('subscriptions', 'group_id',         'text',                     false, NULL),
    ('subscriptions', 'enabled',          'boolean',                  true,  'true'),
    ('subscriptions', 'created_at',       'timestamp with time zone', true,  'now()'),
    ('subscriptions', 'non_retryable',    'text[]',                   true,  '{22,23502,23514}'),
    ('subscriptions', 'on_dead',          'text',                     true,  'continue'),
    ('subscriptions', 'dead_letter_topic', 'text',                    false, NULL),
    ('subscriptions', 'message_id_rule',  'text',                     true,  'default'),
    ('subscriptions', 'backfill',         'boolean',                  true,  'false'),
    ('subscriptions', 'keep_raw',         'boolean',                  true,  'false'),
    ('subscriptions', 'value_format',     'text',                     true,  'json'),
    ('subscriptions', 'key_format',       'text',                     true,  'json'),
    ('subscriptions', 'membership',       'text',                     true,  'direct'),
    ('inbox',         'subscription',     'text',                     true,  NULL),
    ('inbox',         'message_id',       'text',                     true,  NULL),
    ('inbox',         'topic',            'text',                     true,  NULL),
    ('inbox',         'partition',        'integer',                  true,  NULL),
    ('inbox',         'offset',           'bigint',                   true,  NULL),
    ('inbox',         'key',              'bytea',                    false, NULL),
    ('inbox',         'headers',          'jsonb',                    true,  '{}'),
    ('inbox',         'payload',          'jsonb',                    false, NULL),
    ('inbox',         'raw_payload',      'bytea',                    false, NULL),
    ('inbox',         'event_type',       'text',                     false, NULL),
    ('inbox',         'status',           'text',                     true,  'received'),
    ('inbox',         'attempts',         'integer',                  true,  '0'),
    ('inbox',         'next_attempt_at',  'timestamp with time zone', false, NULL),
    ('inbox',         'received_at',      'timestamp with time zone', true,  'now()'),
    ('inbox',         'processed_at',     'timestamp with time zone', false, NULL),
    ('inbox',         'last_error',       'text',                     false, NULL),
    ('inbox',         'mode',             'text',                     true,  'live'),
    ('inbox',         'key_payload',      'jsonb',                    false, NULL),
    ('inbox',         'raw_headers',      'bytea',                    false, NULL),
    ('offsets',       'subscription',     'text',                     true,  NULL),
    ('offsets',       'topic',            'text',                     true,  NULL),
    ('offsets',       'partition',        'integer',                  true,  NULL),
    ('offsets',       'next_offset',      'bigint',                   true,  NULL),
    ('offsets',       'high_watermark',   'bigint',                   false, NULL),
    ('offsets',       'updated_at',       'timestamp with time zone', true,  'now()'),
    ('offsets',       'backfill_until',   'bigint',                   false, NULL);

-- 49 columns: has_column + col_type_is + nullability + default (or none) = 196 tests.
SELECT has_column('eventbox', tbl, col, tbl || ' has column ' || col)
  FROM expected_columns ORDER BY tbl, col;
SELECT col_type_is('eventbox', tbl, col, typ, tbl || '.' || col || ' is ' || typ)
  FROM expected_columns ORDER BY tbl, col;
SELECT CASE WHEN not_null THEN col_not_null('eventbox', tbl, col, tbl || '.' || col || ' is NOT NULL')
            ELSE col_is_null('eventbox', tbl, col, tbl || '.' || col || ' allows NULL') END
  FROM expected_columns ORDER BY tbl, col;
-- Defaults compared as the text of the stored expression (pg_get_expr), cast included.
SELECT CASE WHEN def IS NULL
            THEN col_hasnt_default('eventbox', tbl, col, tbl || '.' || col || ' has no default')
            ELSE is((SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d
                      JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
                     WHERE d.adrelid = ('eventbox.' || tbl)::regclass AND a.attname = col),
                    CASE WHEN def IN ('now()', 'true', 'false') OR def ~ '^[0-9]+$' THEN def
                         ELSE quote_literal(def) || '::' || typ END,
                    tbl || '.' || col || ' defaults to ' || def) END
  FROM expected_columns ORDER BY tbl, col;

-- Keys.
SELECT col_is_pk('eventbox', 'subscriptions', ARRAY['name'], 'subscriptions: primary key (name)');
SELECT col_is_pk('eventbox', 'inbox', ARRAY['subscription', 'message_id'],
                 'inbox: primary key (subscription, message_id)');
-- Room on its leaf pages for the entry each processed mark adds (see the install script).
SELECT is((SELECT c.reloptions FROM pg_class c JOIN pg_constraint k ON k.conindid = c.oid
            WHERE k.conrelid = 'eventbox.inbox'::regclass AND k.contype = 'p'),
          ARRAY['fillfactor=50'], 'inbox: primary key index fillfactor 50');
-- Room on each page for the new versions of a page of rows a pass marks in one transaction:
-- the marks stay HOT (see the install script; at 80, 26-29% of them were in test_hot_marks.py).
SELECT is((SELECT reloptions FROM pg_class WHERE oid = 'eventbox.inbox'::regclass),
          ARRAY['fillfactor=50', 'toast_tuple_target=4096'], 'inbox: fillfactor 50');
SELECT col_is_pk('eventbox', 'offsets', ARRAY['subscription', 'topic', 'partition'],
                 'offsets: primary key (subscription, topic, partition)');

-- Check constraints.
SELECT bag_has(
    $$SELECT conrelid::regclass::text, conname::text FROM pg_constraint
       WHERE contype = 'c' AND conrelid IN ('eventbox.subscriptions'::regclass,
                                            'eventbox.inbox'::regclass, 'eventbox.offsets'::regclass)$$,
    $$VALUES ('eventbox.subscriptions', 'subscriptions_name_check'),
             ('eventbox.subscriptions', 'subscriptions_topics_check'),
             ('eventbox.subscriptions', 'subscriptions_start_from_check'),
             ('eventbox.subscriptions', 'subscriptions_ordering_check'),
             ('eventbox.subscriptions', 'subscriptions_unhandled_check'),
             ('eventbox.subscriptions', 'subscriptions_max_attempts_check'),
             ('eventbox.subscriptions', 'subscriptions_backoff_check'),
             ('eventbox.subscriptions', 'subscriptions_batch_size_check'),
             ('eventbox.subscriptions', 'subscriptions_on_dead_check'),
             ('eventbox.subscriptions', 'subscriptions_message_id_rule_check'),
             ('eventbox.inbox', 'inbox_status_check'),
             ('eventbox.inbox', 'inbox_mode_check')$$,
    'the inbox tables have the documented check constraints');
SELECT col_has_check('eventbox', 'subscriptions', c, 'subscriptions.' || c || ' has a check')
  FROM unnest(ARRAY['name', 'topics', 'start_from', 'ordering', 'unhandled', 'max_attempts',
                    'batch_size', 'on_dead', 'message_id_rule']::name[]) c ORDER BY c;
SELECT col_has_check('eventbox', 'subscriptions', ARRAY['backoff', 'backoff_max']::name[],
                     'subscriptions (backoff, backoff_max) has a check');
SELECT col_has_check('eventbox', 'inbox', 'status', 'inbox.status has a check');

-- ... and they hold even for a superuser writing the tables directly.
CREATE TEMP TABLE bad_rows (label text, stmt text);
INSERT INTO bad_rows VALUES
    ('an invalid name',      $$INSERT INTO eventbox.subscriptions (name, topics, owner) VALUES ('a b', '{t}', current_user::text::regrole)$$),
    ('an empty name',        $$INSERT INTO eventbox.subscriptions (name, topics, owner) VALUES ('', '{t}', current_user::text::regrole)$$),
    ('a 64-character name',  $$INSERT INTO eventbox.subscriptions (name, topics, owner) VALUES (repeat('n', 64), '{t}', current_user::text::regrole)$$),
    ('no topics',            $$INSERT INTO eventbox.subscriptions (name, topics, owner) VALUES ('s', '{}', current_user::text::regrole)$$),
    ('start_from middle',    $$INSERT INTO eventbox.subscriptions (name, topics, owner, start_from) VALUES ('s', '{t}', current_user::text::regrole, 'middle')$$),
    ('ordering random',      $$INSERT INTO eventbox.subscriptions (name, topics, owner, ordering) VALUES ('s', '{t}', current_user::text::regrole, 'random')$$),
    ('unhandled drop',       $$INSERT INTO eventbox.subscriptions (name, topics, owner, unhandled) VALUES ('s', '{t}', current_user::text::regrole, 'drop')$$),
    ('max_attempts 0',       $$INSERT INTO eventbox.subscriptions (name, topics, owner, max_attempts) VALUES ('s', '{t}', current_user::text::regrole, 0)$$),
    ('backoff 0',            $$INSERT INTO eventbox.subscriptions (name, topics, owner, backoff) VALUES ('s', '{t}', current_user::text::regrole, '0')$$),
    ('backoff_max < backoff', $$INSERT INTO eventbox.subscriptions (name, topics, owner, backoff, backoff_max) VALUES ('s', '{t}', current_user::text::regrole, '2 seconds', '1 second')$$),
    ('batch_size 0',         $$INSERT INTO eventbox.subscriptions (name, topics, owner, batch_size) VALUES ('s', '{t}', current_user::text::regrole, 0)$$),
    ('batch_size 100001',    $$INSERT INTO eventbox.subscriptions (name, topics, owner, batch_size) VALUES ('s', '{t}', current_user::text::regrole, 100001)$$),
    ('inbox status bogus',   $$INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", status) VALUES ('s', 'm', 't', 0, 0, 'bogus')$$);
SELECT throws_ok(stmt, '23514', NULL, 'a direct insert with ' || label || ' violates a check')
  FROM bad_rows ORDER BY label;
SELECT lives_ok($$INSERT INTO eventbox.subscriptions (name, topics, owner, start_from, ordering,
                      unhandled, max_attempts, backoff, backoff_max, batch_size)
                  VALUES ('pgtap.sub-1', '{t}', current_user::text::regrole, 'latest', 'none',
                          'keep', 1, '1 microsecond', '1 microsecond', 100000)$$,
                'a row at every bound passes the checks');
SELECT lives_ok($$INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", status)
                  SELECT 'pgtap.sub-1', s, 't', 0, o, s
                    FROM unnest(ARRAY['received', 'processed', 'retry', 'dead', 'ignored', 'unparsable'])
                         WITH ORDINALITY AS u(s, o)$$,
                'every documented inbox status is accepted');
SELECT throws_ok($$INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset")
                   VALUES ('pgtap.sub-1', 'received', 'other', 9, 9)$$, '23505', NULL,
                 'a message id is stored once per subscription');
SELECT lives_ok($$INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset")
                  VALUES ('pgtap.sub-2', 'received', 't', 0, 1)$$,
                'the same message id is stored again for another subscription');
SELECT throws_ok($$INSERT INTO eventbox.offsets (subscription, topic, "partition", next_offset)
                   VALUES ('pgtap.sub-1', 't', 0, 1), ('pgtap.sub-1', 't', 0, 2)$$, '23505', NULL,
                 'one offset per subscription, topic and partition');

-- WAL-logged, and owned by the role that created the extension.
SELECT is((SELECT relpersistence::text FROM pg_class WHERE oid = ('eventbox.' || t)::regclass), 'p',
          t || ' is a permanent (WAL-logged) table')
  FROM unnest(ARRAY['subscriptions', 'inbox', 'offsets']) t ORDER BY t;
SELECT is_empty(
    $$SELECT c.oid::regclass::text FROM pg_class c
       WHERE c.oid IN ('eventbox.subscriptions'::regclass, 'eventbox.inbox'::regclass,
                       'eventbox.offsets'::regclass, 'eventbox.inbox_stats'::regclass,
                       'eventbox.lag'::regclass)
         AND c.relowner <> (SELECT extowner FROM pg_extension WHERE extname = 'pg_eventbox')$$,
    'the inbox tables and views belong to the extension owner');

-- pg_dump carries the three tables, every row.
SELECT ok((SELECT ('eventbox.' || t)::regclass = ANY (extconfig) FROM pg_extension
            WHERE extname = 'pg_eventbox'), t || ' is registered with pg_extension_config_dump')
  FROM unnest(ARRAY['subscriptions', 'inbox', 'offsets']) t ORDER BY t;
SELECT is((SELECT extcondition[array_position(extconfig, ('eventbox.' || t)::regclass)]
             FROM pg_extension WHERE extname = 'pg_eventbox'), '',
          'every row of ' || t || ' is dumped (no filter)')
  FROM unnest(ARRAY['subscriptions', 'inbox', 'offsets']) t ORDER BY t;

-- ---- views ---------------------------------------------------------------------------------

SELECT has_view('eventbox', 'inbox_stats', 'view eventbox.inbox_stats exists');
SELECT has_view('eventbox', 'lag', 'view eventbox.lag exists');
SELECT columns_are('eventbox', 'inbox_stats',
                   ARRAY['subscription', 'status', 'messages', 'oldest', 'newest']);
SELECT columns_are('eventbox', 'lag', ARRAY['subscription', 'topic', 'partition', 'next_offset',
                                            'high_watermark', 'lag', 'updated_at']);
SELECT col_type_is('eventbox', 'inbox_stats', 'messages', 'bigint', 'inbox_stats.messages is bigint');
SELECT col_type_is('eventbox', 'lag', 'lag', 'bigint', 'lag.lag is bigint');

-- ---- functions -----------------------------------------------------------------------------

CREATE TEMP TABLE expected_functions (fn name, args name[], lang name, api boolean);
INSERT INTO expected_functions VALUES
    ('create_subscription',
     ARRAY['text', 'text[]', 'text', 'text', 'integer', 'interval', 'interval', 'text', 'text',
           'integer', 'text', 'text[]', 'text', 'text', 'text', 'boolean', 'text', 'boolean',
           'text', 'text', 'text'], 'c', true),
    ('alter_subscription',
     ARRAY['text', 'text[]', 'text', 'text', 'integer', 'interval', 'interval', 'text', 'text',
           'integer', 'text', 'boolean', 'text[]', 'text', 'text', 'text', 'text', 'boolean',
           'text', 'text', 'text'], 'c', true),
    ('drop_subscription', ARRAY['text'], 'c', true),
    ('_create_subscription',
     ARRAY['oid', 'text', 'text[]', 'text', 'text', 'integer', 'interval', 'interval', 'text',
           'text', 'integer', 'text', 'text[]', 'text', 'text', 'text', 'boolean', 'text', 'boolean',
           'text', 'text', 'text'],
     'plpgsql', false),
    ('_alter_subscription',
     ARRAY['oid', 'text', 'text[]', 'text', 'text', 'integer', 'interval', 'interval', 'text',
           'text', 'integer', 'text', 'boolean', 'text[]', 'text', 'text', 'text', 'text', 'boolean',
           'text', 'text', 'text'],
     'plpgsql', false),
    ('_drop_subscription', ARRAY['oid', 'text'], 'plpgsql', false),
    ('_managed_subscription', ARRAY['oid', 'text'], 'plpgsql', false),
    ('_check_subscription_options',
     ARRAY['text[]', 'text', 'text', 'integer', 'interval', 'interval', 'text', 'integer'],
     'plpgsql', false),
    ('_check_dead_letter_options', ARRAY['text[]', 'text', 'text', 'text'], 'plpgsql', false),
    ('_check_topic', ARRAY['text'], 'c', false),
    ('_notify_ingest', '{}', 'c', false);

-- 11 functions x (exists + single overload + language + not a definer + PUBLIC cannot execute).
SELECT has_function('eventbox', fn, args, format('eventbox.%s(%s) exists', fn, array_to_string(args, ', ')))
  FROM expected_functions ORDER BY fn;
SELECT is((SELECT count(*) FROM pg_proc
            WHERE pronamespace = 'eventbox'::regnamespace AND proname = fn), 1::bigint,
          'eventbox.' || fn || ' has no other overload')
  FROM expected_functions ORDER BY fn;
SELECT function_lang_is('eventbox', fn, args, lang, fn || ' is written in ' || lang)
  FROM expected_functions ORDER BY fn;
-- The API reaches the tables through the owner trampoline, not SECURITY DEFINER; the internal
-- functions run as whoever calls them, which only the extension owner may.
SELECT isnt_definer('eventbox', fn, args, fn || ' is not SECURITY DEFINER')
  FROM expected_functions ORDER BY fn;
SELECT function_privs_are('eventbox', fn, args, 'public', '{}'::text[],
                          'PUBLIC cannot execute ' || fn)
  FROM expected_functions ORDER BY fn;

-- The API: documented signatures, the trampoline, NULLs reach the function (clear errors).
SELECT is(pg_get_function_arguments(format('eventbox.%s(%s)', fn, array_to_string(args, ', '))::regprocedure),
          want, fn || ' has the documented argument names and defaults')
  FROM expected_functions JOIN (VALUES
    ('create_subscription', 'name text, topics text[], start_from text DEFAULT ''earliest''::text, ordering text DEFAULT ''partition''::text, max_attempts integer DEFAULT 10, backoff interval DEFAULT ''00:00:01''::interval, backoff_max interval DEFAULT ''00:10:00''::interval, message_id_field text DEFAULT NULL::text, unhandled text DEFAULT ''ignore''::text, batch_size integer DEFAULT 1000, group_id text DEFAULT NULL::text, non_retryable text[] DEFAULT ''{22,23502,23514}''::text[], on_dead text DEFAULT ''continue''::text, dead_letter_topic text DEFAULT NULL::text, message_id_rule text DEFAULT ''default''::text, backfill boolean DEFAULT false, source text DEFAULT ''kafka''::text, keep_raw boolean DEFAULT false, value_format text DEFAULT ''json''::text, key_format text DEFAULT ''json''::text, membership text DEFAULT ''direct''::text'),
    ('alter_subscription', 'name text, topics text[] DEFAULT NULL::text[], start_from text DEFAULT NULL::text, ordering text DEFAULT NULL::text, max_attempts integer DEFAULT NULL::integer, backoff interval DEFAULT NULL::interval, backoff_max interval DEFAULT NULL::interval, message_id_field text DEFAULT NULL::text, unhandled text DEFAULT NULL::text, batch_size integer DEFAULT NULL::integer, group_id text DEFAULT NULL::text, enabled boolean DEFAULT NULL::boolean, non_retryable text[] DEFAULT NULL::text[], on_dead text DEFAULT NULL::text, dead_letter_topic text DEFAULT NULL::text, message_id_rule text DEFAULT NULL::text, source text DEFAULT NULL::text, keep_raw boolean DEFAULT NULL::boolean, value_format text DEFAULT NULL::text, key_format text DEFAULT NULL::text, membership text DEFAULT NULL::text'),
    ('drop_subscription', 'name text')) AS w(f, want) ON w.f = fn
 ORDER BY fn;
SELECT function_returns('eventbox', fn, args, 'void', fn || ' returns void')
  FROM expected_functions WHERE api ORDER BY fn;
SELECT is((SELECT prosrc FROM pg_proc
            WHERE oid = format('eventbox.%s(%s)', fn, array_to_string(args, ', '))::regprocedure),
          'eventbox_api_call', fn || ' is the owner trampoline eventbox_api_call')
  FROM expected_functions WHERE api ORDER BY fn;
SELECT isnt_strict('eventbox', fn, args, fn || ' is not STRICT')
  FROM expected_functions WHERE api ORDER BY fn;
SELECT volatility_is('eventbox', fn, args, 'volatile', fn || ' is VOLATILE')
  FROM expected_functions WHERE api ORDER BY fn;
-- A trampoline finds its internal function by name: each API function has one.
SELECT has_function('eventbox', '_' || fn, ARRAY['oid']::name[] || args,
                    fn || ' has its internal eventbox._' || fn || '(oid, ...)')
  FROM expected_functions WHERE api ORDER BY fn;

-- Internal PL/pgSQL functions pin search_path; the API and C helpers run no SQL by name that
-- would need it (the trampoline's query is schema-qualified).
SELECT is((SELECT proconfig FROM pg_proc
            WHERE oid = format('eventbox.%s(%s)', fn, array_to_string(args, ', '))::regprocedure),
          ARRAY['search_path=pg_catalog, pg_temp'], fn || ' pins search_path')
  FROM expected_functions WHERE lang = 'plpgsql' ORDER BY fn;

-- ---- privileges: nothing for PUBLIC --------------------------------------------------------

SELECT table_privs_are('eventbox', t, 'public', '{}'::text[], 'PUBLIC has no privilege on ' || t)
  FROM unnest(ARRAY['subscriptions', 'inbox', 'offsets', 'inbox_stats', 'lag']::name[]) t
 ORDER BY t;
SELECT is_empty(
    $$SELECT c.relname::text, a.privilege_type
        FROM pg_class c, aclexplode(c.relacl) a
       WHERE c.oid IN ('eventbox.subscriptions'::regclass, 'eventbox.inbox'::regclass,
                       'eventbox.offsets'::regclass, 'eventbox.inbox_stats'::regclass,
                       'eventbox.lag'::regclass)
         AND a.grantee <> c.relowner$$,
    'the extension grants nothing on the inbox tables and views to anyone');
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text, a.privilege_type
        FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
       WHERE p.pronamespace = 'eventbox'::regnamespace
         AND p.proname IN ('create_subscription', 'alter_subscription', 'drop_subscription',
                           '_create_subscription', '_alter_subscription', '_drop_subscription',
                           '_managed_subscription', '_check_subscription_options',
                           '_check_dead_letter_options', '_check_subscription_formats',
                           '_check_message_id_rule',
                           '_check_topic', '_notify_ingest')
         AND a.grantee <> p.proowner$$,
    'the extension grants EXECUTE on the subscription functions to no one (PUBLIC included)');
SELECT schema_privs_are('eventbox', 'public', '{}'::text[], 'PUBLIC has no privilege on schema eventbox');

SELECT * FROM finish();
ROLLBACK;
