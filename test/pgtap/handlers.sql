-- pgTAP: the handlers' objects (docs/reference/functions.md, docs/design/architecture.md and
-- docs/guide/security.md): table eventbox.handlers, the inbox index handler passes read, the API
-- functions and their internal bodies, pg_dump registration and the handler settings.
-- Everything happens in a transaction that is rolled back.
BEGIN;
CREATE EXTENSION IF NOT EXISTS pg_eventbox;

SELECT plan(181);

-- ---- eventbox.handlers -----------------------------------------------------------------------

SELECT has_table('eventbox', 'handlers', 'table eventbox.handlers exists');
SELECT columns_are('eventbox', 'handlers',
                   ARRAY['subscription', 'event_type', 'handler', 'run_as', 'registered_by',
                         'created_at', 'batch'],
                   'eventbox.handlers has exactly the documented columns');

CREATE TEMP TABLE handler_columns (col name, typ text, not_null boolean);
INSERT INTO handler_columns VALUES
    ('subscription',  'text',                     true),
    ('event_type',    'text',                     false),
    ('handler',       'text',                     true),
    ('run_as',        'regrole',                  true),
    ('registered_by', 'regrole',                  true),
    ('created_at',    'timestamp with time zone', true),
    ('batch',         'boolean',                  true);
-- 7 types + 7 nullability checks = 14
SELECT col_type_is('eventbox', 'handlers', col, typ, 'handlers.' || col || ' is ' || typ)
  FROM handler_columns ORDER BY col;
SELECT CASE WHEN not_null
            THEN col_not_null('eventbox', 'handlers', col, 'handlers.' || col || ' is NOT NULL')
            ELSE col_is_null('eventbox', 'handlers', col, 'handlers.' || col || ' allows NULL (every type)')
       END
  FROM handler_columns ORDER BY col;
SELECT col_default_is('eventbox', 'handlers', 'created_at', 'now()',
                      'handlers.created_at defaults to now()');
SELECT col_default_is('eventbox', 'handlers', 'batch', 'false',
                      'handlers.batch defaults to false (a plain handler)');
SELECT col_hasnt_default('eventbox', 'handlers', col, 'handlers.' || col || ' has no default')
  FROM handler_columns WHERE col NOT IN ('created_at', 'batch') ORDER BY col;
SELECT is((SELECT relpersistence::text FROM pg_class WHERE oid = 'eventbox.handlers'::regclass),
          'p', 'handlers is a permanent (WAL-logged) table');

-- One registration per (subscription, event type, handler), a NULL event type included.
SELECT col_is_unique('eventbox', 'handlers', ARRAY['subscription', 'event_type', 'handler'],
                     'handlers is unique on (subscription, event_type, handler)');
SELECT is((SELECT contype::text FROM pg_constraint
            WHERE conrelid = 'eventbox.handlers'::regclass AND conname = 'handlers_unique'),
          'u', 'constraint handlers_unique is a UNIQUE constraint');
SELECT is((SELECT array_agg(a.attname::text ORDER BY k.n)
             FROM pg_constraint c, unnest(c.conkey) WITH ORDINALITY AS k(attnum, n), pg_attribute a
            WHERE c.conrelid = 'eventbox.handlers'::regclass AND c.conname = 'handlers_unique'
              AND a.attrelid = c.conrelid AND a.attnum = k.attnum),
          ARRAY['subscription', 'event_type', 'handler'],
          'handlers_unique covers subscription, event_type, handler in that order');
SELECT ok((SELECT i.indnullsnotdistinct FROM pg_constraint c JOIN pg_index i ON i.indexrelid = c.conindid
            WHERE c.conrelid = 'eventbox.handlers'::regclass AND c.conname = 'handlers_unique'),
          'handlers_unique is NULLS NOT DISTINCT');
SELECT is((SELECT count(*)::int FROM pg_constraint
            WHERE conrelid = 'eventbox.handlers'::regclass AND contype IN ('u', 'p')),
          1, 'handlers has no other key');

-- The constraint at work (rows written directly, as the API's owner would).
CREATE FUNCTION pg_temp.h1(msg eventbox.inbox) RETURNS void LANGUAGE sql AS '';
CREATE FUNCTION pg_temp.h2(msg eventbox.inbox) RETURNS void LANGUAGE sql AS '';
CREATE ROLE regress_eventbox_tap_runner;
CREATE ROLE regress_eventbox_tap_other;
SELECT lives_ok($$INSERT INTO eventbox.handlers (subscription, event_type, handler, run_as, registered_by)
                  VALUES ('s', NULL, 'pg_temp.h1(eventbox.inbox)', 'regress_eventbox_tap_runner',
                          'regress_eventbox_tap_runner')$$,
                'a handler for every type (NULL event_type) is stored');
SELECT throws_ok($$INSERT INTO eventbox.handlers (subscription, event_type, handler, run_as, registered_by)
                   VALUES ('s', NULL, 'pg_temp.h1(eventbox.inbox)', 'regress_eventbox_tap_runner',
                           'regress_eventbox_tap_runner')$$,
                 '23505', NULL,
                 'the same handler for every type twice conflicts (NULLS NOT DISTINCT)');
SELECT throws_ok($$INSERT INTO eventbox.handlers (subscription, event_type, handler, run_as, registered_by)
                   VALUES ('s', NULL, 'pg_temp.h1(eventbox.inbox)', 'regress_eventbox_tap_other',
                           'regress_eventbox_tap_other')$$,
                 '23505', NULL,
                 'a different run_as does not make it another registration');
SELECT lives_ok($$INSERT INTO eventbox.handlers (subscription, event_type, handler, run_as, registered_by)
                  VALUES ('s', 'A', 'pg_temp.h1(eventbox.inbox)', 'regress_eventbox_tap_runner',
                          'regress_eventbox_tap_runner'),
                         ('s', NULL, 'pg_temp.h2(eventbox.inbox)', 'regress_eventbox_tap_runner',
                          'regress_eventbox_tap_runner'),
                         ('t', NULL, 'pg_temp.h1(eventbox.inbox)', 'regress_eventbox_tap_runner',
                          'regress_eventbox_tap_runner')$$,
                'another event type, handler or subscription is another registration');
SELECT throws_ok($$INSERT INTO eventbox.handlers (subscription, event_type, handler, run_as, registered_by)
                   VALUES ('s', 'A', 'pg_temp.h1(eventbox.inbox)', 'regress_eventbox_tap_runner',
                           'regress_eventbox_tap_runner')$$,
                 '23505', NULL, 'the same typed registration twice conflicts');
SELECT throws_ok($$INSERT INTO eventbox.handlers (subscription, handler, run_as, registered_by)
                   VALUES ('s', NULL, 'regress_eventbox_tap_runner', 'regress_eventbox_tap_runner')$$,
                 '23502', NULL, 'handler is required');
SELECT throws_ok($$INSERT INTO eventbox.handlers (subscription, handler, registered_by)
                   VALUES ('s', 'pg_temp.h2(eventbox.inbox)', 'regress_eventbox_tap_runner')$$,
                 '23502', NULL, 'run_as is required');
SELECT is((SELECT count(*)::int FROM eventbox.handlers), 4, 'four registrations stored');
DELETE FROM eventbox.handlers;

-- pg_dump carries the registrations.
SELECT ok((SELECT 'eventbox.handlers'::regclass = ANY (extconfig) FROM pg_extension
            WHERE extname = 'pg_eventbox'),
          'handlers is registered with pg_extension_config_dump');
SELECT is((SELECT extcondition[array_position(extconfig, 'eventbox.handlers'::regclass)]
             FROM pg_extension WHERE extname = 'pg_eventbox'),
          '', 'every registration is dumped (no filter)');
SELECT ok((SELECT 'eventbox.inbox'::regclass = ANY (extconfig) AND
                  'eventbox.subscriptions'::regclass = ANY (extconfig)
             FROM pg_extension WHERE extname = 'pg_eventbox'),
          'the inbox and the subscriptions handlers depend on are dumped too');

-- Nobody but its owner touches it: the API writes it as the extension owner.
SELECT table_privs_are('eventbox', 'handlers', 'public', '{}'::name[],
                       'PUBLIC has no privilege on eventbox.handlers');
SELECT table_privs_are('eventbox', 'handlers', 'regress_eventbox_tap_runner', '{}'::name[],
                       'a new role has no privilege on eventbox.handlers');

-- ---- the index of handler passes -------------------------------------------------------------

SELECT has_index('eventbox', 'inbox', 'inbox_todo_idx',
                 ARRAY['topic', 'partition', 'subscription', '((mode = ''replay''::text))', '"offset"'],
                 'inbox_todo_idx is on (topic, partition, subscription, mode = ''replay'', offset)');
SELECT is((SELECT pg_get_expr(indpred, indrelid) FROM pg_index
            WHERE indexrelid = 'eventbox.inbox_todo_idx'::regclass),
          NULL,
          'inbox_todo_idx holds every row: a processed mark changes no indexed column (HOT)');
SELECT is((SELECT indisunique FROM pg_index WHERE indexrelid = 'eventbox.inbox_todo_idx'::regclass),
          false, 'inbox_todo_idx is not unique');
SELECT is((SELECT amname::text FROM pg_class c JOIN pg_am a ON a.oid = c.relam
            WHERE c.oid = 'eventbox.inbox_todo_idx'::regclass),
          'btree', 'inbox_todo_idx is a btree (ordered by offset within a partition)');

-- ---- the API: register_handler, unregister_handler, process and the operations ----------------

-- Each is a C trampoline (eventbox_api_call) running eventbox._<name>(calling role, ...) as
-- the extension owner: it must not be SECURITY DEFINER itself, or the calling role would be
-- lost.
CREATE TEMP TABLE api (name name, args name[], returns text, arguments text);
INSERT INTO api VALUES
    ('register_handler', ARRAY['text', 'regprocedure', 'text', 'name', 'boolean'], 'void',
     'subscription text, handler regprocedure, event_type text DEFAULT NULL::text, '
     'run_as name DEFAULT CURRENT_USER, batch boolean DEFAULT false'),
    ('unregister_handler', ARRAY['text', 'regprocedure', 'text'], 'void',
     'subscription text, handler regprocedure, event_type text DEFAULT NULL::text'),
    ('process', ARRAY['text', 'integer'], 'integer',
     'subscription text, max_messages integer DEFAULT 100'),
    ('retry', ARRAY['text', 'text'], 'void', 'subscription text, message_id text'),
    ('redrive', ARRAY['text', 'text'], 'bigint',
     'subscription text, event_type text DEFAULT NULL::text'),
    ('skip', ARRAY['text', 'text'], 'void', 'subscription text, message_id text'),
    ('replay', ARRAY['text', 'text', 'integer', 'bigint'], 'void',
     'subscription text, topic text, partition integer, from_offset bigint');
-- 7 functions x 8 checks = 56
SELECT has_function('eventbox', name, args, format('eventbox.%s(%s) exists', name, array_to_string(args, ', ')))
  FROM api ORDER BY name;
SELECT function_returns('eventbox', name, args, returns, format('%s() returns %s', name, returns))
  FROM api ORDER BY name;
SELECT is(pg_get_function_arguments(format('eventbox.%I(%s)', name, array_to_string(args, ','))::regprocedure),
          arguments, name || '() has the documented argument names and defaults')
  FROM api ORDER BY name;
SELECT isnt_definer('eventbox', name, args, name || '() is not SECURITY DEFINER (the trampoline switches role)')
  FROM api ORDER BY name;
SELECT function_lang_is('eventbox', name, args, 'c', name || '() is a C function')
  FROM api ORDER BY name;
SELECT is((SELECT prosrc FROM pg_proc
            WHERE oid = format('eventbox.%I(%s)', name, array_to_string(args, ','))::regprocedure),
          'eventbox_api_call', name || '() is the API trampoline')
  FROM api ORDER BY name;
SELECT volatility_is('eventbox', name, args, 'volatile', name || '() is VOLATILE')
  FROM api ORDER BY name;
SELECT function_privs_are('eventbox', name, args, 'public', '{}'::name[],
                          'PUBLIC cannot execute ' || name || '()')
  FROM api ORDER BY name;
-- Not STRICT: NULL arguments reach the bodies, which answer them with a clear error.
SELECT is_empty($$SELECT oid::regprocedure::text FROM pg_proc
                   WHERE pronamespace = 'eventbox'::regnamespace AND proisstrict
                     AND proname IN ('register_handler', 'unregister_handler', 'process', 'retry',
                                     'redrive', 'skip', 'replay')$$,
                'no handler API function is STRICT');

-- ---- the internal bodies -----------------------------------------------------------------------

CREATE TEMP TABLE internal (name name, args name[], returns text, lang name);
INSERT INTO internal VALUES
    ('_register_handler', ARRAY['oid', 'text', 'regprocedure', 'text', 'name', 'boolean'], 'void',
     'plpgsql'),
    ('_unregister_handler', ARRAY['oid', 'text', 'regprocedure', 'text'], 'void', 'plpgsql'),
    ('_managed_message', ARRAY['oid', 'text', 'text'], 'eventbox.inbox', 'plpgsql'),
    ('_retry', ARRAY['oid', 'text', 'text'], 'void', 'plpgsql'),
    ('_redrive', ARRAY['oid', 'text', 'text'], 'bigint', 'plpgsql'),
    ('_skip', ARRAY['oid', 'text', 'text'], 'void', 'plpgsql'),
    ('_replay', ARRAY['oid', 'text', 'text', 'integer', 'bigint'], 'void', 'plpgsql'),
    ('_process', ARRAY['oid', 'text', 'integer'], 'integer', 'c');
-- 8 functions x 6 checks = 48
SELECT has_function('eventbox', name, args, format('eventbox.%s(%s) exists', name, array_to_string(args, ', ')))
  FROM internal ORDER BY name;
SELECT function_returns('eventbox', name, args, returns, format('%s() returns %s', name, returns))
  FROM internal ORDER BY name;
SELECT function_lang_is('eventbox', name, args, lang, format('%s() is %s', name, lang))
  FROM internal ORDER BY name;
SELECT isnt_definer('eventbox', name, args, name || '() is not SECURITY DEFINER')
  FROM internal ORDER BY name;
SELECT function_privs_are('eventbox', name, args, 'public', '{}'::name[],
                          'PUBLIC cannot execute ' || name || '()')
  FROM internal ORDER BY name;
SELECT function_privs_are('eventbox', name, args, 'regress_eventbox_tap_runner', '{}'::name[],
                          'a new role cannot execute ' || name || '()')
  FROM internal ORDER BY name;
-- The PL/pgSQL bodies pin their search_path (they run as the extension owner).
SELECT is_empty($$SELECT p.oid::regprocedure::text FROM pg_proc p
                   WHERE p.pronamespace = 'eventbox'::regnamespace
                     AND p.proname IN ('_register_handler', '_unregister_handler', '_managed_message',
                                       '_retry', '_redrive', '_skip', '_replay')
                     AND p.proconfig IS DISTINCT FROM ARRAY['search_path=pg_catalog, pg_temp']$$,
                'the PL/pgSQL handler bodies have search_path=pg_catalog, pg_temp');

-- A role without grants is refused before anything happens, and so is one calling the bodies.
GRANT USAGE ON SCHEMA eventbox TO regress_eventbox_tap_runner;
SET LOCAL ROLE regress_eventbox_tap_runner;
SELECT throws_ok($$SELECT eventbox.register_handler('s', 'pg_temp.h1(eventbox.inbox)')$$, '42501', NULL,
                 'a role without EXECUTE cannot call register_handler()');
SELECT throws_ok($$SELECT eventbox.process('s')$$, '42501', NULL,
                 'a role without EXECUTE cannot call process()');
SELECT throws_ok($$SELECT eventbox._register_handler(10, 's', 'pg_temp.h1(eventbox.inbox)', NULL, 'x', false)$$,
                 '42501', NULL, 'a role cannot call _register_handler() with a forged caller');
SELECT throws_ok($$SELECT eventbox._process(10, 's', 1)$$, '42501', NULL,
                 'a role cannot call _process() with a forged caller');
SELECT throws_ok($$INSERT INTO eventbox.handlers (subscription, handler, run_as, registered_by)
                   VALUES ('s', 'pg_temp.h1(eventbox.inbox)', 'regress_eventbox_tap_runner',
                           'regress_eventbox_tap_runner')$$,
                 '42501', NULL, 'a role cannot write eventbox.handlers');
RESET ROLE;

-- ---- settings ---------------------------------------------------------------------------------

SELECT is((SELECT context FROM pg_settings WHERE name = 'eventbox.handler_workers'), 'postmaster',
          'eventbox.handler_workers is set at server start');
SELECT is((SELECT vartype FROM pg_settings WHERE name = 'eventbox.handler_workers'), 'integer',
          'eventbox.handler_workers is an integer');
SELECT is((SELECT boot_val FROM pg_settings WHERE name = 'eventbox.handler_workers'), '2',
          'eventbox.handler_workers defaults to 2');
SELECT is((SELECT min_val FROM pg_settings WHERE name = 'eventbox.handler_workers'), '0',
          'eventbox.handler_workers may be 0 (only eventbox.process() runs handlers)');
SELECT is((SELECT context FROM pg_settings WHERE name = 'eventbox.handler_timeout'), 'sighup',
          'eventbox.handler_timeout changes on reload');
SELECT is((SELECT vartype || ' ' || unit FROM pg_settings WHERE name = 'eventbox.handler_timeout'),
          'integer ms', 'eventbox.handler_timeout is in milliseconds');
SELECT is((SELECT boot_val FROM pg_settings WHERE name = 'eventbox.handler_timeout'), '30000',
          'eventbox.handler_timeout defaults to 30 s');
SELECT is((SELECT min_val FROM pg_settings WHERE name = 'eventbox.handler_timeout'), '0',
          'eventbox.handler_timeout may be 0 (no limit)');
SELECT is((SELECT context FROM pg_settings WHERE name = 'eventbox.allow_superuser_handlers'),
          'postmaster', 'eventbox.allow_superuser_handlers is set at server start');
SELECT is((SELECT vartype FROM pg_settings WHERE name = 'eventbox.allow_superuser_handlers'), 'bool',
          'eventbox.allow_superuser_handlers is a boolean');
SELECT is((SELECT boot_val FROM pg_settings WHERE name = 'eventbox.allow_superuser_handlers'), 'off',
          'eventbox.allow_superuser_handlers defaults to off');
SELECT throws_ok($$SET eventbox.handler_workers = 3$$, '55P02', NULL,
                 'eventbox.handler_workers cannot be SET in a session');
SELECT throws_ok($$SET eventbox.handler_timeout = 5$$, '55P02', NULL,
                 'eventbox.handler_timeout cannot be SET in a session');
SELECT throws_ok($$SET eventbox.allow_superuser_handlers = on$$, '55P02', NULL,
                 'eventbox.allow_superuser_handlers cannot be SET in a session');
SET LOCAL ROLE regress_eventbox_tap_runner;
SELECT throws_ok($$SET eventbox.allow_superuser_handlers = on$$, '55P02', NULL,
                 'nor by an ordinary role');
RESET ROLE;

-- ---- eventbox.handler_claims ----------------------------------------------------------------
-- What a worker's pass took per lane, until its outcomes commit (crash evidence).

SELECT has_table('eventbox', 'handler_claims', 'table eventbox.handler_claims exists');
SELECT columns_are('eventbox', 'handler_claims',
                   ARRAY['subscription', 'topic', 'partition', 'message_ids', 'attempts',
                         'positions', 'running'],
                   'eventbox.handler_claims has exactly its columns');
SELECT col_type_is('eventbox', 'handler_claims', 'message_ids', 'text[]',
                   'handler_claims.message_ids is text[]');
SELECT col_type_is('eventbox', 'handler_claims', 'attempts', 'integer[]',
                   'handler_claims.attempts is integer[]');
SELECT col_type_is('eventbox', 'handler_claims', 'positions', 'integer[]',
                   'handler_claims.positions (places in the pass''s run order) is integer[]');
SELECT col_type_is('eventbox', 'handler_claims', 'running', 'int4range',
                   'handler_claims.running (the run transaction in flight) is int4range');
SELECT col_is_pk('eventbox', 'handler_claims', ARRAY['subscription', 'topic', 'partition'],
                 'one claim per lane');
SELECT eventbox.create_subscription('tap_claims', ARRAY['orders']);
INSERT INTO eventbox.handler_claims VALUES ('tap_claims', 'orders', 0, ARRAY['m'], ARRAY[0]);
SELECT eventbox.drop_subscription('tap_claims');
SELECT is((SELECT count(*) FROM eventbox.handler_claims WHERE subscription = 'tap_claims'),
          0::bigint, 'drop_subscription removes its claims');
SELECT is(has_table_privilege('public', 'eventbox.handler_claims', 'SELECT'), false,
          'PUBLIC cannot read the claims');

SELECT * FROM finish();
ROLLBACK;
