-- pg_eventbox 0.4.0 -> 0.5.0. Released scripts never change: every schema change of 0.5.0 is
-- made here and in pg_eventbox--0.5.0.sql, and the upgrade test proves both give the same schema.
\echo Use "ALTER EXTENSION pg_eventbox UPDATE TO '0.5.0'" to load this file. \quit

-- ---- 0.5.0: value_format, key_format and membership as subscription options ----
-- create_subscription() and alter_subscription() take the formats that set_subscription_format()
-- sets (docs/guide/formats.md), and membership: 'direct' (this server assigns itself every
-- partition) or 'group' (the servers holding a subscription of this name and group_id share its
-- partitions through a Kafka consumer group; docs/guide/scaling.md).
ALTER TABLE eventbox.subscriptions ADD COLUMN membership text NOT NULL DEFAULT 'direct'
    CONSTRAINT subscriptions_membership_check CHECK (membership IN ('direct', 'group'));

CREATE FUNCTION eventbox._check_subscription_formats(value_format text, key_format text,
                                                     membership text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF value_format IS NULL OR value_format NOT IN ('json', 'registry')
       OR key_format IS NULL OR key_format NOT IN ('json', 'registry') THEN
        RAISE EXCEPTION 'invalid value_format or key_format: %, %',
                coalesce(eventbox._quote(value_format), 'NULL'),
                coalesce(eventbox._quote(key_format), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use ''json'' (JSON text; keys: bytes) or ''registry'' (the Schema '
                         'Registry wire format: Avro, Protobuf or JSON Schema).';
    END IF;
    IF membership IS NULL OR membership NOT IN ('direct', 'group') THEN
        RAISE EXCEPTION 'invalid membership: %', coalesce(eventbox._quote(membership), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use ''direct'' (this server reads every partition) or ''group'' (the '
                         'servers with this subscription share its partitions in a Kafka '
                         'consumer group).';
    END IF;
END $$;
REVOKE ALL ON FUNCTION eventbox._check_subscription_formats(text, text, text) FROM PUBLIC;

-- One check of message_id_rule for create_subscription() and alter_subscription().
CREATE FUNCTION eventbox._check_message_id_rule(message_id_rule text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF message_id_rule IS NULL
       OR message_id_rule NOT IN ('default', 'fingerprint', 'debezium', 'cockroachdb') THEN
        RAISE EXCEPTION 'invalid message_id_rule: %', coalesce(eventbox._quote(message_id_rule), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use ''default'' (header message_id, ce_id, message_id_field, else '
                         'topic/partition/offset), ''fingerprint'' (SHA-256 of the canonical '
                         'payload), ''debezium'' or ''cockroachdb'' (the change event''s position).';
    END IF;
END $$;
REVOKE ALL ON FUNCTION eventbox._check_message_id_rule(text) FROM PUBLIC;

-- The API functions get the three options as their last parameters: they are created again, and
-- the EXECUTE grants given by hand on the old ones are given on the new ones.
CREATE TABLE eventbox._upgrade_grants AS
SELECT p.proname::text AS fn, a.grantee::regrole::text AS grantee, a.is_grantable
  FROM pg_catalog.pg_proc p, LATERAL pg_catalog.aclexplode(p.proacl) a
 WHERE p.pronamespace = 'eventbox'::regnamespace
   AND p.proname IN ('create_subscription', 'alter_subscription')
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0;

DROP FUNCTION eventbox.create_subscription(text, text[], text, text, integer, interval, interval,
                                           text, text, integer, text, text[], text, text, text,
                                           boolean, text, boolean);
DROP FUNCTION eventbox.alter_subscription(text, text[], text, text, integer, interval, interval,
                                          text, text, integer, text, boolean, text[], text, text,
                                          text, text, boolean);
DROP FUNCTION eventbox._create_subscription(oid, text, text[], text, text, integer, interval,
                                            interval, text, text, integer, text, text[], text,
                                            text, text, boolean, text, boolean);
DROP FUNCTION eventbox._alter_subscription(oid, text, text[], text, text, integer, interval,
                                           interval, text, text, integer, text, boolean, text[],
                                           text, text, text, text, boolean);

CREATE FUNCTION eventbox._create_subscription(
    caller oid, name text, topics text[], start_from text, ordering text, max_attempts integer,
    backoff interval, backoff_max interval, message_id_field text, unhandled text,
    batch_size integer, group_id text, non_retryable text[], on_dead text, dead_letter_topic text,
    message_id_rule text, backfill boolean, source text, keep_raw boolean, value_format text,
    key_format text, membership text)
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
    PERFORM eventbox._check_message_id_rule(message_id_rule);
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
    PERFORM eventbox._check_subscription_formats(value_format, key_format, membership);
    BEGIN
        INSERT INTO eventbox.subscriptions (name, topics, owner, start_from, ordering,
            max_attempts, backoff, backoff_max, message_id_field, unhandled, batch_size, group_id,
            non_retryable, on_dead, dead_letter_topic, message_id_rule, backfill, source, keep_raw,
            value_format, key_format, membership)
        VALUES (name, clean_topics, caller::regrole, start_from, ordering, max_attempts, backoff,
            backoff_max, message_id_field, unhandled, batch_size, group_id, clean_codes, on_dead,
            dead_letter_topic, message_id_rule, backfill, source, keep_raw, value_format,
            key_format, membership);
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
    dead_letter_topic text, message_id_rule text, source text, keep_raw boolean,
    value_format text, key_format text, membership text)
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
    PERFORM eventbox._check_message_id_rule(message_id_rule);
    PERFORM eventbox._check_subscription_source(coalesce(source, s.source), s.backfill);
    PERFORM eventbox._check_subscription_formats(coalesce(value_format, s.value_format),
        coalesce(key_format, s.key_format), coalesce(membership, s.membership));
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
        keep_raw = coalesce(_alter_subscription.keep_raw, s.keep_raw),
        value_format = coalesce(_alter_subscription.value_format, s.value_format),
        key_format = coalesce(_alter_subscription.key_format, s.key_format),
        membership = coalesce(_alter_subscription.membership, s.membership)
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
    backfill boolean DEFAULT false, source text DEFAULT 'kafka', keep_raw boolean DEFAULT false,
    value_format text DEFAULT 'json', key_format text DEFAULT 'json',
    membership text DEFAULT 'direct')
RETURNS void
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';

CREATE FUNCTION eventbox.alter_subscription(
    name text, topics text[] DEFAULT NULL, start_from text DEFAULT NULL,
    ordering text DEFAULT NULL, max_attempts integer DEFAULT NULL, backoff interval DEFAULT NULL,
    backoff_max interval DEFAULT NULL, message_id_field text DEFAULT NULL,
    unhandled text DEFAULT NULL, batch_size integer DEFAULT NULL, group_id text DEFAULT NULL,
    enabled boolean DEFAULT NULL, non_retryable text[] DEFAULT NULL, on_dead text DEFAULT NULL,
    dead_letter_topic text DEFAULT NULL, message_id_rule text DEFAULT NULL,
    source text DEFAULT NULL, keep_raw boolean DEFAULT NULL, value_format text DEFAULT NULL,
    key_format text DEFAULT NULL, membership text DEFAULT NULL)
RETURNS void
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';

COMMENT ON FUNCTION eventbox.alter_subscription(text, text[], text, text, integer, interval,
    interval, text, text, integer, text, boolean, text[], text, text, text, text, boolean, text,
    text, text) IS
    'Change a subscription''s options; NULL keeps an option (pass '''' to clear message_id_field, group_id or dead_letter_topic)';

REVOKE ALL ON FUNCTION
    eventbox._create_subscription(oid, text, text[], text, text, integer, interval, interval,
                                  text, text, integer, text, text[], text, text, text,
                                  boolean, text, boolean, text, text, text),
    eventbox._alter_subscription(oid, text, text[], text, text, integer, interval, interval,
                                 text, text, integer, text, boolean, text[], text, text, text,
                                 text, boolean, text, text, text),
    eventbox.create_subscription(text, text[], text, text, integer, interval, interval, text,
                                 text, integer, text, text[], text, text, text, boolean, text,
                                 boolean, text, text, text),
    eventbox.alter_subscription(text, text[], text, text, integer, interval, interval, text,
                                text, integer, text, boolean, text[], text, text, text, text,
                                boolean, text, text, text)
    FROM PUBLIC;

DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT * FROM eventbox._upgrade_grants LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s%s',
                       (SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
                         WHERE p.pronamespace = 'eventbox'::regnamespace AND p.proname = g.fn),
                       g.grantee, CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END $$;
DROP TABLE eventbox._upgrade_grants;

-- set_subscription_format() checks through the same function.
CREATE OR REPLACE FUNCTION eventbox._set_subscription_format(caller oid, subscription text,
    value_format text, key_format text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s eventbox.subscriptions;
BEGIN
    s := eventbox._managed_subscription(caller, subscription);
    key_format := coalesce(key_format, s.key_format);
    PERFORM eventbox._check_subscription_formats(value_format, key_format, s.membership);
    UPDATE eventbox.subscriptions SET value_format = _set_subscription_format.value_format,
           key_format = _set_subscription_format.key_format
     WHERE subscriptions.name = s.name;
    PERFORM eventbox._notify_ingest();
END $$;

-- ---- 0.5.0: inbox rows of up to 4 KB stay inline, neither compressed nor moved ----
-- A registry-format record stores its decoded value and its bytes (raw_payload): ~2 KB for a
-- 1 KiB record, past TOAST's 2 KB threshold, where every insert paid a pglz attempt on each
-- value and a TOAST table insert (43% of the ingest worker's CPU). Rows over 4 KB are still
-- compressed and moved out of line as before (bench/NOTEBOOK.md, issue 28).
ALTER TABLE eventbox.inbox SET (toast_tuple_target = 4096);

-- ---- 0.5.0: the headers of a record whose bytes are kept, exactly ----
-- inbox.raw_headers: every header as it came (order, repeated names, null values, bytes that
-- are not UTF-8), written where raw_payload holds the value's bytes; dead letters publish them
-- again as they were (docs/guide/dead-letters.md).
ALTER TABLE eventbox.inbox ADD COLUMN raw_headers bytea;

-- Each change of 0.5.0 goes in its own section above this line, headed
-- "-- ---- 0.5.0: <what> ----", and the same objects in the full install script.

-- Last, as in every upgrade script: the recorded roles get this release's set.
SELECT eventbox._regrant();
