-- pg_eventbox 0.1.0 -> 0.2.0. Released scripts never change: every schema change of 0.2.0 is
-- made here and in pg_eventbox--0.2.0.sql, and the upgrade test proves both give the same schema.
\echo Use "ALTER EXTENSION pg_eventbox UPDATE TO '0.2.0'" to load this file. \quit

-- Handlers are stored by their schema-qualified signature instead of a regprocedure column, which
-- pg_upgrade refuses (and a dump restores only while the function keeps its OID). A row whose
-- function is gone gets a signature nobody can create (a name in schema eventbox that carries
-- the old OID): it resolves to nothing and fails at run time, as before.
CREATE FUNCTION eventbox._handler_signature(handler regprocedure) RETURNS text
LANGUAGE sql STABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
    SELECT format('%I.%I(eventbox.inbox)', n.nspname, p.proname)
      FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
     WHERE p.oid = handler
$$;
REVOKE ALL ON FUNCTION eventbox._handler_signature(regprocedure) FROM PUBLIC;

ALTER TABLE eventbox.handlers
    ALTER COLUMN handler TYPE text
    USING coalesce(eventbox._handler_signature(handler),
                   format('eventbox.%I(eventbox.inbox)', 'dropped function ' || handler::oid));

-- Registration and unregistration store and match that signature.
CREATE OR REPLACE FUNCTION eventbox._register_handler(caller oid, subscription text, handler regprocedure,
                                           event_type text, run_as name)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s eventbox.subscriptions;
    role_oid oid;
    inbox_type oid := 'eventbox.inbox'::regtype;
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
    IF (SELECT p.pronargs <> 1 OR p.proargtypes[0] <> inbox_type FROM pg_proc p
         WHERE p.oid = handler) THEN
        RAISE EXCEPTION 'handler % must take exactly one eventbox.inbox argument', handler
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Declare it as f(msg eventbox.inbox).';
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
        INSERT INTO eventbox.handlers (subscription, event_type, handler, run_as, registered_by)
        VALUES (s.name, event_type, eventbox._handler_signature(handler), role_oid::regrole,
                caller::regrole);
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'handler % is already registered for subscription % and event type %',
            handler, eventbox._quote(s.name), coalesce(eventbox._quote(event_type), 'NULL (every type)')
            USING ERRCODE = 'duplicate_object',
                  HINT = 'Unregister it first to change its run_as role.';
    END;
    PERFORM eventbox._notify_ingest();
END $$;

CREATE OR REPLACE FUNCTION eventbox._unregister_handler(caller oid, subscription text, handler regprocedure,
                                             event_type text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s eventbox.subscriptions;
BEGIN
    s := eventbox._managed_subscription(caller, subscription);
    IF handler IS NULL THEN
        RAISE EXCEPTION 'handler must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass the function, e.g. ''billing.on_order(eventbox.inbox)''::regprocedure.';
    END IF;
    DELETE FROM eventbox.handlers h
     WHERE h.subscription = s.name
       AND h.handler = eventbox._handler_signature(_unregister_handler.handler)
       AND h.event_type IS NOT DISTINCT FROM _unregister_handler.event_type;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'handler % is not registered for subscription % and event type %',
            handler, eventbox._quote(s.name), coalesce(eventbox._quote(event_type), 'NULL (every type)')
            USING ERRCODE = 'undefined_object',
                  HINT = 'See the subscription''s rows in eventbox.handlers.';
    END IF;
    PERFORM eventbox._notify_ingest();
END $$;

-- Subscriptions written without the API (pg_restore's COPY, a superuser's UPDATE) wake the
-- ingest workers too: they re-read the table only when told, and a database restored while the
-- workers serve it would otherwise have its subscriptions left unconsumed.
CREATE FUNCTION eventbox._subscriptions_changed() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventbox._notify_ingest();
    RETURN NULL;
END $$;
CREATE TRIGGER subscriptions_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON eventbox.subscriptions
    FOR EACH STATEMENT EXECUTE FUNCTION eventbox._subscriptions_changed();
REVOKE ALL ON FUNCTION eventbox._subscriptions_changed() FROM PUBLIC;

-- Why an ingest worker cannot consume a subscription (or some of its partitions), one row per
-- subscription and worker: a batch it could not store (the subscription is paused and read
-- again from its stored offsets after next_retry_at), or a topic the broker does not know or
-- refuses (retried by the worker on its own). Written by the ingest workers when a subscription
-- starts or stops failing; the other subscriptions are consumed meanwhile. Not dumped: it is
-- the running workers' view.
CREATE TABLE eventbox.ingest_errors (
    subscription  text        NOT NULL,
    worker        integer     NOT NULL,
    error         text        NOT NULL,
    attempts      integer     NOT NULL DEFAULT 0,
    failing_since timestamptz NOT NULL DEFAULT now(),
    next_retry_at timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subscription, worker)
);

CREATE VIEW eventbox.subscription_errors AS
SELECT e.subscription, e.worker + 1 AS ingest_worker, e.error, e.attempts, e.failing_since,
       e.next_retry_at, e.updated_at
  FROM eventbox.ingest_errors e
  JOIN eventbox.subscriptions s ON s.name = e.subscription
 WHERE s.enabled;
REVOKE ALL ON TABLE eventbox.ingest_errors, eventbox.subscription_errors FROM PUBLIC;

-- eventbox.replay() says how many records it will store again (their rows were purged).
CREATE OR REPLACE FUNCTION eventbox._replay(caller oid, subscription text, topic text, "partition" integer,
                                 from_offset bigint)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s eventbox.subscriptions;
    stored_next bigint;
    present bigint;
BEGIN
    s := eventbox._managed_subscription(caller, subscription);
    IF topic IS NULL OR NOT topic = ANY (s.topics) THEN
        RAISE EXCEPTION 'subscription % does not consume topic %', eventbox._quote(s.name),
            coalesce(eventbox._quote(topic), 'NULL') USING ERRCODE = 'invalid_parameter_value',
            HINT = format('Its topics are %s.', array_to_string(s.topics, ', '));
    END IF;
    IF "partition" IS NULL OR "partition" < 0 OR from_offset IS NULL OR from_offset < 0 THEN
        RAISE EXCEPTION 'partition and from_offset must be 0 or more'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Kafka partitions and offsets start at 0.';
    END IF;
    -- Records read again whose row is gone (purged by eventbox.inbox_retention, or deleted) are
    -- not deduplicated: they are stored and handled again. Say how many, before it happens.
    SELECT o.next_offset INTO stored_next FROM eventbox.offsets o
     WHERE o.subscription = s.name AND o.topic = _replay.topic AND o."partition" = _replay."partition";
    IF stored_next > from_offset THEN
        SELECT count(*) INTO present FROM eventbox.inbox i
         WHERE i.subscription = s.name AND i.topic = _replay.topic
           AND i."partition" = _replay."partition"
           AND i."offset" >= from_offset AND i."offset" < stored_next;
        IF stored_next - from_offset - present > 0 THEN
            RAISE NOTICE 'replay of % partition % from offset % will store up to % record(s) again',
                topic, "partition", from_offset, stored_next - from_offset - present
                USING DETAIL = format('Offsets %s to %s were consumed; %s of their messages are still '
                                      'in the inbox and are deduplicated, the others are no longer '
                                      'there (purged by eventbox.inbox_retention, or deleted).',
                                      from_offset, stored_next - 1, present),
                      HINT = 'Their handlers run again. The retention window is the deduplication horizon.';
        END IF;
    END IF;
    INSERT INTO eventbox.offsets (subscription, topic, "partition", next_offset)
    VALUES (s.name, topic, "partition", from_offset)
    ON CONFLICT ON CONSTRAINT offsets_pkey DO UPDATE SET next_offset = excluded.next_offset,
        updated_at = now();
    PERFORM eventbox._notify_ingest();
END $$;

-- ---------------------------------------------------------------------------------------------
-- Retention and metrics (0.2.0).
-- ---------------------------------------------------------------------------------------------

-- eventbox.inbox_retention: the supervisor deletes processed and ignored rows oldest first, a
-- small batch per transaction, walking this index in processed_at order (and eventbox.dead_retention
-- dead and unparsable rows through the next one, by received_at). Partial: the messages still to
-- handle are not in it.
CREATE INDEX inbox_done_idx ON eventbox.inbox (processed_at)
    WHERE status IN ('processed', 'ignored');
CREATE INDEX inbox_dead_idx ON eventbox.inbox (received_at)
    WHERE status IN ('dead', 'unparsable');

-- Counters of the workers (shared memory) and gauges of the tables, in the Prometheus text
-- exposition format 0.0.4; eventbox.metrics_address serves the same text over HTTP.
CREATE FUNCTION eventbox.metrics() RETURNS text
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'eventbox_metrics';
CREATE FUNCTION eventbox.metric_samples(OUT name text, OUT labels jsonb,
                                        OUT value double precision)
RETURNS SETOF record
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'eventbox_metric_samples';
CREATE VIEW eventbox.metrics AS SELECT * FROM eventbox.metric_samples();
COMMENT ON FUNCTION eventbox.metrics() IS
    'Counters and gauges of pg_eventbox in the Prometheus text exposition format 0.0.4';
REVOKE ALL ON FUNCTION eventbox.metrics() FROM PUBLIC;
REVOKE ALL ON FUNCTION eventbox.metric_samples() FROM PUBLIC;
REVOKE ALL ON eventbox.metrics FROM PUBLIC;

-- Bounded outbox: eventbox.dead_retention purges failed outbox rows too (the relay, oldest
-- first by created_at, a batch at a time).
CREATE INDEX outbox_failed_idx ON eventbox.outbox (created_at) WHERE status = 'failed';
