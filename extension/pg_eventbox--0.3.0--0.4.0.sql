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
