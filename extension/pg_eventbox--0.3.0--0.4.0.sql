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

-- Each change of 0.4.0 goes in its own section above this line, headed
-- "-- ---- 0.4.0: <what> ----", and the same objects in the full install script.

-- Last, as in every upgrade script: the recorded roles get this release's set.
SELECT eventbox._regrant();
