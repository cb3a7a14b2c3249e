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

-- ---- 0.4.0: RabbitMQ destinations ----
-- Messages sent to a topic that has one are published by the relay to a RabbitMQ exchange
-- (eventbox.amqp_url), with publisher confirms and mandatory routing. The relay reads this
-- table with the HTTP destinations: a change moves the same generation (the same trigger
-- function) and shows in the same fingerprint.
CREATE TABLE eventbox.amqp_destination_config (
    topic       text        NOT NULL PRIMARY KEY,
    exchange    text        NOT NULL,
    routing_key text,
    created_by  regrole     NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT amqp_destination_exchange_check CHECK (octet_length(exchange) <= 255),
    CONSTRAINT amqp_destination_routing_key_check
        CHECK (routing_key IS NULL OR octet_length(routing_key) <= 255)
);
SELECT pg_catalog.pg_extension_config_dump('eventbox.amqp_destination_config', '');

CREATE VIEW eventbox.amqp_destinations AS
SELECT c.topic, c.exchange, c.routing_key, c.created_by, c.updated_at
  FROM eventbox.amqp_destination_config c;
COMMENT ON VIEW eventbox.amqp_destinations IS
    'RabbitMQ destinations of outbox topics (routing_key NULL: the message key)';

CREATE TRIGGER amqp_destinations_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON eventbox.amqp_destination_config
    FOR EACH STATEMENT EXECUTE FUNCTION eventbox._http_destinations_trigger();

CREATE FUNCTION eventbox._check_amqp_destination(topic text, exchange text, routing_key text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF topic IS NULL THEN
        PERFORM eventbox._http_error('22004', 'topic must not be NULL',
            'Pass the topic whose messages go to this exchange.');
    END IF;
    IF topic !~ '^[A-Za-z0-9._-]{1,249}$' OR topic IN ('.', '..') THEN
        PERFORM eventbox._http_error('22023', format('invalid topic name %s', eventbox._quote(topic)),
            'Topic names are 1 to 249 characters of letters, digits, ''.'', ''_'' and ''-''.');
    END IF;
    IF exchange IS NULL OR exchange !~ '^[A-Za-z0-9._:-]{0,255}$' THEN
        PERFORM eventbox._http_error('22023', 'exchange must be an AMQP exchange name',
            'Up to 255 letters, digits, ''.'', ''_'', '':'' and ''-''; '''' is the default exchange (routing key = queue name).');
    END IF;
    IF routing_key IS NOT NULL AND octet_length(routing_key) > 255 THEN
        PERFORM eventbox._http_error('22023', 'routing_key is longer than 255 bytes',
            'AMQP routing keys are at most 255 bytes; NULL routes by the message key.');
    END IF;
END $$;

CREATE FUNCTION eventbox._create_amqp_destination(caller oid, topic text, exchange text,
                                                  routing_key text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventbox._check_amqp_destination(topic, exchange, routing_key);
    IF EXISTS (SELECT FROM eventbox.http_destination_config h WHERE h.topic = _create_amqp_destination.topic) THEN
        PERFORM eventbox._http_error('42710', format('topic %s has an HTTP destination', eventbox._quote(topic)),
            'A topic goes to one destination: drop it with eventbox.drop_http_destination() first.');
    END IF;
    BEGIN
        INSERT INTO eventbox.amqp_destination_config (topic, exchange, routing_key, created_by)
        VALUES (topic, exchange, routing_key, caller::regrole);
    EXCEPTION WHEN unique_violation THEN
        PERFORM eventbox._http_error('42710', format('topic %s has an AMQP destination already', eventbox._quote(topic)),
            'Use eventbox.alter_amqp_destination() to change it.');
    END;
END $$;

-- routing_key: NULL keeps it; '' or a key sets it; use_message_key => true goes back to
-- routing by the message key.
CREATE FUNCTION eventbox._alter_amqp_destination(caller oid, topic text, exchange text,
                                                 routing_key text, use_message_key boolean)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    d eventbox.amqp_destination_config;
BEGIN
    SELECT * INTO d FROM eventbox.amqp_destination_config c
     WHERE c.topic = _alter_amqp_destination.topic FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM eventbox._http_error('42704', format('topic %s has no AMQP destination', coalesce(eventbox._quote(topic), 'NULL')),
            'See eventbox.amqp_destinations; create one with eventbox.create_amqp_destination().');
    END IF;
    d.exchange := coalesce(exchange, d.exchange);
    d.routing_key := CASE WHEN use_message_key THEN NULL ELSE coalesce(routing_key, d.routing_key) END;
    PERFORM eventbox._check_amqp_destination(d.topic, d.exchange, d.routing_key);
    UPDATE eventbox.amqp_destination_config c
       SET exchange = d.exchange, routing_key = d.routing_key, updated_at = now()
     WHERE c.topic = d.topic;
END $$;

CREATE FUNCTION eventbox._drop_amqp_destination(caller oid, topic text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM eventbox.amqp_destination_config c WHERE c.topic = _drop_amqp_destination.topic;
    IF NOT FOUND THEN
        PERFORM eventbox._http_error('42704', format('topic %s has no AMQP destination', coalesce(eventbox._quote(topic), 'NULL')),
            'See eventbox.amqp_destinations.');
    END IF;
END $$;

CREATE FUNCTION eventbox.create_amqp_destination(topic text, exchange text,
                                                 routing_key text DEFAULT NULL)
RETURNS void LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
CREATE FUNCTION eventbox.alter_amqp_destination(topic text, exchange text DEFAULT NULL,
                                                routing_key text DEFAULT NULL,
                                                use_message_key boolean DEFAULT false)
RETURNS void LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
CREATE FUNCTION eventbox.drop_amqp_destination(topic text)
RETURNS void LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
COMMENT ON FUNCTION eventbox.create_amqp_destination(text, text, text) IS
    'Publish the messages of a topic to a RabbitMQ exchange instead of Kafka';

REVOKE ALL ON TABLE eventbox.amqp_destination_config, eventbox.amqp_destinations FROM PUBLIC;
REVOKE ALL ON FUNCTION eventbox._check_amqp_destination(text, text, text),
    eventbox._create_amqp_destination(oid, text, text, text),
    eventbox._alter_amqp_destination(oid, text, text, text, boolean),
    eventbox._drop_amqp_destination(oid, text),
    eventbox.create_amqp_destination(text, text, text),
    eventbox.alter_amqp_destination(text, text, text, boolean),
    eventbox.drop_amqp_destination(text) FROM PUBLIC;
INSERT INTO eventbox._grant_names (name, kind, object)
VALUES ('create_amqp_destination', 'admin', 'function'),
       ('alter_amqp_destination', 'admin', 'function'),
       ('drop_amqp_destination', 'admin', 'function'),
       ('amqp_destinations', 'admin', 'table');

-- ---- 0.4.0: subscriptions that consume RabbitMQ (source) ----
-- A subscription reads Kafka topics (source 'kafka') or RabbitMQ queues and streams (source
-- 'amqp', eventbox.amqp_url): its topics are then queue names. The subscription API takes it as
-- `source`: the functions are created again in the next section.
ALTER TABLE eventbox.subscriptions
    ADD COLUMN source text NOT NULL DEFAULT 'kafka',
    ADD CONSTRAINT subscriptions_source_check CHECK (source IN ('kafka', 'amqp'));

-- A subscription's source; raises 22023 with a hint. A RabbitMQ queue keeps no history to
-- backfill from.
CREATE FUNCTION eventbox._check_subscription_source(source text, backfill boolean)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF source IS NULL OR source NOT IN ('kafka', 'amqp') THEN
        RAISE EXCEPTION 'invalid source: %', coalesce(eventbox._quote(source), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use ''kafka'' (topics) or ''amqp'' (RabbitMQ queues and streams, '
                         'eventbox.amqp_url).';
    END IF;
    IF source = 'amqp' AND backfill THEN
        RAISE EXCEPTION 'backfill is not supported for source ''amqp'''
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Consume the stream from start_from ''earliest'' without backfill.';
    END IF;
END $$;
REVOKE ALL ON FUNCTION eventbox._check_subscription_source(text, boolean) FROM PUBLIC;

-- ---- 0.4.0: keep_raw, and message ids of change events ------------------------------------
-- Subscription option keep_raw: every record's value bytes kept in raw_payload (they are kept
-- anyway when the subscription has a dead-letter topic, or its values are not JSON), and the
-- message_id_rule values 'debezium' and 'cockroachdb'. The API functions get `source`
-- (previous section) and keep_raw as their last parameters: they are created again, and the
-- EXECUTE grants given on the old ones are given on the new ones (as 0.2.0 did).
ALTER TABLE eventbox.subscriptions ADD COLUMN keep_raw boolean NOT NULL DEFAULT false;
ALTER TABLE eventbox.subscriptions DROP CONSTRAINT subscriptions_message_id_rule_check,
    ADD CONSTRAINT subscriptions_message_id_rule_check
        CHECK (message_id_rule IN ('default', 'fingerprint', 'debezium', 'cockroachdb'));

CREATE TABLE eventbox._upgrade_grants AS
SELECT p.proname::text AS fn, a.grantee::regrole::text AS grantee, a.is_grantable
  FROM pg_catalog.pg_proc p, LATERAL pg_catalog.aclexplode(p.proacl) a
 WHERE p.oid IN ('eventbox.create_subscription(text, text[], text, text, integer, interval, interval, text, text, integer, text, text[], text, text, text, boolean)'::regprocedure,
                 'eventbox.alter_subscription(text, text[], text, text, integer, interval, interval, text, text, integer, text, boolean, text[], text, text, text)'::regprocedure)
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0;

DROP FUNCTION eventbox.create_subscription(text, text[], text, text, integer, interval, interval,
                                           text, text, integer, text, text[], text, text, text,
                                           boolean);
DROP FUNCTION eventbox.alter_subscription(text, text[], text, text, integer, interval, interval,
                                          text, text, integer, text, boolean, text[], text, text,
                                          text);
DROP FUNCTION eventbox._create_subscription(oid, text, text[], text, text, integer, interval,
                                            interval, text, text, integer, text, text[], text,
                                            text, text, boolean);
DROP FUNCTION eventbox._alter_subscription(oid, text, text[], text, text, integer, interval,
                                           interval, text, text, integer, text, boolean, text[],
                                           text, text, text);

CREATE FUNCTION eventbox._create_subscription(
    caller oid, name text, topics text[], start_from text, ordering text, max_attempts integer,
    backoff interval, backoff_max interval, message_id_field text, unhandled text,
    batch_size integer, group_id text, non_retryable text[], on_dead text, dead_letter_topic text,
    message_id_rule text, backfill boolean, source text, keep_raw boolean)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    clean_topics text[];
    clean_codes text[];
BEGIN
    IF name IS NULL OR name !~ '^[A-Za-z0-9_.-]{1,63}$' THEN
        RAISE EXCEPTION 'invalid subscription name: %', coalesce(eventbox._quote(name), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use 1 to 63 letters, digits, ''_'', ''.'' or ''-''.';
    END IF;
    clean_topics := eventbox._check_subscription_options(topics, start_from, ordering,
        max_attempts, backoff, backoff_max, unhandled, batch_size);
    clean_codes := eventbox._check_dead_letter_options(non_retryable, on_dead, ordering,
        dead_letter_topic);
    IF group_id = '' THEN
        RAISE EXCEPTION 'group_id must not be empty' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass NULL to derive it from the database and subscription names.';
    END IF;
    IF message_id_rule IS NULL
       OR message_id_rule NOT IN ('default', 'fingerprint', 'debezium', 'cockroachdb') THEN
        RAISE EXCEPTION 'invalid message_id_rule: %', coalesce(eventbox._quote(message_id_rule), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use ''default'' (header message_id, ce_id, message_id_field, else '
                         'topic/partition/offset), ''fingerprint'' (SHA-256 of the canonical '
                         'payload), ''debezium'' or ''cockroachdb'' (the change event''s position).';
    END IF;
    IF message_id_field = '' THEN
        RAISE EXCEPTION 'message_id_field must not be empty'
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Pass NULL for none.';
    END IF;
    IF backfill IS NULL THEN
        RAISE EXCEPTION 'backfill must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass true to run the history in mode ''backfill'', false for ''live''.';
    END IF;
    IF keep_raw IS NULL THEN
        RAISE EXCEPTION 'keep_raw must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass true to keep every record''s value bytes in raw_payload, false to keep '
                   'them only when a dead-letter topic or the value''s format needs them.';
    END IF;
    IF backfill AND start_from <> 'earliest' THEN
        RAISE EXCEPTION 'backfill needs start_from ''earliest'''
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A subscription starting at ''latest'' reads no history to backfill.';
    END IF;
    PERFORM eventbox._check_subscription_source(source, backfill);
    BEGIN
        INSERT INTO eventbox.subscriptions (name, topics, owner, start_from, ordering,
            max_attempts, backoff, backoff_max, message_id_field, unhandled, batch_size, group_id,
            non_retryable, on_dead, dead_letter_topic, message_id_rule, backfill, source, keep_raw)
        VALUES (name, clean_topics, caller::regrole, start_from, ordering, max_attempts, backoff,
            backoff_max, message_id_field, unhandled, batch_size, group_id, clean_codes, on_dead,
            dead_letter_topic, message_id_rule, backfill, source, keep_raw);
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'subscription % already exists', eventbox._quote(name)
            USING ERRCODE = 'duplicate_object',
                  HINT = 'Use eventbox.alter_subscription() to change it.';
    END;
    PERFORM eventbox._notify_ingest();
END $$;

CREATE FUNCTION eventbox._alter_subscription(
    caller oid, name text, topics text[], start_from text, ordering text, max_attempts integer,
    backoff interval, backoff_max interval, message_id_field text, unhandled text,
    batch_size integer, group_id text, enabled boolean, non_retryable text[], on_dead text,
    dead_letter_topic text, message_id_rule text, source text, keep_raw boolean)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s eventbox.subscriptions;
    clean_topics text[];
    clean_codes text[];
BEGIN
    s := eventbox._managed_subscription(caller, name);
    clean_topics := eventbox._check_subscription_options(
        coalesce(topics, s.topics), coalesce(start_from, s.start_from),
        coalesce(ordering, s.ordering), coalesce(max_attempts, s.max_attempts),
        coalesce(backoff, s.backoff), coalesce(backoff_max, s.backoff_max),
        coalesce(unhandled, s.unhandled), coalesce(batch_size, s.batch_size));
    clean_codes := eventbox._check_dead_letter_options(
        coalesce(non_retryable, s.non_retryable), coalesce(on_dead, s.on_dead),
        coalesce(ordering, s.ordering),
        CASE WHEN dead_letter_topic IS NULL THEN s.dead_letter_topic
             ELSE nullif(dead_letter_topic, '') END);
    message_id_rule := coalesce(message_id_rule, s.message_id_rule);
    IF message_id_rule IS NULL
       OR message_id_rule NOT IN ('default', 'fingerprint', 'debezium', 'cockroachdb') THEN
        RAISE EXCEPTION 'invalid message_id_rule: %', coalesce(eventbox._quote(message_id_rule), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use ''default'' (header message_id, ce_id, message_id_field, else '
                         'topic/partition/offset), ''fingerprint'' (SHA-256 of the canonical '
                         'payload), ''debezium'' or ''cockroachdb'' (the change event''s position).';
    END IF;
    PERFORM eventbox._check_subscription_source(coalesce(source, s.source), s.backfill);
    UPDATE eventbox.subscriptions SET
        topics = clean_topics,
        start_from = coalesce(_alter_subscription.start_from, s.start_from),
        ordering = coalesce(_alter_subscription.ordering, s.ordering),
        max_attempts = coalesce(_alter_subscription.max_attempts, s.max_attempts),
        backoff = coalesce(_alter_subscription.backoff, s.backoff),
        backoff_max = coalesce(_alter_subscription.backoff_max, s.backoff_max),
        message_id_field = CASE WHEN _alter_subscription.message_id_field IS NULL
                                THEN s.message_id_field
                                ELSE nullif(_alter_subscription.message_id_field, '') END,
        unhandled = coalesce(_alter_subscription.unhandled, s.unhandled),
        batch_size = coalesce(_alter_subscription.batch_size, s.batch_size),
        group_id = CASE WHEN _alter_subscription.group_id IS NULL THEN s.group_id
                        ELSE nullif(_alter_subscription.group_id, '') END,
        enabled = coalesce(_alter_subscription.enabled, s.enabled),
        non_retryable = clean_codes,
        on_dead = coalesce(_alter_subscription.on_dead, s.on_dead),
        dead_letter_topic = CASE WHEN _alter_subscription.dead_letter_topic IS NULL
                                 THEN s.dead_letter_topic
                                 ELSE nullif(_alter_subscription.dead_letter_topic, '') END,
        message_id_rule = _alter_subscription.message_id_rule,
        source = coalesce(_alter_subscription.source, s.source),
        keep_raw = coalesce(_alter_subscription.keep_raw, s.keep_raw)
     WHERE subscriptions.name = s.name;
    -- Back to 'continue': the keys it held are released.
    IF coalesce(_alter_subscription.on_dead, s.on_dead) = 'continue' THEN
        DELETE FROM eventbox.key_blocks b WHERE b.subscription = s.name;
    END IF;
    PERFORM eventbox._notify_ingest();
END $$;

CREATE FUNCTION eventbox.create_subscription(
    name text, topics text[], start_from text DEFAULT 'earliest', ordering text DEFAULT 'partition',
    max_attempts integer DEFAULT 10, backoff interval DEFAULT '1 second',
    backoff_max interval DEFAULT '10 minutes', message_id_field text DEFAULT NULL,
    unhandled text DEFAULT 'ignore', batch_size integer DEFAULT 1000, group_id text DEFAULT NULL,
    non_retryable text[] DEFAULT '{22,23502,23514}', on_dead text DEFAULT 'continue',
    dead_letter_topic text DEFAULT NULL, message_id_rule text DEFAULT 'default',
    backfill boolean DEFAULT false, source text DEFAULT 'kafka', keep_raw boolean DEFAULT false)
RETURNS void
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';

CREATE FUNCTION eventbox.alter_subscription(
    name text, topics text[] DEFAULT NULL, start_from text DEFAULT NULL,
    ordering text DEFAULT NULL, max_attempts integer DEFAULT NULL, backoff interval DEFAULT NULL,
    backoff_max interval DEFAULT NULL, message_id_field text DEFAULT NULL,
    unhandled text DEFAULT NULL, batch_size integer DEFAULT NULL, group_id text DEFAULT NULL,
    enabled boolean DEFAULT NULL, non_retryable text[] DEFAULT NULL, on_dead text DEFAULT NULL,
    dead_letter_topic text DEFAULT NULL, message_id_rule text DEFAULT NULL,
    source text DEFAULT NULL, keep_raw boolean DEFAULT NULL)
RETURNS void
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';

COMMENT ON FUNCTION eventbox.alter_subscription(text, text[], text, text, integer, interval,
    interval, text, text, integer, text, boolean, text[], text, text, text, text, boolean) IS
    'Change a subscription''s options; NULL keeps an option (pass '''' to clear message_id_field, group_id or dead_letter_topic)';

REVOKE ALL ON FUNCTION
    eventbox._create_subscription(oid, text, text[], text, text, integer, interval, interval,
                                  text, text, integer, text, text[], text, text, text,
                                  boolean, text, boolean),
    eventbox._alter_subscription(oid, text, text[], text, text, integer, interval, interval,
                                 text, text, integer, text, boolean, text[], text, text, text,
                                 text, boolean),
    eventbox.create_subscription(text, text[], text, text, integer, interval, interval, text,
                                 text, integer, text, text[], text, text, text, boolean, text,
                                 boolean),
    eventbox.alter_subscription(text, text[], text, text, integer, interval, interval, text,
                                text, integer, text, boolean, text[], text, text, text, text,
                                boolean)
    FROM PUBLIC;

DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT * FROM eventbox._upgrade_grants LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION eventbox.%I(%s) TO %s%s', g.fn,
                       CASE g.fn
                       WHEN 'create_subscription' THEN 'text, text[], text, text, integer, interval, '
                           'interval, text, text, integer, text, text[], text, text, text, boolean, '
                           'text, boolean'
                       ELSE 'text, text[], text, text, integer, interval, interval, text, text, '
                           'integer, text, boolean, text[], text, text, text, text, boolean' END,
                       g.grantee, CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END $$;
DROP TABLE eventbox._upgrade_grants;

-- ---- 0.4.0: HTTP bulk requests, signed webhooks, rate limits, circuit breaker -------------
-- Bulk requests (up to batch_size messages a request, in one of the batch formats, each
-- message settled by its per-record result), Standard Webhooks signatures (signing_secrets,
-- write-only like the header values), rate limits (0: none) and a circuit breaker (0: none).
-- See docs/guide/http.md.
ALTER TABLE eventbox.http_destination_config
    ADD COLUMN batch_size integer NOT NULL DEFAULT 1,
    ADD COLUMN batch_wait interval NOT NULL DEFAULT '100 milliseconds',
    ADD COLUMN batch_format text NOT NULL DEFAULT 'json_array',
    ADD COLUMN signing_secrets text[] NOT NULL DEFAULT '{}',
    ADD COLUMN rate_limit double precision NOT NULL DEFAULT 0,
    ADD COLUMN rate_burst integer NOT NULL DEFAULT 1,
    ADD COLUMN max_messages_per_second double precision NOT NULL DEFAULT 0,
    ADD COLUMN breaker_failures integer NOT NULL DEFAULT 0,
    ADD COLUMN breaker_cooldown interval NOT NULL DEFAULT '30 seconds',
    ADD CONSTRAINT http_destination_batch_size_check CHECK (batch_size BETWEEN 1 AND 1000),
    ADD CONSTRAINT http_destination_batch_wait_check
        CHECK (batch_wait >= '0' AND batch_wait <= '1 minute'),
    ADD CONSTRAINT http_destination_batch_format_check
        CHECK (batch_format IN ('json_array', 'ndjson', 'sobject_collections')),
    ADD CONSTRAINT http_destination_signing_secrets_check
        CHECK (cardinality(signing_secrets) <= 2),
    ADD CONSTRAINT http_destination_rate_check
        CHECK (rate_limit BETWEEN 0 AND 100000 AND rate_burst BETWEEN 1 AND 100000
               AND max_messages_per_second BETWEEN 0 AND 1000000),
    ADD CONSTRAINT http_destination_breaker_check
        CHECK (breaker_failures BETWEEN 0 AND 1000
               AND breaker_cooldown >= '100 milliseconds' AND breaker_cooldown <= '1 hour');

-- The secrets are masked as their number.
CREATE OR REPLACE VIEW eventbox.http_destinations AS
SELECT c.topic, c.url, c.method,
       coalesce((SELECT jsonb_object_agg(h.name, '********')
                   FROM jsonb_object_keys(c.headers) AS h(name)), '{}'::jsonb) AS headers,
       c.timeout, c.max_in_flight, c.created_by, c.updated_at,
       c.batch_size, c.batch_wait, c.batch_format,
       cardinality(c.signing_secrets) AS signing_secrets,
       c.rate_limit, c.rate_burst, c.max_messages_per_second, c.breaker_failures,
       c.breaker_cooldown
  FROM eventbox.http_destination_config c;

-- The API functions get new last parameters: created again, with the EXECUTE grants given on
-- the old ones (e.g. to eventbox_http_admin) given on the new ones.
CREATE TABLE eventbox._upgrade_http_grants AS
SELECT p.proname::text AS fn, a.grantee::regrole::text AS grantee, a.is_grantable
  FROM pg_catalog.pg_proc p, LATERAL pg_catalog.aclexplode(p.proacl) a
 WHERE p.oid IN ('eventbox.create_http_destination(text, text, jsonb, text, interval, integer)'::regprocedure,
                 'eventbox.alter_http_destination(text, text, jsonb, text, interval, integer)'::regprocedure)
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0;
DROP FUNCTION eventbox.create_http_destination(text, text, jsonb, text, interval, integer);
DROP FUNCTION eventbox.alter_http_destination(text, text, jsonb, text, interval, integer);
DROP FUNCTION eventbox._create_http_destination(oid, text, text, jsonb, text, interval, integer);
DROP FUNCTION eventbox._alter_http_destination(oid, text, text, jsonb, text, interval, integer);
DROP FUNCTION eventbox._check_http_destination(text, text, jsonb, text, interval, integer);

-- signing_secret: one Standard Webhooks secret, or two separated by a space during a rotation;
-- '' removes them. Secrets are never echoed.
CREATE FUNCTION eventbox._http_signing_secrets(signing_secret text) RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    secrets text[] := coalesce(regexp_split_to_array(btrim(signing_secret, ' '), ' +'), '{}');
    s text;
BEGIN
    IF btrim(signing_secret, ' ') = '' THEN
        RETURN '{}';
    END IF;
    IF cardinality(secrets) > 2 THEN
        PERFORM eventbox._http_error('22023', 'signing_secret holds more than two secrets',
            'Pass one secret, or two separated by a space while rotating (the new one and the old one).');
    END IF;
    FOREACH s IN ARRAY secrets LOOP
        IF s !~ '^whsec_[A-Za-z0-9+/]+={0,2}$' OR (length(s) - 6) % 4 <> 0
           OR length(decode(substr(s, 7), 'base64')) NOT BETWEEN 24 AND 64 THEN
            PERFORM eventbox._http_error('22023', 'signing_secret is not a Standard Webhooks secret',
                'A secret is ''whsec_'' followed by the base64 of 24 to 64 random bytes, e.g. ''whsec_'' || encode(gen_random_bytes(32), ''base64'') with pgcrypto.');
        END IF;
    END LOOP;
    RETURN secrets;
END $$;

CREATE FUNCTION eventbox._check_http_destination(topic text, url text, headers jsonb, method text,
                                                 timeout interval, max_in_flight integer,
                                                 batch_size integer, batch_wait interval,
                                                 batch_format text, rate_limit double precision,
                                                 rate_burst integer,
                                                 max_messages_per_second double precision,
                                                 breaker_failures integer,
                                                 breaker_cooldown interval)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    h record;
BEGIN
    IF topic IS NULL THEN
        PERFORM eventbox._http_error('22004', 'topic must not be NULL',
            'Pass the topic whose messages go to this URL.');
    END IF;
    IF topic !~ '^[A-Za-z0-9._-]{1,249}$' OR topic IN ('.', '..') THEN
        PERFORM eventbox._http_error('22023', format('invalid topic name %s', eventbox._quote(topic)),
            'Kafka topic names are 1 to 249 characters of letters, digits, ''.'', ''_'' and ''-''.');
    END IF;
    -- The URL's text is not echoed: it may carry a token in its query string.
    IF url IS NULL OR url !~* '^https?://[^/?#@[:space:]]+([/?#][^[:space:][:cntrl:]]*)?$' THEN
        PERFORM eventbox._http_error('22023', 'url must be an http:// or https:// URL with a host',
            'E.g. ''https://crm.example.com/api/invoices''; no spaces or control characters, no user:password@ (put credentials in headers).');
    END IF;
    IF length(url) > 2048 THEN
        PERFORM eventbox._http_error('22023', 'url is longer than 2048 characters',
            'Use a shorter URL.');
    END IF;
    IF method IS NULL OR method NOT IN ('POST', 'PUT', 'PATCH') THEN
        PERFORM eventbox._http_error('22023', 'method must be POST, PUT or PATCH',
            'The message is the request body.');
    END IF;
    IF timeout IS NULL OR timeout < '100 milliseconds' OR timeout > '1 hour' THEN
        PERFORM eventbox._http_error('22023', 'timeout must be between 100 milliseconds and 1 hour',
            'It bounds one request, connection included; e.g. ''10 seconds''.');
    END IF;
    IF max_in_flight IS NULL OR max_in_flight NOT BETWEEN 1 AND 1000 THEN
        PERFORM eventbox._http_error('22023', 'max_in_flight must be between 1 and 1000',
            'It is the number of requests open at a time, e.g. 32.');
    END IF;
    IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 1000 THEN
        PERFORM eventbox._http_error('22023', 'batch_size must be between 1 and 1000',
            'It is the most messages one request carries; 1 sends each message as its own request.');
    END IF;
    IF batch_wait IS NULL OR batch_wait < '0' OR batch_wait > '1 minute' THEN
        PERFORM eventbox._http_error('22023', 'batch_wait must be between 0 and 1 minute',
            'It is how long a bulk request that is not full waits for more messages, e.g. ''100 milliseconds''.');
    END IF;
    IF batch_format IS NULL OR batch_format NOT IN ('json_array', 'ndjson', 'sobject_collections') THEN
        PERFORM eventbox._http_error('22023', format('invalid batch_format %s', coalesce(eventbox._quote(batch_format), 'NULL')),
            'Use ''json_array'', ''ndjson'' or ''sobject_collections''.');
    END IF;
    IF rate_limit IS NULL OR NOT (rate_limit BETWEEN 0 AND 100000) THEN
        PERFORM eventbox._http_error('22023', 'rate_limit must be between 0 and 100000',
            'It is requests per second to this destination, e.g. 20; 0 for no limit.');
    END IF;
    IF rate_burst IS NULL OR rate_burst NOT BETWEEN 1 AND 100000 THEN
        PERFORM eventbox._http_error('22023', 'rate_burst must be between 1 and 100000',
            'It is how many requests may go at once after a quiet time, e.g. 1 (evenly spaced).');
    END IF;
    IF max_messages_per_second IS NULL OR NOT (max_messages_per_second BETWEEN 0 AND 1000000) THEN
        PERFORM eventbox._http_error('22023', 'max_messages_per_second must be between 0 and 1000000',
            'It bounds the messages per second over all requests, e.g. 500; 0 for no limit.');
    END IF;
    IF breaker_failures IS NULL OR breaker_failures NOT BETWEEN 0 AND 1000 THEN
        PERFORM eventbox._http_error('22023', 'breaker_failures must be between 0 and 1000',
            'It is the transient failures in a row that open the circuit breaker, e.g. 5; 0 for no breaker.');
    END IF;
    IF breaker_cooldown IS NULL OR breaker_cooldown < '100 milliseconds' OR breaker_cooldown > '1 hour' THEN
        PERFORM eventbox._http_error('22023', 'breaker_cooldown must be between 100 milliseconds and 1 hour',
            'It is how long an open breaker sends nothing before one probe request, e.g. ''30 seconds''.');
    END IF;
    IF headers IS NULL OR jsonb_typeof(headers) <> 'object' THEN
        PERFORM eventbox._http_error('22023', 'headers must be a JSON object',
            'Pass a flat object of strings, e.g. ''{"Authorization": "Bearer ..."}''.');
    END IF;
    -- Names are echoed, values never (they are credentials).
    FOR h IN SELECT e.key, e.value FROM jsonb_each(headers) e LOOP
        IF h.key !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' OR length(h.key) > 256 THEN
            PERFORM eventbox._http_error('22023', format('invalid HTTP header name %s', eventbox._quote(h.key)),
            'Header names are HTTP tokens: letters, digits and !#$%&''*+.^_`|~-.');
        END IF;
        IF lower(h.key) IN ('idempotency-key', 'content-length', 'transfer-encoding', 'host',
                            'connection', 'expect', 'te', 'upgrade', 'trailer', 'keep-alive',
                            'webhook-id', 'webhook-timestamp', 'webhook-signature')
           OR lower(h.key) LIKE 'eventbox-%' THEN
            PERFORM eventbox._http_error('22023', format('header %s is set by the relay', eventbox._quote(h.key)),
            'Idempotency-Key, Eventbox-*, webhook-* (signing_secret) and the framing headers cannot be configured.');
        END IF;
        IF jsonb_typeof(h.value) <> 'string' THEN
            PERFORM eventbox._http_error('22023', format('value of header %s is not a string', eventbox._quote(h.key)),
            'Headers must be a flat JSON object of string values.');
        END IF;
        IF (h.value #>> '{}') ~ '[\x01-\x08\x0a-\x1f\x7f]' THEN
            PERFORM eventbox._http_error('22023', format('value of header %s contains a control character', eventbox._quote(h.key)),
            'Header values may not contain CR, LF or other control characters (tab is allowed).');
        END IF;
    END LOOP;
END $$;

CREATE FUNCTION eventbox._create_http_destination(caller oid, topic text, url text, headers jsonb,
                                                  method text, timeout interval,
                                                  max_in_flight integer, batch_size integer,
                                                  batch_wait interval, batch_format text,
                                                  signing_secret text,
                                                  rate_limit double precision,
                                                  rate_burst integer,
                                                  max_messages_per_second double precision,
                                                  breaker_failures integer,
                                                  breaker_cooldown interval)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    secrets text[];
BEGIN
    PERFORM eventbox._check_http_admin(caller);
    PERFORM eventbox._check_http_destination(topic, url, headers, upper(method), timeout,
                                             max_in_flight, batch_size, batch_wait,
                                             lower(batch_format), rate_limit, rate_burst,
                                             max_messages_per_second, breaker_failures,
                                             breaker_cooldown);
    secrets := eventbox._http_signing_secrets(signing_secret);
    BEGIN
        INSERT INTO eventbox.http_destination_config (topic, url, method, headers, timeout,
                                                      max_in_flight, created_by, batch_size,
                                                      batch_wait, batch_format, signing_secrets,
                                                      rate_limit, rate_burst,
                                                      max_messages_per_second, breaker_failures,
                                                      breaker_cooldown)
        VALUES (topic, url, upper(method), headers, timeout, max_in_flight, caller::regrole,
                batch_size, batch_wait, lower(batch_format), secrets, rate_limit, rate_burst,
                max_messages_per_second, breaker_failures, breaker_cooldown);
    EXCEPTION WHEN unique_violation THEN
        PERFORM eventbox._http_error('42710', format('topic %s has an HTTP destination already', eventbox._quote(topic)),
            'Use eventbox.alter_http_destination() to change it.');
    END;
END $$;

CREATE FUNCTION eventbox._alter_http_destination(caller oid, topic text, url text, headers jsonb,
                                                 method text, timeout interval,
                                                 max_in_flight integer, batch_size integer,
                                                 batch_wait interval, batch_format text,
                                                 signing_secret text,
                                                 rate_limit double precision,
                                                 rate_burst integer,
                                                 max_messages_per_second double precision,
                                                 breaker_failures integer,
                                                 breaker_cooldown interval)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    d eventbox.http_destination_config;
BEGIN
    PERFORM eventbox._check_http_admin(caller);
    SELECT * INTO d FROM eventbox.http_destination_config c
     WHERE c.topic = _alter_http_destination.topic FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM eventbox._http_error('42704', format('topic %s has no HTTP destination', coalesce(eventbox._quote(topic), 'NULL')),
            'See eventbox.http_destinations; create one with eventbox.create_http_destination().');
    END IF;
    d.url := coalesce(url, d.url);
    d.headers := coalesce(headers, d.headers);
    d.method := coalesce(upper(method), d.method);
    d.timeout := coalesce(timeout, d.timeout);
    d.max_in_flight := coalesce(max_in_flight, d.max_in_flight);
    d.batch_size := coalesce(batch_size, d.batch_size);
    d.batch_wait := coalesce(batch_wait, d.batch_wait);
    d.batch_format := coalesce(lower(batch_format), d.batch_format);
    d.rate_limit := coalesce(rate_limit, d.rate_limit);
    d.rate_burst := coalesce(rate_burst, d.rate_burst);
    d.max_messages_per_second := coalesce(max_messages_per_second, d.max_messages_per_second);
    d.breaker_failures := coalesce(breaker_failures, d.breaker_failures);
    d.breaker_cooldown := coalesce(breaker_cooldown, d.breaker_cooldown);
    PERFORM eventbox._check_http_destination(d.topic, d.url, d.headers, d.method,
                                             d.timeout, d.max_in_flight, d.batch_size,
                                             d.batch_wait, d.batch_format, d.rate_limit,
                                             d.rate_burst, d.max_messages_per_second,
                                             d.breaker_failures, d.breaker_cooldown);
    IF signing_secret IS NOT NULL THEN
        d.signing_secrets := eventbox._http_signing_secrets(signing_secret);
    END IF;
    UPDATE eventbox.http_destination_config c
       SET url = d.url, headers = d.headers, method = d.method, timeout = d.timeout,
           max_in_flight = d.max_in_flight, batch_size = d.batch_size,
           batch_wait = d.batch_wait, batch_format = d.batch_format,
           signing_secrets = d.signing_secrets, rate_limit = d.rate_limit,
           rate_burst = d.rate_burst, max_messages_per_second = d.max_messages_per_second,
           breaker_failures = d.breaker_failures, breaker_cooldown = d.breaker_cooldown,
           updated_at = now()
     WHERE c.topic = d.topic;
END $$;

CREATE FUNCTION eventbox.create_http_destination(
    topic text, url text, headers jsonb DEFAULT '{}', method text DEFAULT 'POST',
    timeout interval DEFAULT '10 seconds', max_in_flight integer DEFAULT 32,
    batch_size integer DEFAULT 1, batch_wait interval DEFAULT '100 milliseconds',
    batch_format text DEFAULT 'json_array', signing_secret text DEFAULT NULL,
    rate_limit double precision DEFAULT 0, rate_burst integer DEFAULT 1,
    max_messages_per_second double precision DEFAULT 0, breaker_failures integer DEFAULT 0,
    breaker_cooldown interval DEFAULT '30 seconds')
RETURNS void LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
CREATE FUNCTION eventbox.alter_http_destination(
    topic text, url text DEFAULT NULL, headers jsonb DEFAULT NULL, method text DEFAULT NULL,
    timeout interval DEFAULT NULL, max_in_flight integer DEFAULT NULL,
    batch_size integer DEFAULT NULL, batch_wait interval DEFAULT NULL,
    batch_format text DEFAULT NULL, signing_secret text DEFAULT NULL,
    rate_limit double precision DEFAULT NULL, rate_burst integer DEFAULT NULL,
    max_messages_per_second double precision DEFAULT NULL, breaker_failures integer DEFAULT NULL,
    breaker_cooldown interval DEFAULT NULL)
RETURNS void LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
COMMENT ON FUNCTION eventbox.create_http_destination(text, text, jsonb, text, interval, integer,
                                                     integer, interval, text, text,
                                                     double precision, integer, double precision, integer, interval) IS
    'Deliver the messages of a topic as HTTP requests to a URL instead of Kafka records';

REVOKE ALL ON FUNCTION eventbox._http_signing_secrets(text),
    eventbox._check_http_destination(text, text, jsonb, text, interval, integer, integer,
                                     interval, text, double precision, integer, double precision, integer, interval),
    eventbox._create_http_destination(oid, text, text, jsonb, text, interval, integer, integer,
                                      interval, text, text, double precision, integer, double precision, integer, interval),
    eventbox._alter_http_destination(oid, text, text, jsonb, text, interval, integer, integer,
                                     interval, text, text, double precision, integer, double precision, integer, interval),
    eventbox.create_http_destination(text, text, jsonb, text, interval, integer, integer,
                                     interval, text, text, double precision, integer, double precision, integer, interval),
    eventbox.alter_http_destination(text, text, jsonb, text, interval, integer, integer,
                                    interval, text, text, double precision, integer, double precision, integer, interval) FROM PUBLIC;
DO LANGUAGE plpgsql $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT * FROM eventbox._upgrade_http_grants LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION eventbox.%I(text, text, jsonb, text, interval, '
                       'integer, integer, interval, text, text, double precision, integer, '
                       'double precision, integer, interval) TO %s%s', g.fn, g.grantee,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END $$;
DROP TABLE eventbox._upgrade_http_grants;

-- The circuit breaker of each destination that has one, as the relay last published it.
CREATE FUNCTION eventbox.http_breakers(OUT topic text, OUT state text, OUT since timestamptz,
                                       OUT opened bigint, OUT half_opened bigint,
                                       OUT closed bigint)
RETURNS SETOF record
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'eventbox_http_breakers';
CREATE VIEW eventbox.http_breakers AS SELECT * FROM eventbox.http_breakers();
COMMENT ON VIEW eventbox.http_breakers IS
    'Circuit breakers of HTTP destinations: closed, open or half_open, and their transitions';
REVOKE ALL ON FUNCTION eventbox.http_breakers() FROM PUBLIC;
REVOKE ALL ON eventbox.http_breakers FROM PUBLIC;
INSERT INTO eventbox._grant_names (name, kind, object)
VALUES ('http_breakers', 'admin', 'function'), ('http_breakers', 'admin', 'table');

-- ---- 0.4.0: the end-to-end latency of messages sent by handlers ----
-- What eventbox.send() records of the inbox message whose handler (mode 'live') sends: its
-- subscription and received_at, for the relay's eventbox_e2e_seconds histogram. NULL for
-- messages sent outside a handler.
ALTER TABLE eventbox.outbox
    ADD COLUMN cause_subscription text,
    ADD COLUMN cause_received_at timestamptz;
COMMENT ON COLUMN eventbox.outbox.cause_subscription IS
    'Subscription of the inbox message whose handler sent this message (NULL outside handlers)';
COMMENT ON COLUMN eventbox.outbox.cause_received_at IS
    'received_at of the inbox message whose handler sent this message (NULL outside handlers)';

-- ---- 0.4.0: Schema Registry formats of subscriptions ----
-- value_format / key_format 'registry': values / keys are in the Confluent Schema Registry's
-- wire format, decoded into payload / key_payload by the ingest worker (docs/guide/formats.md).
ALTER TABLE eventbox.subscriptions ADD COLUMN value_format text NOT NULL DEFAULT 'json'
    CONSTRAINT subscriptions_value_format_check CHECK (value_format IN ('json', 'registry'));
ALTER TABLE eventbox.subscriptions ADD COLUMN key_format text NOT NULL DEFAULT 'json'
    CONSTRAINT subscriptions_key_format_check CHECK (key_format IN ('json', 'registry'));
-- The key decoded (key_format 'registry'); key keeps the producer's bytes.
ALTER TABLE eventbox.inbox ADD COLUMN key_payload jsonb;

CREATE FUNCTION eventbox._set_subscription_format(caller oid, subscription text,
    value_format text, key_format text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s eventbox.subscriptions;
BEGIN
    s := eventbox._managed_subscription(caller, subscription);
    key_format := coalesce(key_format, s.key_format);
    IF value_format IS NULL OR value_format NOT IN ('json', 'registry')
       OR key_format NOT IN ('json', 'registry') THEN
        RAISE EXCEPTION 'invalid value_format or key_format: %, %',
                coalesce(eventbox._quote(value_format), 'NULL'), eventbox._quote(key_format)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use ''json'' (JSON text; keys: bytes) or ''registry'' (the Schema '
                         'Registry wire format: Avro, Protobuf or JSON Schema).';
    END IF;
    UPDATE eventbox.subscriptions SET value_format = _set_subscription_format.value_format,
           key_format = _set_subscription_format.key_format
     WHERE subscriptions.name = s.name;
    PERFORM eventbox._notify_ingest();
END $$;

CREATE FUNCTION eventbox.set_subscription_format(subscription text, value_format text,
    key_format text DEFAULT NULL)
RETURNS void
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';

COMMENT ON FUNCTION eventbox.set_subscription_format(text, text, text) IS
    'Set the wire format of a subscription''s values and keys: json (default) or registry';

REVOKE ALL ON FUNCTION eventbox._set_subscription_format(oid, text, text, text),
    eventbox.set_subscription_format(text, text, text) FROM PUBLIC;

INSERT INTO eventbox._grant_names (name, kind, object)
VALUES ('set_subscription_format', 'admin', 'function');

-- ---- 0.4.0: Schema Registry formats of outbox topics ----
-- Messages sent to a topic listed here are encoded by the relay into the Schema Registry's wire
-- format with their subject's schema (docs/guide/formats.md). Its changes move the relay's route
-- generation, as HTTP destinations do: a row committed after a change is encoded by it.
CREATE TABLE eventbox.topic_formats (
    topic         text        PRIMARY KEY,
    value_format  text        NOT NULL CHECK (value_format IN ('json', 'registry')),
    value_subject text,
    value_version integer     CHECK (value_version >= 1),
    key_format    text        NOT NULL CHECK (key_format IN ('json', 'registry')),
    key_subject   text,
    key_version   integer     CHECK (key_version >= 1),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CHECK ((value_format = 'registry') = (value_subject IS NOT NULL)),
    CHECK ((key_format = 'registry') = (key_subject IS NOT NULL)),
    CHECK (value_format = 'registry' OR key_format = 'registry')
);
SELECT pg_catalog.pg_extension_config_dump('eventbox.topic_formats', '');
CREATE TRIGGER topic_formats_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON eventbox.topic_formats
    FOR EACH STATEMENT EXECUTE FUNCTION eventbox._http_destinations_trigger();

CREATE FUNCTION eventbox._set_topic_format(caller oid, topic text, value_format text,
    value_subject text, key_format text, key_subject text, value_version integer,
    key_version integer)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventbox._check_topic(topic);
    IF value_format IS NULL OR value_format NOT IN ('json', 'registry')
       OR key_format IS NULL OR key_format NOT IN ('json', 'registry') THEN
        RAISE EXCEPTION 'invalid value_format or key_format: %, %',
                coalesce(eventbox._quote(value_format), 'NULL'),
                coalesce(eventbox._quote(key_format), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use ''registry'' (the Schema Registry wire format) or ''json'' (as sent).';
    END IF;
    IF value_subject = '' OR key_subject = '' OR value_version < 1 OR key_version < 1 THEN
        RAISE EXCEPTION 'invalid subject or version'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass NULL for the subjects <topic>-value and <topic>-key, and NULL for '
                         'their latest versions.';
    END IF;
    IF value_format = 'json' AND key_format = 'json' THEN
        DELETE FROM eventbox.topic_formats f WHERE f.topic = _set_topic_format.topic;
        RETURN;
    END IF;
    INSERT INTO eventbox.topic_formats AS f (topic, value_format, value_subject, value_version,
        key_format, key_subject, key_version)
    VALUES (topic, value_format,
            CASE WHEN value_format = 'registry' THEN coalesce(value_subject, topic || '-value') END,
            CASE WHEN value_format = 'registry' THEN value_version END, key_format,
            CASE WHEN key_format = 'registry' THEN coalesce(key_subject, topic || '-key') END,
            CASE WHEN key_format = 'registry' THEN key_version END)
    ON CONFLICT ON CONSTRAINT topic_formats_pkey DO UPDATE
       SET value_format = excluded.value_format, value_subject = excluded.value_subject,
           value_version = excluded.value_version, key_format = excluded.key_format,
           key_subject = excluded.key_subject, key_version = excluded.key_version,
           updated_at = now();
END $$;

CREATE FUNCTION eventbox._reset_topic_format(caller oid, topic text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM eventbox.topic_formats f WHERE f.topic = _reset_topic_format.topic;
END $$;

CREATE FUNCTION eventbox.set_topic_format(topic text, value_format text,
    value_subject text DEFAULT NULL, key_format text DEFAULT 'json', key_subject text DEFAULT NULL,
    value_version integer DEFAULT NULL, key_version integer DEFAULT NULL)
RETURNS void
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';

CREATE FUNCTION eventbox.reset_topic_format(topic text)
RETURNS void
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';

COMMENT ON FUNCTION eventbox.set_topic_format(text, text, text, text, text, integer, integer) IS
    'Encode the messages of a topic into the Schema Registry wire format (registry formats)';
COMMENT ON FUNCTION eventbox.reset_topic_format(text) IS
    'Send the messages of a topic as given again (JSON text or bytes)';

REVOKE ALL ON eventbox.topic_formats FROM PUBLIC;
REVOKE ALL ON FUNCTION
    eventbox._set_topic_format(oid, text, text, text, text, text, integer, integer),
    eventbox._reset_topic_format(oid, text),
    eventbox.set_topic_format(text, text, text, text, text, integer, integer),
    eventbox.reset_topic_format(text) FROM PUBLIC;

INSERT INTO eventbox._grant_names (name, kind, object)
VALUES ('set_topic_format', 'admin', 'function'), ('reset_topic_format', 'admin', 'function'),
       ('topic_formats', 'admin', 'table');

-- Each change of 0.4.0 goes in its own section above this line, headed
-- "-- ---- 0.4.0: <what> ----", and the same objects in the full install script.

-- Last, as in every upgrade script: the recorded roles get this release's set.
SELECT eventbox._regrant();
