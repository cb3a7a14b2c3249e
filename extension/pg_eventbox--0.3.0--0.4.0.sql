-- pg_eventbox 0.3.0 -> 0.4.0. Released scripts never change: every schema change of 0.4.0 is
-- made here and in pg_eventbox--0.4.0.sql, and the upgrade test proves both give the same schema.
\echo Use "ALTER EXTENSION pg_eventbox UPDATE TO '0.4.0'" to load this file. \quit

-- ---- 0.4.0: the grant sets as rows, one a name ---------------------------------------------
-- Which functions and tables a writer or an admin is granted, by name (every overload of a
-- function). A release that adds an API function adds its row here, in its upgrade script and
-- its full install script; the `grants` regression suite lists any function without one.
CREATE TABLE eventbox._grant_names (
    name text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('writer', 'admin')),
    object text NOT NULL CHECK (object IN ('function', 'table')),
    PRIMARY KEY (name, object)
);
INSERT INTO eventbox._grant_names (name, kind, object)
SELECT n, 'writer', 'function' FROM unnest(ARRAY['send', 'current_mode']) n
UNION ALL
SELECT n, 'admin', 'function'
  FROM unnest(ARRAY['create_subscription', 'alter_subscription', 'drop_subscription',
                    'register_handler', 'unregister_handler', 'process', 'retry', 'redrive',
                    'skip', 'replay', 'reprocess', 'dry_run', 'workers', 'metrics',
                    'metric_samples', 'create_http_destination', 'alter_http_destination',
                    'drop_http_destination']) n
UNION ALL
SELECT n, 'admin', 'table'
  FROM unnest(ARRAY['subscriptions', 'handlers', 'inbox', 'offsets', 'inbox_stats', 'lag',
                    'outbox', 'outbox_stats', 'workers', 'subscription_errors', 'key_blocks',
                    'blocked_keys', 'conflicts', 'suppressed_sends', 'metrics',
                    'http_destinations']) n;
REVOKE ALL ON eventbox._grant_names FROM PUBLIC;

-- What a writer or an admin is granted in the installed version: one GRANT target a row.
CREATE OR REPLACE FUNCTION eventbox._grant_set(kind text, OUT privilege text, OUT target text)
RETURNS SETOF record
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT 'USAGE', 'SCHEMA eventbox'
    UNION ALL
    SELECT 'EXECUTE', 'FUNCTION ' || p.oid::regprocedure::text
      FROM pg_proc p JOIN eventbox._grant_names g ON g.name = p.proname
     WHERE p.pronamespace = 'eventbox'::regnamespace AND g.object = 'function'
       AND g.kind = _grant_set.kind
    UNION ALL
    SELECT 'SELECT', 'TABLE ' || c.oid::regclass::text
      FROM pg_class c JOIN eventbox._grant_names g ON g.name = c.relname
     WHERE c.relnamespace = 'eventbox'::regnamespace AND g.object = 'table'
       AND g.kind = _grant_set.kind AND _grant_set.kind = 'admin'
$$;

-- ---- 0.4.0: batch handlers -------------------------------------------------------------------
-- A batch handler (batch => true) is a function f(msgs eventbox.inbox[]) called once per chunk of
-- a lane's messages. register_handler() gets the option as its last parameter: it is created
-- again, and the EXECUTE grants an administrator gave on the old one are given on the new one
-- (the recorded roles get theirs from _regrant() below).
ALTER TABLE eventbox.handlers ADD COLUMN batch boolean NOT NULL DEFAULT false;

CREATE OR REPLACE FUNCTION eventbox._handler_signature(handler regprocedure) RETURNS text
LANGUAGE sql STABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
    SELECT format('%I.%I(%s)', n.nspname, p.proname,
                  CASE WHEN p.proargtypes[0] = 'eventbox.inbox[]'::pg_catalog.regtype
                       THEN 'eventbox.inbox[]' ELSE 'eventbox.inbox' END)
      FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
     WHERE p.oid = handler
$$;

CREATE TABLE eventbox._upgrade_grants AS
SELECT a.grantee::regrole::text AS grantee, a.is_grantable
  FROM pg_catalog.pg_proc p, LATERAL pg_catalog.aclexplode(p.proacl) a
 WHERE p.oid = 'eventbox.register_handler(text, regprocedure, text, name)'::regprocedure
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0;
DROP FUNCTION eventbox.register_handler(text, regprocedure, text, name);
DROP FUNCTION eventbox._register_handler(oid, text, regprocedure, text, name);

CREATE FUNCTION eventbox._register_handler(caller oid, subscription text, handler regprocedure,
                                           event_type text, run_as name, batch boolean)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s eventbox.subscriptions;
    role_oid oid;
    inbox_type oid := 'eventbox.inbox'::regtype;
    inbox_array oid := 'eventbox.inbox[]'::regtype;
    arg_type oid;
BEGIN
    s := eventbox._managed_subscription(caller, subscription);
    IF handler IS NULL THEN
        RAISE EXCEPTION 'handler must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass the function, e.g. ''billing.on_order(eventbox.inbox)''::regprocedure.';
    END IF;
    IF (SELECT p.prokind <> 'f' FROM pg_proc p WHERE p.oid = handler) THEN
        RAISE EXCEPTION 'handler % is not a function', handler
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Handlers are functions f(msg eventbox.inbox), not procedures or aggregates.';
    END IF;
    IF batch IS NULL THEN
        RAISE EXCEPTION 'batch must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass true for a function f(msgs eventbox.inbox[]) called once per chunk of '
                   'messages, false (the default) for a function f(msg eventbox.inbox).';
    END IF;
    SELECT CASE WHEN p.pronargs = 1 THEN p.proargtypes[0] END INTO arg_type
      FROM pg_proc p WHERE p.oid = handler;
    IF batch AND arg_type IS DISTINCT FROM inbox_array THEN
        RAISE EXCEPTION 'batch handler % must take exactly one eventbox.inbox[] argument', handler
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = CASE WHEN arg_type = inbox_type
                              THEN 'Register it with batch => false, or declare a batch handler '
                                   'as f(msgs eventbox.inbox[]).'
                              ELSE 'Declare it as f(msgs eventbox.inbox[]).' END;
    END IF;
    IF NOT batch AND arg_type IS DISTINCT FROM inbox_type THEN
        RAISE EXCEPTION 'handler % must take exactly one eventbox.inbox argument', handler
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = CASE WHEN arg_type = inbox_array
                              THEN 'Register a function taking eventbox.inbox[] with batch => true.'
                              ELSE 'Declare it as f(msg eventbox.inbox).' END;
    END IF;
    IF event_type = '' THEN
        RAISE EXCEPTION 'event_type must not be empty' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass NULL to handle every event type.';
    END IF;
    SELECT r.oid INTO role_oid FROM pg_roles r WHERE r.rolname = run_as;
    IF role_oid IS NULL THEN
        RAISE EXCEPTION 'role % does not exist', coalesce(eventbox._quote(run_as), 'NULL')
            USING ERRCODE = 'undefined_object', HINT = 'Pass an existing role as run_as.';
    END IF;
    IF NOT pg_has_role(caller, role_oid, 'MEMBER') THEN
        RAISE EXCEPTION 'permission denied to register a handler running as %',
            quote_ident(run_as) USING ERRCODE = 'insufficient_privilege',
            HINT = 'You must be a member of the run_as role.';
    END IF;
    IF (SELECT rolsuper FROM pg_roles WHERE oid = role_oid)
       AND NOT current_setting('eventbox.allow_superuser_handlers')::boolean THEN
        RAISE EXCEPTION 'handlers may not run as superuser %', quote_ident(run_as)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Register the handler with a non-superuser run_as role.';
    END IF;
    IF NOT has_function_privilege(caller, handler, 'EXECUTE')
       OR NOT has_function_privilege(role_oid, handler, 'EXECUTE') THEN
        RAISE EXCEPTION 'permission denied for function %', handler
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'You and the run_as role both need EXECUTE on the handler.';
    END IF;
    BEGIN
        INSERT INTO eventbox.handlers (subscription, event_type, handler, run_as, registered_by,
                                       batch)
        VALUES (s.name, event_type, eventbox._handler_signature(handler), role_oid::regrole,
                caller::regrole, batch);
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'handler % is already registered for subscription % and event type %',
            handler, eventbox._quote(s.name), coalesce(eventbox._quote(event_type), 'NULL (every type)')
            USING ERRCODE = 'duplicate_object',
                  HINT = 'Unregister it first to change its run_as role.';
    END;
    PERFORM eventbox._notify_ingest();
END $$;

CREATE FUNCTION eventbox.register_handler(subscription text, handler regprocedure,
                                          event_type text DEFAULT NULL,
                                          run_as name DEFAULT current_user,
                                          batch boolean DEFAULT false)
RETURNS void LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
REVOKE ALL ON FUNCTION eventbox.register_handler(text, regprocedure, text, name, boolean),
    eventbox._register_handler(oid, text, regprocedure, text, name, boolean) FROM PUBLIC;

DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT * FROM eventbox._upgrade_grants LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION eventbox.register_handler(text, regprocedure, '
                       'text, name, boolean) TO %s%s', g.grantee,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END $$;
DROP TABLE eventbox._upgrade_grants;

-- Each change of 0.4.0 goes in its own section above this line, headed
-- "-- ---- 0.4.0: <what> ----", and the same objects in the full install script.

-- Last, as in every upgrade script: the recorded roles get this release's set.
SELECT eventbox._regrant();
