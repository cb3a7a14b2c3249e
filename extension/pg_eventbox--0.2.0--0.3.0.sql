-- pg_eventbox 0.2.0 -> 0.3.0. Released scripts never change: every schema change of 0.3.0 is
-- made here and in pg_eventbox--0.3.0.sql, and the upgrade test proves both give the same schema.
\echo Use "ALTER EXTENSION pg_eventbox UPDATE TO '0.3.0'" to load this file. \quit

-- ---- 0.3.0: a subscription never dead-letters into a topic it reads -------------------------
-- A dead letter written to a topic the subscription reads comes back as a new record, fails
-- again and is dead-lettered again: a loop that grows without end. Every write of the table goes
-- through create_subscription()/alter_subscription(), so one trigger covers both (loops through
-- other subscriptions are broken by the handler workers, see docs/guide/dead-letters.md).
CREATE FUNCTION eventbox._check_dead_letter_loop() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.dead_letter_topic IS NOT NULL AND NEW.dead_letter_topic = ANY (NEW.topics) THEN
        RAISE EXCEPTION 'subscription % reads its own dead_letter_topic %',
                        eventbox._quote(NEW.name), eventbox._quote(NEW.dead_letter_topic)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A dead letter written there would be read, fail and be dead-lettered '
                         'again without end: choose a topic the subscription does not read.';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER subscriptions_dead_letter_loop
    BEFORE INSERT OR UPDATE OF topics, dead_letter_topic ON eventbox.subscriptions
    FOR EACH ROW EXECUTE FUNCTION eventbox._check_dead_letter_loop();

-- ---- 0.3.0: grants by role, the installed version's set -------------------------------------
-- The roles given the writer or admin set through grant_writer()/grant_admin(). Each release's
-- upgrade script ends with _regrant(), so a role keeps exactly its set when functions are
-- created again with other arguments or added.
CREATE TABLE eventbox.role_grants (
    role regrole NOT NULL,
    kind text NOT NULL CHECK (kind IN ('writer', 'admin')),
    PRIMARY KEY (role, kind)
);
SELECT pg_catalog.pg_extension_config_dump('eventbox.role_grants', '');

-- What a writer or an admin is granted in the installed version: one GRANT target a row, by name
-- (every overload of a function), so the set follows the functions each release installs.
CREATE FUNCTION eventbox._grant_set(kind text, OUT privilege text, OUT target text)
RETURNS SETOF record
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT 'USAGE', 'SCHEMA eventbox'
    UNION ALL
    SELECT 'EXECUTE', 'FUNCTION ' || p.oid::regprocedure::text
      FROM pg_proc p
     WHERE p.pronamespace = 'eventbox'::regnamespace
       AND p.proname = ANY (CASE kind
           WHEN 'writer' THEN ARRAY['send', 'current_mode']
           ELSE ARRAY['create_subscription', 'alter_subscription', 'drop_subscription',
                      'register_handler', 'unregister_handler', 'process', 'retry', 'redrive',
                      'skip', 'replay', 'reprocess', 'dry_run', 'workers', 'metrics',
                      'metric_samples', 'create_http_destination', 'alter_http_destination',
                      'drop_http_destination'] END)
    UNION ALL
    SELECT 'SELECT', 'TABLE ' || c.oid::regclass::text
      FROM pg_class c
     WHERE kind = 'admin' AND c.relnamespace = 'eventbox'::regnamespace
       AND c.relname IN ('subscriptions', 'handlers', 'inbox', 'offsets', 'inbox_stats', 'lag',
                         'outbox', 'outbox_stats', 'workers', 'subscription_errors',
                         'key_blocks', 'blocked_keys', 'conflicts', 'suppressed_sends',
                         'metrics', 'http_destinations')
$$;

-- Grants or revokes (grant = false) the set of `kind` for `role`, as the caller.
CREATE FUNCTION eventbox._apply_grants(role regrole, kind text, grant_it boolean)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT * FROM eventbox._grant_set(kind) LOOP
        IF grant_it THEN
            EXECUTE format('GRANT %s ON %s TO %I', g.privilege, g.target, role::text::name);
        ELSE
            EXECUTE format('REVOKE %s ON %s FROM %I', g.privilege, g.target, role::text::name);
        END IF;
    END LOOP;
END $$;

-- The role named `role`, or 42704 with a hint; PUBLIC is never given anything.
CREATE FUNCTION eventbox._grant_role(role name) RETURNS regrole
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r regrole := to_regrole(quote_ident(role));
BEGIN
    IF role IS NULL THEN
        RAISE EXCEPTION 'role must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass the name of the role to grant to or revoke from.';
    END IF;
    IF r IS NULL THEN
        RAISE EXCEPTION 'role % does not exist', coalesce(eventbox._quote(role), 'NULL')
            USING ERRCODE = 'undefined_object',
                  HINT = 'Create the role first: the extension creates no roles and grants '
                         'nothing to PUBLIC.';
    END IF;
    RETURN r;
END $$;

-- Grants (or revokes) the set of `kind` for the role named `role`, as the caller, and records
-- (or forgets) it. A revoked role that keeps the other set keeps the schema's USAGE.
CREATE FUNCTION eventbox._set_grants(role name, kind text, grant_it boolean) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r regrole := eventbox._grant_role(role);
BEGIN
    PERFORM eventbox._apply_grants(r, kind, grant_it);
    IF grant_it THEN
        INSERT INTO eventbox.role_grants VALUES (r, kind) ON CONFLICT DO NOTHING;
        RETURN;
    END IF;
    DELETE FROM eventbox.role_grants g WHERE g.role = r AND g.kind = _set_grants.kind;
    IF EXISTS (SELECT FROM eventbox.role_grants g WHERE g.role = r) THEN
        EXECUTE format('GRANT USAGE ON SCHEMA eventbox TO %I', r::text::name);
    END IF;
END $$;

CREATE FUNCTION eventbox.grant_writer(role name) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT eventbox._set_grants(role, 'writer', true) $$;
COMMENT ON FUNCTION eventbox.grant_writer(name) IS
    'Grant a role what publishing needs (send), in the installed version';

CREATE FUNCTION eventbox.grant_admin(role name) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT eventbox._set_grants(role, 'admin', true) $$;
COMMENT ON FUNCTION eventbox.grant_admin(name) IS
    'Grant a role what managing subscriptions, handlers and operations needs, in the installed version';

CREATE FUNCTION eventbox.revoke_writer(role name) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT eventbox._set_grants(role, 'writer', false) $$;
COMMENT ON FUNCTION eventbox.revoke_writer(name) IS 'Take back what grant_writer() gave';

CREATE FUNCTION eventbox.revoke_admin(role name) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT eventbox._set_grants(role, 'admin', false) $$;
COMMENT ON FUNCTION eventbox.revoke_admin(name) IS 'Take back what grant_admin() gave';

-- Gives every recorded role its set again (roles dropped since are skipped): each upgrade script
-- calls it last, after the release's functions exist.
CREATE FUNCTION eventbox._regrant() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT r.role, r.kind FROM eventbox.role_grants r
              WHERE EXISTS (SELECT FROM pg_roles a WHERE a.oid = r.role) ORDER BY 1, 2 LOOP
        PERFORM eventbox._apply_grants(g.role, g.kind, true);
    END LOOP;
END $$;

REVOKE ALL ON eventbox.role_grants FROM PUBLIC;
REVOKE ALL ON FUNCTION eventbox._check_dead_letter_loop(), eventbox._grant_set(text),
    eventbox._apply_grants(regrole, text, boolean), eventbox._grant_role(name),
    eventbox._set_grants(name, text, boolean),
    eventbox.grant_writer(name), eventbox.grant_admin(name), eventbox.revoke_writer(name),
    eventbox.revoke_admin(name), eventbox._regrant()
    FROM PUBLIC;

-- Last, as in every upgrade script: the recorded roles get this release's set.
SELECT eventbox._regrant();
