-- pg_eventbox 0.6.0: transactional inbox and outbox for Kafka (full install script; upgrades from
-- 0.5.0 run pg_eventbox--0.5.0--0.6.0.sql, and the upgrade test proves both give the same schema).
\echo Use "CREATE EXTENSION pg_eventbox" to load this file. \quit

-- Nothing in this schema is usable by PUBLIC; eventbox.grant_writer() and grant_admin() give the
-- sets a role needs (docs/guide/security.md).
REVOKE ALL ON SCHEMA eventbox FROM PUBLIC;

-- One row per message to publish. The relay deletes a row when the broker acknowledges it
-- (eventbox.outbox_retention = 0) or marks it sent and purges it after the retention.
--
-- Ids come from next_outbox_id(), which publishes the writer's xid before drawing the id, and
-- the sequence keeps CACHE 1 so ids are handed out in allocation order across sessions: together
-- they let the relay find rows that commit late with a lower id (see src/outbox/relay_recheck.hpp).
CREATE SEQUENCE eventbox.outbox_id_seq AS bigint CACHE 1;

CREATE FUNCTION eventbox.next_outbox_id() RETURNS bigint
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'eventbox_next_outbox_id';

CREATE TABLE eventbox.outbox (
    id              bigint      NOT NULL DEFAULT eventbox.next_outbox_id() PRIMARY KEY,
    message_id      uuid        NOT NULL,
    topic           text        NOT NULL,
    key             bytea,
    payload         bytea,
    headers         jsonb       NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    status          text        NOT NULL DEFAULT 'pending',
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,
    sent_at         timestamptz,
    kafka_partition integer,
    kafka_offset    bigint,
    last_error      text,
    CONSTRAINT outbox_message_id_key UNIQUE (message_id),
    CONSTRAINT outbox_status_check CHECK (status IN ('pending', 'sent', 'failed')),
    CONSTRAINT outbox_attempts_check CHECK (attempts >= 0),
    CONSTRAINT outbox_headers_object CHECK (jsonb_typeof(headers) = 'object')
);
-- The relay's claim and recheck scans walk only pending rows, in id order.
ALTER SEQUENCE eventbox.outbox_id_seq OWNED BY eventbox.outbox.id;

CREATE INDEX outbox_pending_idx ON eventbox.outbox (id) WHERE status = 'pending';
-- Retention purge walks sent rows by age.
CREATE INDEX outbox_sent_idx ON eventbox.outbox (sent_at) WHERE status = 'sent';

-- Pending messages are business data: pg_dump must carry them.
SELECT pg_catalog.pg_extension_config_dump('eventbox.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('eventbox.outbox_id_seq', '');

COMMENT ON TABLE eventbox.outbox IS
    'Messages to publish to Kafka; published if and only if the inserting transaction commits';

CREATE VIEW eventbox.outbox_stats AS
SELECT status,
       count(*)                      AS messages,
       min(created_at)               AS oldest,
       max(attempts)                 AS max_attempts,
       count(*) FILTER (WHERE last_error IS NOT NULL) AS with_error
  FROM eventbox.outbox
 GROUP BY status;

-- send(): validated at call time, stored in the caller's transaction, relayed after COMMIT.
CREATE FUNCTION eventbox.send(topic text, payload jsonb, key text DEFAULT NULL,
                              headers jsonb DEFAULT '{}', message_id uuid DEFAULT NULL)
RETURNS uuid
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'eventbox_send_jsonb';

CREATE FUNCTION eventbox.send(topic text, payload bytea, key text DEFAULT NULL,
                              headers jsonb DEFAULT '{}', message_id uuid DEFAULT NULL)
RETURNS uuid
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'eventbox_send_bytea';

-- send() is SECURITY INVOKER and needs no search_path: it stores its row itself, by the
-- schema-qualified table, without checking the caller's privileges on it (EXECUTE on send() is
-- the privilege to queue a message); only a table given triggers or rules goes through an
-- INSERT, which it runs as the table's owner with search_path pinned to pg_catalog.
COMMENT ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid) IS
    'Queue a JSON message for Kafka; published if and only if the transaction commits';
COMMENT ON FUNCTION eventbox.send(text, bytea, text, jsonb, uuid) IS
    'Queue raw bytes for Kafka; published if and only if the transaction commits';

-- Running workers as seen by the launcher's shared state.
CREATE FUNCTION eventbox.workers(OUT pid integer, OUT role text, OUT state text,
                                 OUT last_activity timestamptz, OUT started_at timestamptz,
                                 OUT messages bigint, OUT errors bigint, OUT last_error text,
                                 OUT duplicates bigint, OUT transport_ids bigint)
RETURNS SETOF record
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'eventbox_workers';

CREATE VIEW eventbox.workers AS SELECT * FROM eventbox.workers();


-- ---------------------------------------------------------------------------------------------
-- Inbox: subscriptions, received messages and the offsets stored with them.
-- ---------------------------------------------------------------------------------------------

-- Who may change a subscription is checked against `owner`. The tables are written only by the
-- API functions below, which run as the extension owner after recording the calling role.
CREATE TABLE eventbox.subscriptions (
    name             text        PRIMARY KEY,
    topics           text[]      NOT NULL,
    owner            regrole     NOT NULL,
    start_from       text        NOT NULL DEFAULT 'earliest',
    ordering         text        NOT NULL DEFAULT 'partition',
    max_attempts     integer     NOT NULL DEFAULT 10,
    backoff          interval    NOT NULL DEFAULT '1 second',
    backoff_max      interval    NOT NULL DEFAULT '10 minutes',
    message_id_field text,
    unhandled        text        NOT NULL DEFAULT 'ignore',
    batch_size       integer     NOT NULL DEFAULT 1000,
    group_id         text,
    enabled          boolean     NOT NULL DEFAULT true,
    created_at       timestamptz NOT NULL DEFAULT now(),
    non_retryable    text[]      NOT NULL DEFAULT '{22,23502,23514}',
    on_dead          text        NOT NULL DEFAULT 'continue',
    dead_letter_topic text,
    message_id_rule  text        NOT NULL DEFAULT 'default',
    backfill         boolean     NOT NULL DEFAULT false,
    CONSTRAINT subscriptions_name_check CHECK (name ~ '^[A-Za-z0-9_.-]{1,63}$'),
    CONSTRAINT subscriptions_topics_check CHECK (cardinality(topics) > 0),
    CONSTRAINT subscriptions_start_from_check CHECK (start_from IN ('earliest', 'latest')),
    CONSTRAINT subscriptions_ordering_check CHECK (ordering IN ('partition', 'key', 'none')),
    CONSTRAINT subscriptions_unhandled_check CHECK (unhandled IN ('ignore', 'keep')),
    CONSTRAINT subscriptions_max_attempts_check CHECK (max_attempts >= 1),
    CONSTRAINT subscriptions_backoff_check CHECK (backoff > '0' AND backoff_max >= backoff),
    CONSTRAINT subscriptions_batch_size_check CHECK (batch_size BETWEEN 1 AND 100000),
    CONSTRAINT subscriptions_on_dead_check CHECK (on_dead IN ('continue', 'block_key')),
    CONSTRAINT subscriptions_message_id_rule_check
        CHECK (message_id_rule IN ('default', 'fingerprint', 'debezium', 'cockroachdb'))
);
SELECT pg_catalog.pg_extension_config_dump('eventbox.subscriptions', '');

-- One row per received message per subscription; payload is NULL when the bytes are not JSON,
-- and then raw_payload holds them: nothing is ever dropped.
CREATE TABLE eventbox.inbox (
    subscription    text        NOT NULL,
    message_id      text        NOT NULL,
    topic           text        NOT NULL,
    "partition"     integer     NOT NULL,
    "offset"        bigint      NOT NULL,
    key             bytea,
    headers         jsonb       NOT NULL DEFAULT '{}',
    payload         jsonb,
    raw_payload     bytea,
    event_type      text,
    status          text        NOT NULL DEFAULT 'received',
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,
    received_at     timestamptz NOT NULL DEFAULT now(),
    processed_at    timestamptz,
    last_error      text,
    mode            text        NOT NULL DEFAULT 'live',
    PRIMARY KEY (subscription, message_id) WITH (fillfactor = 50),
    CONSTRAINT inbox_status_check
        CHECK (status IN ('received', 'processed', 'retry', 'dead', 'ignored', 'unparsable')),
    CONSTRAINT inbox_mode_check CHECK (mode IN ('live', 'replay', 'backfill'))
) WITH (fillfactor = 50);
-- fillfactor: the room a handler pass needs for the new versions of a whole page of rows it
-- marks in one transaction (the old versions are dead only once it commits), on the rows' own
-- page: no index mentions a column an outcome changes (status, attempts, processed_at,
-- last_error; next_attempt_at only where a retry set it), so each mark is a HOT update without
-- index entries (docs/design/handlers.md, "A processed mark that touches no index"). Message
-- ids often ascend (UUIDv7, like eventbox.send()'s). B-tree leaf pages split inside the index
-- are split 50:50 and keep room for those entries; the index's rightmost page (the last
-- subscription's newest ids) is split at the fillfactor, 90 by default, and then every batch
-- of processed marks paid a bottom-up deletion or deduplication pass there (about 8% more CPU
-- per handled message at 200 B, 14% at 1 KiB, when that subscription is the only one). With 50
-- the last subscription is handled like the others. The price: REINDEX and restores build all
-- leaf pages half full.
SELECT pg_catalog.pg_extension_config_dump('eventbox.inbox', '');

-- Next offset to read per subscription and partition, written in the same transaction as the
-- inbox rows it covers. high_watermark is the broker's, as last seen by the ingest worker.
CREATE TABLE eventbox.offsets (
    subscription   text        NOT NULL,
    topic          text        NOT NULL,
    "partition"    integer     NOT NULL,
    next_offset    bigint      NOT NULL,
    high_watermark bigint,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    backfill_until bigint,
    PRIMARY KEY (subscription, topic, "partition")
);
SELECT pg_catalog.pg_extension_config_dump('eventbox.offsets', '');

-- The messages a handler worker's pass took in a lane, written (synchronously) before any of
-- them runs and emptied when the last of their outcomes commits. Whoever takes the lane next
-- and finds in it a message still waiting with the same attempts knows that its attempt was cut
-- short by a crash, and counts it. positions and running (0.6.0): each message's place in the
-- pass's run order, and the places of the run transaction in flight, moved by each run
-- transaction's commit; only the messages in that range count (docs/design/handlers.md,
-- "Claims"). A claim without them counts every message.
CREATE TABLE eventbox.handler_claims (
    subscription text    NOT NULL,
    topic        text    NOT NULL,
    "partition"  integer NOT NULL,
    message_ids  text[]  NOT NULL,
    attempts     integer[] NOT NULL,  -- each message's attempts before the pass ran it
    positions    integer[],
    running      int4range,
    PRIMARY KEY (subscription, topic, "partition")
);

CREATE VIEW eventbox.inbox_stats AS
SELECT subscription, status, count(*) AS messages, min(received_at) AS oldest,
       max(received_at) AS newest
  FROM eventbox.inbox
 GROUP BY subscription, status;

CREATE VIEW eventbox.lag AS
SELECT subscription, topic, "partition", next_offset, high_watermark,
       CASE WHEN high_watermark IS NOT NULL THEN greatest(high_watermark - next_offset, 0) END
           AS lag, updated_at
  FROM eventbox.offsets;

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

-- Internal helpers (not granted to anyone).
CREATE FUNCTION eventbox._check_topic(topic text) RETURNS void
LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'eventbox_check_topic';

-- A value quoted for an error message, control characters and malformed bytes escaped.
CREATE FUNCTION eventbox._quote(value text) RETURNS text
LANGUAGE c IMMUTABLE STRICT AS 'MODULE_PATHNAME', 'eventbox_quote';

CREATE FUNCTION eventbox._notify_ingest() RETURNS void
LANGUAGE c AS 'MODULE_PATHNAME', 'eventbox_notify_ingest';

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

-- Validates subscription options; raises 22023 with a hint.
CREATE FUNCTION eventbox._check_subscription_options(
    topics text[], start_from text, ordering text, max_attempts integer, backoff interval,
    backoff_max interval, unhandled text, batch_size integer)
RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t text;
BEGIN
    IF topics IS NULL OR cardinality(topics) = 0 THEN
        RAISE EXCEPTION 'topics must not be empty'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass the Kafka topics to consume, e.g. topics => ARRAY[''orders''].';
    END IF;
    FOREACH t IN ARRAY topics LOOP
        IF t IS NULL THEN
            RAISE EXCEPTION 'topics must not contain NULL'
                USING ERRCODE = 'null_value_not_allowed', HINT = 'Remove the NULL element.';
        END IF;
        PERFORM eventbox._check_topic(t);
    END LOOP;
    IF start_from IS NULL OR start_from NOT IN ('earliest', 'latest') THEN
        RAISE EXCEPTION 'invalid start_from: %', coalesce(eventbox._quote(start_from), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Use ''earliest'' or ''latest''.';
    END IF;
    IF ordering IS NULL OR ordering NOT IN ('partition', 'key', 'none') THEN
        RAISE EXCEPTION 'invalid ordering: %', coalesce(eventbox._quote(ordering), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use ''partition'', ''key'' or ''none''.';
    END IF;
    IF unhandled IS NULL OR unhandled NOT IN ('ignore', 'keep') THEN
        RAISE EXCEPTION 'invalid unhandled: %', coalesce(eventbox._quote(unhandled), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Use ''ignore'' or ''keep''.';
    END IF;
    IF max_attempts IS NULL OR max_attempts < 1 THEN
        RAISE EXCEPTION 'max_attempts must be at least 1'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'It counts handler attempts before a message goes dead, e.g. 10.';
    END IF;
    IF backoff IS NULL OR backoff <= '0' OR backoff_max IS NULL OR backoff_max < backoff THEN
        RAISE EXCEPTION 'backoff must be positive and backoff_max at least backoff'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'For example backoff => ''1 second'', backoff_max => ''10 minutes''.';
    END IF;
    IF backoff_max > '1 year' THEN
        RAISE EXCEPTION 'backoff_max must be at most 1 year'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A message waiting longer than that is better redriven by hand.';
    END IF;
    IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'batch_size must be between 1 and 100000'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'It is the number of records stored per transaction, e.g. 1000.';
    END IF;
    RETURN ARRAY(SELECT DISTINCT u FROM unnest(topics) u ORDER BY u);
END $$;

-- The subscription `name`, locked, after checking that `caller` may manage it.
CREATE FUNCTION eventbox._managed_subscription(caller oid, name text)
RETURNS eventbox.subscriptions
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s eventbox.subscriptions;
BEGIN
    SELECT * INTO s FROM eventbox.subscriptions WHERE subscriptions.name = _managed_subscription.name
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'subscription % does not exist', coalesce(eventbox._quote(name), 'NULL')
            USING ERRCODE = 'undefined_object',
                  HINT = 'Check the subscription name.';
    END IF;
    IF NOT pg_has_role(caller, s.owner::oid, 'USAGE') THEN
        RAISE EXCEPTION 'permission denied for subscription %', eventbox._quote(name)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('Only members of its owner role %s can change it.', s.owner);
    END IF;
    RETURN s;
END $$;

-- Validates the failure-workflow options of a subscription (non_retryable, on_dead,
-- dead_letter_topic); raises 22023 with a hint. Returns non_retryable cleaned up: upper case,
-- each code once, sorted.
CREATE FUNCTION eventbox._check_dead_letter_options(non_retryable text[], on_dead text,
                                                    ordering text, dead_letter_topic text)
RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    code text;
BEGIN
    IF non_retryable IS NULL THEN
        RAISE EXCEPTION 'non_retryable must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass ''{}'' to retry every error, or SQLSTATE codes and classes such as ''{22,23514}''.';
    END IF;
    FOREACH code IN ARRAY non_retryable LOOP
        IF code IS NULL OR upper(code) !~ '^[0-9A-Z]{2}([0-9A-Z]{3})?$' THEN
            RAISE EXCEPTION 'invalid SQLSTATE in non_retryable: %', coalesce(eventbox._quote(code), 'NULL')
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Use 5-character SQLSTATE codes (e.g. ''23514'') or 2-character classes (e.g. ''22'').';
        END IF;
    END LOOP;
    IF on_dead IS NULL OR on_dead NOT IN ('continue', 'block_key') THEN
        RAISE EXCEPTION 'invalid on_dead: %', coalesce(eventbox._quote(on_dead), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Use ''continue'' or ''block_key''.';
    END IF;
    IF on_dead = 'block_key' AND ordering = 'none' THEN
        RAISE EXCEPTION 'on_dead ''block_key'' needs ordering ''partition'' or ''key'''
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Ordering ''none'' keeps no order that a dead message could preserve.';
    END IF;
    IF dead_letter_topic IS NOT NULL THEN
        PERFORM eventbox._check_topic(dead_letter_topic);
    END IF;
    RETURN ARRAY(SELECT DISTINCT upper(c) FROM unnest(non_retryable) c ORDER BY 1);
END $$;

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

CREATE FUNCTION eventbox._drop_subscription(caller oid, name text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s eventbox.subscriptions;
BEGIN
    s := eventbox._managed_subscription(caller, name);
    DELETE FROM eventbox.handlers WHERE subscription = s.name;
    DELETE FROM eventbox.inbox WHERE subscription = s.name;
    DELETE FROM eventbox.offsets WHERE subscription = s.name;
    DELETE FROM eventbox.handler_claims WHERE subscription = s.name;
    DELETE FROM eventbox.key_blocks WHERE subscription = s.name;
    DELETE FROM eventbox.conflicts WHERE subscription = s.name;
    DELETE FROM eventbox.suppressed_sends WHERE subscription = s.name;
    DELETE FROM eventbox.inbox_positions WHERE subscription = s.name;
    DELETE FROM eventbox.subscriptions WHERE subscriptions.name = s.name;
    PERFORM eventbox._notify_ingest();
END $$;

-- The API: each runs eventbox._<name>(calling role, ...) as the extension owner.
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

CREATE FUNCTION eventbox.drop_subscription(name text)
RETURNS void
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';

COMMENT ON FUNCTION eventbox.alter_subscription(text, text[], text, text, integer, interval,
    interval, text, text, integer, text, boolean, text[], text, text, text, text, boolean, text,
    text, text) IS
    'Change a subscription''s options; NULL keeps an option (pass '''' to clear message_id_field, group_id or dead_letter_topic)';


-- ---------------------------------------------------------------------------------------------
-- Handlers: registered SQL functions run on inbox messages, and the operations on messages.
-- ---------------------------------------------------------------------------------------------

-- The identity handlers are stored by: the function's schema-qualified signature, resolved when
-- the handler is registered and again at every run. Not a regprocedure column: pg_upgrade refuses
-- those, and a dump would restore it only if the function kept its OID.
CREATE FUNCTION eventbox._handler_signature(handler regprocedure) RETURNS text
LANGUAGE sql STABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
    SELECT format('%I.%I(%s)', n.nspname, p.proname,
                  CASE WHEN p.proargtypes[0] = 'eventbox.inbox[]'::pg_catalog.regtype
                       THEN 'eventbox.inbox[]' ELSE 'eventbox.inbox' END)
      FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
     WHERE p.oid = handler
$$;

-- A handler is any function taking one eventbox.inbox row; it runs as run_as. registered_by is
-- kept so that authority can be checked again when the handler runs.
CREATE TABLE eventbox.handlers (
    subscription  text         NOT NULL,
    event_type    text,
    handler       text         NOT NULL,
    run_as        regrole      NOT NULL,
    registered_by regrole      NOT NULL,
    created_at    timestamptz  NOT NULL DEFAULT now(),
    CONSTRAINT handlers_unique UNIQUE NULLS NOT DISTINCT (subscription, event_type, handler)
);
SELECT pg_catalog.pg_extension_config_dump('eventbox.handlers', '');

-- Handler passes read each partition's messages that still need handling, in offset order,
-- from the lane's position (eventbox.inbox_positions): the live (and backfill) ones first, then
-- the replays eventbox.reprocess() queued, each an index range of its own (mode = 'replay' is
-- false, then true). Every row, whatever its status: an outcome changes no indexed column.
-- The topic leads, not the subscription: a statement that finds rows by (subscription,
-- message_id) is then never planned as a walk of this index over the subscription's rows (on a
-- small or never analyzed table the two looked equally cheap, and the ingest's conflicts check
-- walked a whole subscription per id).
CREATE INDEX inbox_todo_idx ON eventbox.inbox
    (topic, "partition", subscription, (mode = 'replay'), "offset");
-- With ordering 'key', the keys of a partition that wait for a retry, in the order they become
-- due: the handler workers read them in that order, which no other index gives. Only a retry
-- sets next_attempt_at (a processed or dead mark clears it).
CREATE INDEX inbox_retry_idx ON eventbox.inbox (subscription, topic, "partition", next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;

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

CREATE FUNCTION eventbox._unregister_handler(caller oid, subscription text, handler regprocedure,
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

-- The message `message_id` of `subscription`, locked, for an operation by `caller`.
CREATE FUNCTION eventbox._managed_message(caller oid, subscription text, message_id text)
RETURNS eventbox.inbox
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s eventbox.subscriptions;
    m eventbox.inbox;
BEGIN
    s := eventbox._managed_subscription(caller, subscription);
    SELECT * INTO m FROM eventbox.inbox i
     WHERE i.subscription = s.name AND i.message_id = _managed_message.message_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'message % of subscription % does not exist',
            coalesce(eventbox._quote(message_id), 'NULL'), eventbox._quote(s.name)
            USING ERRCODE = 'undefined_object', HINT = 'Check the message id.';
    END IF;
    RETURN m;
END $$;

CREATE FUNCTION eventbox._retry(caller oid, subscription text, message_id text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    m eventbox.inbox;
BEGIN
    m := eventbox._managed_message(caller, subscription, message_id);
    IF m.status = 'processed' THEN
        RAISE EXCEPTION 'message % was already processed', eventbox._quote(message_id)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Processed messages are not run again.';
    END IF;
    UPDATE eventbox.inbox i SET status = 'retry', attempts = 0, next_attempt_at = now()
     WHERE i.subscription = m.subscription AND i.message_id = m.message_id;
    PERFORM eventbox._notify_ingest();
END $$;

CREATE FUNCTION eventbox._redrive(caller oid, subscription text, event_type text)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s eventbox.subscriptions;
    n bigint;
BEGIN
    s := eventbox._managed_subscription(caller, subscription);
    UPDATE eventbox.inbox i SET status = 'retry', attempts = 0, next_attempt_at = now()
     WHERE i.subscription = s.name AND i.status = 'dead'
       AND (_redrive.event_type IS NULL OR i.event_type = _redrive.event_type);
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM eventbox._notify_ingest();
    RETURN n;
END $$;

CREATE FUNCTION eventbox._skip(caller oid, subscription text, message_id text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    m eventbox.inbox;
BEGIN
    m := eventbox._managed_message(caller, subscription, message_id);
    IF m.status NOT IN ('received', 'retry', 'dead', 'unparsable') THEN
        RAISE EXCEPTION 'message % is %, not waiting to be handled', eventbox._quote(message_id),
            m.status USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'Only received, retry, dead and unparsable messages can be skipped.';
    END IF;
    UPDATE eventbox.inbox i SET status = 'ignored', processed_at = now(), next_attempt_at = NULL,
           last_error = concat_ws('; ', i.last_error, format('skipped by %s', caller::regrole))
     WHERE i.subscription = m.subscription AND i.message_id = m.message_id;
    -- A message that waited for a retry held its key's later messages back, and the position
    -- may have passed them: they wait from its offset. The inbox's trigger does it too, but not
    -- in a handler worker (a handler's own code calling skip()), whose writes it leaves out.
    IF m.status IN ('received', 'retry') AND m.next_attempt_at IS NOT NULL THEN
        PERFORM eventbox._lower_position(m.subscription, m.topic, m."partition",
                                         m.mode = 'replay', m."offset");
    END IF;
    PERFORM eventbox._notify_ingest();
END $$;

CREATE FUNCTION eventbox._replay(caller oid, subscription text, topic text,
                                            "partition" integer, from_offset bigint)
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
    PERFORM eventbox._lower_position(s.name, topic, "partition", false, from_offset);
    PERFORM eventbox._notify_ingest();
END $$;

-- Runs handlers now, in the caller's session and transaction (the workers' code path).
-- Runs eventbox's own statements as the extension owner: never with the caller's search_path.
CREATE FUNCTION eventbox._process(caller oid, subscription text, max_messages integer)
RETURNS integer
LANGUAGE c SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', 'eventbox_process';

CREATE FUNCTION eventbox.register_handler(subscription text, handler regprocedure,
                                          event_type text DEFAULT NULL,
                                          run_as name DEFAULT current_user,
                                          batch boolean DEFAULT false)
RETURNS void LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
CREATE FUNCTION eventbox.unregister_handler(subscription text, handler regprocedure,
                                            event_type text DEFAULT NULL)
RETURNS void LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
CREATE FUNCTION eventbox.process(subscription text, max_messages integer DEFAULT 100)
RETURNS integer LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
CREATE FUNCTION eventbox.retry(subscription text, message_id text)
RETURNS void LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
CREATE FUNCTION eventbox.redrive(subscription text, event_type text DEFAULT NULL)
RETURNS bigint LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
CREATE FUNCTION eventbox.skip(subscription text, message_id text)
RETURNS void LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
CREATE FUNCTION eventbox.replay(subscription text, topic text, "partition" integer,
                                from_offset bigint)
RETURNS void LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';

-- ---------------------------------------------------------------------------------------------
-- Retention and metrics (0.2.0).
-- ---------------------------------------------------------------------------------------------

-- eventbox.inbox_retention and eventbox.dead_retention: the supervisor deletes processed and
-- ignored rows, and dead and unparsable ones, oldest first, a small batch per transaction,
-- walking this index in received_at order and testing status and processed_at on the row (an
-- index on either would make every processed mark write an index entry).
CREATE INDEX inbox_received_idx ON eventbox.inbox (received_at);

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

-- ---------------------------------------------------------------------------------------------
-- Failure workflow (0.2.0): dead messages that hold back their key (on_dead 'block_key').
-- ---------------------------------------------------------------------------------------------

-- One row per key a dead message holds back in its lane (topic, partition), written by the
-- handler pass in the transaction that marks the message dead. The later messages of that key
-- are not read by the passes while the message is dead (or waits for a retry after
-- eventbox.retry()/redrive()); the row goes once it is processed, skipped or deleted.
CREATE TABLE eventbox.key_blocks (
    subscription text        NOT NULL,
    topic        text        NOT NULL,
    "partition"  integer     NOT NULL,
    key          bytea       NOT NULL,
    message_id   text        NOT NULL,
    "offset"     bigint      NOT NULL,
    blocked_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subscription, topic, "partition", key)
);
CREATE UNIQUE INDEX key_blocks_message_idx ON eventbox.key_blocks (subscription, message_id);
SELECT pg_catalog.pg_extension_config_dump('eventbox.key_blocks', '');

CREATE VIEW eventbox.blocked_keys AS
SELECT b.subscription, b.topic, b."partition", b.key, b.message_id, b."offset", i.status,
       i.last_error AS error,
       (SELECT count(*) FROM eventbox.inbox h
         WHERE h.subscription = b.subscription AND h.topic = b.topic
           AND h."partition" = b."partition" AND h.status IN ('received', 'retry')
           AND h.key = b.key AND h.message_id <> b.message_id) AS held,
       b.blocked_at AS since
  FROM eventbox.key_blocks b
  JOIN eventbox.inbox i ON i.subscription = b.subscription AND i.message_id = b.message_id
 WHERE i.status IN ('dead', 'received', 'retry');

REVOKE ALL ON eventbox.key_blocks, eventbox.blocked_keys FROM PUBLIC;
REVOKE ALL ON FUNCTION eventbox._check_dead_letter_options(text[], text, text, text),
    eventbox._create_subscription(oid, text, text[], text, text, integer, interval, interval,
                                  text, text, integer, text, text[], text, text, text,
                                  boolean, text, boolean, text, text, text),
    eventbox._alter_subscription(oid, text, text[], text, text, integer, interval, interval,
                                 text, text, integer, text, boolean, text[], text, text, text,
                                 text, boolean, text, text, text),
    eventbox._drop_subscription(oid, text),
    eventbox.create_subscription(text, text[], text, text, integer, interval, interval, text,
                                 text, integer, text, text[], text, text, text, boolean, text,
                                 boolean, text, text, text),
    eventbox.alter_subscription(text, text[], text, text, integer, interval, interval, text,
                                text, integer, text, boolean, text[], text, text, text, text,
                                boolean, text, text, text),
    eventbox.drop_subscription(text)
    FROM PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- Message ids from content (message_id_rule) and conflicting duplicates (0.2.0).
-- ---------------------------------------------------------------------------------------------

-- Conflicting duplicates: a record whose message id was in the inbox already with another payload
-- (a producer reusing an id: a bug its users want to see). The stored row is kept; the record is
-- listed here once (stored_* is the row kept, topic/partition/offset the record that conflicted)
-- and counted by eventbox_ingest_conflicts_total. Rows go with their subscription.
CREATE TABLE eventbox.conflicts (
    subscription     text        NOT NULL,
    message_id       text        NOT NULL,
    stored_topic     text        NOT NULL,
    stored_partition integer     NOT NULL,
    stored_offset    bigint      NOT NULL,
    topic            text        NOT NULL,
    "partition"      integer     NOT NULL,
    "offset"         bigint      NOT NULL,
    detected_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subscription, topic, "partition", "offset")
);
SELECT pg_catalog.pg_extension_config_dump('eventbox.conflicts', '');

REVOKE ALL ON ALL TABLES IN SCHEMA eventbox FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA eventbox FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA eventbox FROM PUBLIC;

-- Bounded outbox: eventbox.dead_retention purges failed outbox rows too (the relay, oldest
-- first by created_at, a batch at a time).
CREATE INDEX outbox_failed_idx ON eventbox.outbox (created_at) WHERE status = 'failed';

-- ---------------------------------------------------------------------------------------------
-- HTTP destinations (0.2.0): messages sent to a topic that has one are delivered by the relay
-- as HTTP requests instead of Kafka records.
-- ---------------------------------------------------------------------------------------------

-- The whole configuration, request headers (credentials) included: no grants, so only
-- superusers (and the API functions, which run as the extension owner) can read it. Admins
-- read eventbox.http_destinations, which masks the header values.
CREATE TABLE eventbox.http_destination_config (
    topic         text        NOT NULL PRIMARY KEY,
    url           text        NOT NULL,
    method        text        NOT NULL DEFAULT 'POST',
    headers       jsonb       NOT NULL DEFAULT '{}',
    timeout       interval    NOT NULL DEFAULT '10 seconds',
    max_in_flight integer     NOT NULL DEFAULT 32,
    created_by    regrole     NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT http_destination_url_check CHECK (url ~ '^https?://'),
    CONSTRAINT http_destination_method_check CHECK (method IN ('POST', 'PUT', 'PATCH')),
    CONSTRAINT http_destination_headers_check CHECK (jsonb_typeof(headers) = 'object'),
    CONSTRAINT http_destination_timeout_check
        CHECK (timeout >= '100 milliseconds' AND timeout <= '1 hour'),
    CONSTRAINT http_destination_max_in_flight_check CHECK (max_in_flight BETWEEN 1 AND 1000)
);
SELECT pg_catalog.pg_extension_config_dump('eventbox.http_destination_config', '');

CREATE VIEW eventbox.http_destinations AS
SELECT c.topic, c.url, c.method,
       coalesce((SELECT jsonb_object_agg(h.name, '********')
                   FROM jsonb_object_keys(c.headers) AS h(name)), '{}'::jsonb) AS headers,
       c.timeout, c.max_in_flight, c.created_by, c.updated_at
  FROM eventbox.http_destination_config c;
COMMENT ON VIEW eventbox.http_destinations IS
    'HTTP destinations of outbox topics; header values masked (credentials)';

-- Bumps the relay's destination generation before the commit and wakes it after: rows sent
-- after the change committed are never routed by the old configuration.
CREATE FUNCTION eventbox._http_destinations_changed() RETURNS void
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_http_destinations_changed';
CREATE FUNCTION eventbox._http_destinations_trigger() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventbox._http_destinations_changed();
    RETURN NULL;
END $$;
CREATE TRIGGER http_destinations_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON eventbox.http_destination_config
    FOR EACH STATEMENT EXECUTE FUNCTION eventbox._http_destinations_trigger();

-- Raises the API's errors without PostgreSQL's "STATEMENT:" log line: the statement's text
-- may hold header values (credentials) as literals.
CREATE FUNCTION eventbox._http_error(code text, message text, hint text) RETURNS void
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_http_error';

-- A destination makes the server send requests to a URL: only superusers and members of the
-- role eventbox_http_admin (created and granted by a superuser, if at all) may manage them.
CREATE FUNCTION eventbox._check_http_admin(caller oid) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_roles r WHERE r.oid = caller)
       AND NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = 'eventbox_http_admin'
                          AND pg_has_role(caller, r.oid, 'MEMBER')) THEN
        PERFORM eventbox._http_error('42501', 'permission denied to manage HTTP destinations',
            'Only superusers and members of role eventbox_http_admin may: a destination makes the server send requests.');
    END IF;
END $$;

CREATE FUNCTION eventbox._check_http_destination(topic text, url text, headers jsonb, method text,
                                                 timeout interval, max_in_flight integer)
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
                            'connection', 'expect', 'te', 'upgrade', 'trailer', 'keep-alive')
           OR lower(h.key) LIKE 'eventbox-%' THEN
            PERFORM eventbox._http_error('22023', format('header %s is set by the relay', eventbox._quote(h.key)),
            'Idempotency-Key, Eventbox-* and the framing headers cannot be configured.');
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
                                                  max_in_flight integer)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventbox._check_http_admin(caller);
    PERFORM eventbox._check_http_destination(topic, url, headers, upper(method), timeout,
                                             max_in_flight);
    BEGIN
        INSERT INTO eventbox.http_destination_config (topic, url, method, headers, timeout,
                                                      max_in_flight, created_by)
        VALUES (topic, url, upper(method), headers, timeout, max_in_flight, caller::regrole);
    EXCEPTION WHEN unique_violation THEN
        PERFORM eventbox._http_error('42710', format('topic %s has an HTTP destination already', eventbox._quote(topic)),
            'Use eventbox.alter_http_destination() to change it.');
    END;
END $$;

CREATE FUNCTION eventbox._alter_http_destination(caller oid, topic text, url text, headers jsonb,
                                                 method text, timeout interval,
                                                 max_in_flight integer)
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
    PERFORM eventbox._check_http_destination(d.topic, d.url, d.headers, d.method,
                                             d.timeout, d.max_in_flight);
    UPDATE eventbox.http_destination_config c
       SET url = d.url, headers = d.headers, method = d.method, timeout = d.timeout,
           max_in_flight = d.max_in_flight, updated_at = now()
     WHERE c.topic = d.topic;
END $$;

CREATE FUNCTION eventbox._drop_http_destination(caller oid, topic text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventbox._check_http_admin(caller);
    DELETE FROM eventbox.http_destination_config c WHERE c.topic = _drop_http_destination.topic;
    IF NOT FOUND THEN
        PERFORM eventbox._http_error('42704', format('topic %s has no HTTP destination', coalesce(eventbox._quote(topic), 'NULL')),
            'See eventbox.http_destinations.');
    END IF;
END $$;

CREATE FUNCTION eventbox.create_http_destination(
    topic text, url text, headers jsonb DEFAULT '{}', method text DEFAULT 'POST',
    timeout interval DEFAULT '10 seconds', max_in_flight integer DEFAULT 32)
RETURNS void LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
CREATE FUNCTION eventbox.alter_http_destination(
    topic text, url text DEFAULT NULL, headers jsonb DEFAULT NULL, method text DEFAULT NULL,
    timeout interval DEFAULT NULL, max_in_flight integer DEFAULT NULL)
RETURNS void LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
CREATE FUNCTION eventbox.drop_http_destination(topic text)
RETURNS void LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
COMMENT ON FUNCTION eventbox.create_http_destination(text, text, jsonb, text, interval, integer) IS
    'Deliver the messages of a topic as HTTP requests to a URL instead of Kafka records';

REVOKE ALL ON TABLE eventbox.http_destination_config, eventbox.http_destinations FROM PUBLIC;
REVOKE ALL ON FUNCTION eventbox._http_destinations_changed(), eventbox._http_error(text, text, text), eventbox._http_destinations_trigger(),
    eventbox._check_http_admin(oid),
    eventbox._check_http_destination(text, text, jsonb, text, interval, integer),
    eventbox._create_http_destination(oid, text, text, jsonb, text, interval, integer),
    eventbox._alter_http_destination(oid, text, text, jsonb, text, interval, integer),
    eventbox._drop_http_destination(oid, text),
    eventbox.create_http_destination(text, text, jsonb, text, interval, integer),
    eventbox.alter_http_destination(text, text, jsonb, text, interval, integer),
    eventbox.drop_http_destination(text) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- Replay and backfill modes, suppressed sends, dry runs (0.2.0).
-- ---------------------------------------------------------------------------------------------

-- A message's queued replays are read through this index, after the live messages of its lane
-- (eventbox.reprocess() must not hold live traffic back); it holds only rows queued for a replay,
-- handled or not (from the replay range's position).
CREATE INDEX inbox_replay_idx ON eventbox.inbox (subscription, topic, "partition", "offset")
    WHERE mode = 'replay';

-- What send() did not publish because the handler ran in mode 'replay' or 'backfill': the
-- message columns of the outbox, the mode, and the inbox message whose handler sent it. Purged
-- with the inbox rows, after eventbox.inbox_retention (by created_at).
CREATE TABLE eventbox.suppressed_sends (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id   uuid        NOT NULL,
    topic        text        NOT NULL,
    key          bytea,
    payload      bytea,
    headers      jsonb       NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    mode         text        NOT NULL,
    subscription text        NOT NULL,
    caused_by    text        NOT NULL,
    CONSTRAINT suppressed_sends_mode_check CHECK (mode IN ('replay', 'backfill'))
);
CREATE INDEX suppressed_sends_created_idx ON eventbox.suppressed_sends (created_at);
CREATE INDEX suppressed_sends_cause_idx ON eventbox.suppressed_sends (subscription, caused_by);
SELECT pg_catalog.pg_extension_config_dump('eventbox.suppressed_sends', '');
SELECT pg_catalog.pg_extension_config_dump('eventbox.suppressed_sends_id_seq', '');

-- The mode of the handler run in progress ('live', 'replay' or 'backfill'); NULL outside one.
CREATE FUNCTION eventbox.current_mode()
RETURNS text
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_current_mode';

-- send() with a sixth argument, publish_in_replay: true publishes even from a handler running in
-- mode 'replay' or 'backfill'; false behaves like the five-argument send(). Every argument is
-- required (defaults would make five-argument calls ambiguous between the two).
CREATE FUNCTION eventbox.send(topic text, payload jsonb, key text, headers jsonb,
                              message_id uuid, publish_in_replay boolean)
RETURNS uuid
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_send_jsonb_in_replay';
CREATE FUNCTION eventbox.send(topic text, payload bytea, key text, headers jsonb,
                              message_id uuid, publish_in_replay boolean)
RETURNS uuid
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_send_bytea_in_replay';

-- Queues handled messages (processed, ignored or dead) to run again in mode 'replay'.
CREATE FUNCTION eventbox._reprocess(caller oid, subscription text, since timestamptz,
                                    until timestamptz, message_ids text[], event_type text)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s eventbox.subscriptions;
    n bigint;
BEGIN
    s := eventbox._managed_subscription(caller, subscription);
    IF since > until THEN
        RAISE EXCEPTION 'since (%) is after until (%)', since, until
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'since and until bound the messages'' received_at: since <= received_at < until.';
    END IF;
    IF array_position(message_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'message_ids must not contain NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass the ids of inbox messages, or NULL for every message.';
    END IF;
    UPDATE eventbox.inbox i
       SET status = 'received', mode = 'replay', attempts = 0, next_attempt_at = NULL,
           processed_at = NULL, last_error = NULL
     WHERE i.subscription = s.name AND i.status IN ('processed', 'ignored', 'dead')
       AND (_reprocess.since IS NULL OR i.received_at >= _reprocess.since)
       AND (_reprocess.until IS NULL OR i.received_at < _reprocess.until)
       AND (_reprocess.message_ids IS NULL OR i.message_id = ANY (_reprocess.message_ids))
       AND (_reprocess.event_type IS NULL OR i.event_type = _reprocess.event_type);
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM eventbox._notify_ingest();
    RETURN n;
END $$;

CREATE FUNCTION eventbox.reprocess(subscription text, since timestamptz DEFAULT NULL,
                                   until timestamptz DEFAULT NULL, message_ids text[] DEFAULT NULL,
                                   event_type text DEFAULT NULL)
RETURNS bigint
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
COMMENT ON FUNCTION eventbox.reprocess(text, timestamptz, timestamptz, text[], text) IS
    'Run the handlers again, in mode replay, on handled messages; returns how many were queued';

-- Runs the current handlers on inbox messages in the caller's session, each in a subtransaction
-- that is rolled back, and reports what they would have done.
CREATE FUNCTION eventbox.dry_run(subscription text, message_ids text[] DEFAULT NULL,
                                 since timestamptz DEFAULT NULL, max_messages integer DEFAULT 100,
                                 OUT message_id text, OUT outcome text, OUT sqlstate text,
                                 OUT error text, OUT tables jsonb, OUT sends jsonb)
RETURNS SETOF record
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_dry_run';

REVOKE ALL ON eventbox.suppressed_sends FROM PUBLIC;
REVOKE ALL ON FUNCTION eventbox.current_mode(),
    eventbox.send(text, jsonb, text, jsonb, uuid, boolean),
    eventbox.send(text, bytea, text, jsonb, uuid, boolean),
    eventbox._reprocess(oid, text, timestamptz, timestamptz, text[], text),
    eventbox.reprocess(text, timestamptz, timestamptz, text[], text),
    eventbox.dry_run(text, text[], timestamptz, integer)
    FROM PUBLIC;

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
CREATE FUNCTION eventbox._grant_set(kind text, OUT privilege text, OUT target text)
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

-- ---- 0.4.0: batch handlers -------------------------------------------------------------------
-- A batch handler (batch => true) is a function f(msgs eventbox.inbox[]) called once per chunk of
-- a lane's messages (docs/design/handlers.md, "Batch handlers").
ALTER TABLE eventbox.handlers ADD COLUMN batch boolean NOT NULL DEFAULT false;

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
-- `source` (create_subscription() and alter_subscription(), above).
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
-- anyway when the subscription has a dead-letter topic, or its values are not JSON). The
-- message_id_rule values 'debezium' and 'cockroachdb' are in the check of the table above.
ALTER TABLE eventbox.subscriptions ADD COLUMN keep_raw boolean NOT NULL DEFAULT false;

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
    PERFORM eventbox._check_subscription_formats(value_format, key_format, s.membership);
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

-- ---- 0.6.0: eventbox.truncate_outbox() empties the outbox ----
-- What TRUNCATE eventbox.outbox did, under a name that stays when the outbox becomes rotated
-- tables behind a view, which TRUNCATE cannot reach (docs/design/outbox-rotation.md). Every row
-- goes, pending ones unsent, except what the relay had already handed to a broker or an endpoint.
CREATE FUNCTION eventbox._truncate_outbox(caller oid)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    TRUNCATE eventbox.outbox;
END $$;

CREATE FUNCTION eventbox.truncate_outbox()
RETURNS void
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';

COMMENT ON FUNCTION eventbox.truncate_outbox() IS
    'Empty the outbox: every message, pending ones included, is removed unsent';

REVOKE ALL ON FUNCTION eventbox._truncate_outbox(oid), eventbox.truncate_outbox() FROM PUBLIC;

INSERT INTO eventbox._grant_names (name, kind, object)
VALUES ('truncate_outbox', 'admin', 'function');

-- ---- 0.6.0: the outbox as rotated tables behind a view ----
-- docs/design/outbox-rotation.md. Messages go into one of three tables in turn and are never
-- updated or deleted one by one; the relay settles them by position (outbox_state), keeps a row
-- per pass of what it acknowledged (outbox_acks_N), copies what fails or waits too long into
-- outbox_held, and truncates a table once all of it is settled. eventbox.outbox becomes a view
-- with the table's columns in the table's order; INSTEAD OF triggers keep INSERT, UPDATE and
-- DELETE on it working.
DO $$
DECLARE
    bad text;
BEGIN
    -- Triggers, rules and indexes users put on the table would be lost silently with it.
    SELECT string_agg(what, ', ' ORDER BY what) INTO bad FROM (
        SELECT format('trigger %I', t.tgname) FROM pg_trigger t
         WHERE t.tgrelid = 'eventbox.outbox'::regclass AND NOT t.tgisinternal
        UNION ALL
        SELECT format('rule %I', r.rulename) FROM pg_rewrite r
         WHERE r.ev_class = 'eventbox.outbox'::regclass
        UNION ALL
        SELECT format('index %I', c.relname) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         WHERE i.indrelid = 'eventbox.outbox'::regclass
           AND c.relname NOT IN ('outbox_pkey', 'outbox_message_id_key', 'outbox_pending_idx',
                                 'outbox_sent_idx', 'outbox_failed_idx')) f(what);
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'eventbox.outbox has objects the update does not know: %', bad
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'The outbox becomes a view over eventbox.outbox_rows_0, _1 and _2 '
                         '(docs/guide/upgrading.md): drop them, update, and create them again '
                         'on those tables.';
    END IF;
END $$;

-- The message columns, written once, never updated: no status, no partial index, nothing for
-- autovacuum to reclaim (TRUNCATE gives the space back and resets the freeze horizon).
CREATE TABLE eventbox.outbox_rows_0 (
    id                 bigint      NOT NULL PRIMARY KEY,
    message_id         uuid        NOT NULL UNIQUE,
    topic              text        NOT NULL,
    key                bytea,
    payload            bytea,
    headers            jsonb       NOT NULL,
    created_at         timestamptz NOT NULL,
    cause_subscription text,
    cause_received_at  timestamptz
) WITH (autovacuum_enabled = off, toast.autovacuum_enabled = off);
CREATE TABLE eventbox.outbox_rows_1 (LIKE eventbox.outbox_rows_0 INCLUDING ALL)
    WITH (autovacuum_enabled = off, toast.autovacuum_enabled = off);
CREATE TABLE eventbox.outbox_rows_2 (LIKE eventbox.outbox_rows_0 INCLUDING ALL)
    WITH (autovacuum_enabled = off, toast.autovacuum_enabled = off);

-- The relay's acknowledgements: one row per pass and rotated table, truncated with its table.
-- ids, partitions and offsets run in parallel (-1: no Kafka position, HTTP and AMQP); max_id is
-- the highest of ids, so that a reader looking for one id unnests only the rows that can hold it.
CREATE TABLE eventbox.outbox_acks_0 (
    acked_at   timestamptz NOT NULL,
    max_id     bigint      NOT NULL,
    ids        bigint[]    NOT NULL,
    partitions integer[]   NOT NULL,
    offsets    bigint[]    NOT NULL
) WITH (autovacuum_enabled = off, toast.autovacuum_enabled = off);
CREATE INDEX outbox_acks_0_max_id_idx ON eventbox.outbox_acks_0 (max_id);
-- The arrays are stored uncompressed (the tables below copy it): compressing them took 16% of
-- the relay's CPU (pglz, one ack row per pass), for rows that live only as long as their table.
ALTER TABLE eventbox.outbox_acks_0 ALTER COLUMN ids SET STORAGE EXTERNAL,
    ALTER COLUMN partitions SET STORAGE EXTERNAL, ALTER COLUMN offsets SET STORAGE EXTERNAL;
CREATE TABLE eventbox.outbox_acks_1 (LIKE eventbox.outbox_acks_0 INCLUDING ALL)
    WITH (autovacuum_enabled = off, toast.autovacuum_enabled = off);
CREATE TABLE eventbox.outbox_acks_2 (LIKE eventbox.outbox_acks_0 INCLUDING ALL)
    WITH (autovacuum_enabled = off, toast.autovacuum_enabled = off);

-- The rows that left the normal flow: failed once and waiting for a retry, given up (failed,
-- purged after eventbox.dead_retention), held in flight too long, changed or cancelled by a
-- user. A full copy of the message: it outlives the truncate of its rotated table.
CREATE TABLE eventbox.outbox_held (
    id                 bigint      NOT NULL PRIMARY KEY,
    message_id         uuid        NOT NULL,
    topic              text        NOT NULL,
    key                bytea,
    payload            bytea,
    headers            jsonb       NOT NULL,
    created_at         timestamptz NOT NULL,
    cause_subscription text,
    cause_received_at  timestamptz,
    status             text        NOT NULL DEFAULT 'pending',
    attempts           integer     NOT NULL DEFAULT 0,
    next_attempt_at    timestamptz,
    last_error         text,
    CONSTRAINT outbox_held_status_check CHECK (status IN ('pending', 'failed', 'cancelled')),
    CONSTRAINT outbox_held_attempts_check CHECK (attempts >= 0)
);
-- eventbox.dead_retention walks given-up rows by age.
CREATE INDEX outbox_held_failed_idx ON eventbox.outbox_held (created_at) WHERE status = 'failed';

-- One row per rotated table (n 0..2) and the relay's row (n = -1): settled_below (W: every row
-- of the rotated tables with a lower id is settled, except the ids in gaps), gaps (the
-- late-commit ranges still re-read, at most 64) and held_generation (moved by every change of
-- outbox_held, so the relay reloads its held ids only then). The table starts empty, which
-- reads as table 0 open, the others empty, W = 0: CREATE EXTENSION inserts no row, so the rows
-- a restore brings (pg_dump carries them) never collide with rows of the install.
CREATE TABLE eventbox.outbox_state (
    n               smallint    NOT NULL PRIMARY KEY,
    state           text,
    switched_xid    xid8,
    max_id          bigint,
    settled_at      timestamptz,
    settled_below   bigint,
    gaps            int8multirange,
    held_generation bigint,
    CONSTRAINT outbox_state_n_check CHECK (n BETWEEN -1 AND 2),
    CONSTRAINT outbox_state_kind_check CHECK (
        CASE WHEN n = -1
             THEN state IS NULL AND settled_below IS NOT NULL AND gaps IS NOT NULL
                  AND held_generation IS NOT NULL
             ELSE state IN ('open', 'closed', 'empty') AND settled_below IS NULL
                  AND gaps IS NULL AND held_generation IS NULL END)
);

-- Every row of the old table moves to outbox_rows_0, the open table. Pending rows that were
-- attempted and failed rows are also held (with their attempts and error); sent rows are one
-- ack row. No position is stored: W is 0 until the relay moves it (every row is then pending
-- unless an ack row or a held copy says otherwise).
INSERT INTO eventbox.outbox_rows_0
SELECT id, message_id, topic, key, payload, headers, created_at, cause_subscription,
       cause_received_at
  FROM eventbox.outbox;
INSERT INTO eventbox.outbox_held
SELECT id, message_id, topic, key, payload, headers, created_at, cause_subscription,
       cause_received_at, status, attempts, next_attempt_at, last_error
  FROM eventbox.outbox
 WHERE status = 'failed' OR (status = 'pending' AND attempts > 0);
INSERT INTO eventbox.outbox_acks_0
SELECT max(sent_at), max(id), array_agg(id ORDER BY id),
       array_agg(coalesce(kafka_partition, -1) ORDER BY id),
       array_agg(coalesce(kafka_offset, -1) ORDER BY id)
  FROM eventbox.outbox
 WHERE status = 'sent'
HAVING count(*) > 0;

DROP VIEW eventbox.outbox_stats;
ALTER SEQUENCE eventbox.outbox_id_seq OWNED BY NONE;
ALTER EXTENSION pg_eventbox DROP TABLE eventbox.outbox;
DROP TABLE eventbox.outbox;

-- The rotated tables and the ack tables as one relation each (the planner flattens them into an
-- append of the three tables' scans). row_xmin: the transaction that wrote the row version, whose
-- commit the relay makes sure is flushed before it publishes the row.
CREATE VIEW eventbox._outbox_rows AS
SELECT 0 AS n, *, xmin AS row_xmin FROM eventbox.outbox_rows_0
UNION ALL
SELECT 1, *, xmin FROM eventbox.outbox_rows_1
UNION ALL
SELECT 2, *, xmin FROM eventbox.outbox_rows_2;

CREATE VIEW eventbox._outbox_acks AS
SELECT 0 AS n, * FROM eventbox.outbox_acks_0
UNION ALL
SELECT 1, * FROM eventbox.outbox_acks_1
UNION ALL
SELECT 2, * FROM eventbox.outbox_acks_2;

-- The ids acknowledged at or above `low`: the relay checks the rows it reads below the highest
-- acknowledged id (a gap's, a retry's) against them, hashed once per statement (NOT IN). ROWS is
-- what makes the planner hash them whatever the ack tables hold: estimated from the tables, which
-- keep their ack rows as long as eventbox.outbox_retention, it planned a scan of every id per row
-- from about 300k ack rows on (docs/design/relay.md, "Late commits").
CREATE FUNCTION eventbox._acked_ids(low bigint) RETURNS SETOF bigint
LANGUAGE plpgsql STABLE ROWS 1000 SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT i FROM eventbox._outbox_acks a, unnest(a.ids) AS i
                  WHERE a.max_id >= low AND i >= low;
END
$$;

-- What users query: the old table's columns in its order. Three branches of one constant status
-- each, so that a status predicate prunes the others at planning:
-- - pending: rotated rows not settled (at or above W, or inside a gap), not held, not in an
--   ack row. The ids of the ack rows that can hold such an id (max_id at or above the lower of W
--   and the lowest gap) are unnested (in the select list: streamed, not stored per ack row), so
--   that the planner can anti-join them with the rows on the id, hashed once, when it expects
--   many rows (a count, a listing); when it expects few (a look-up by id, a filter it cannot
--   estimate) it probes from each row the ack rows above it, each array tested with = ANY before
--   it is unnested. Only probed, a count cost the rows W held back times the ack rows above
--   them: while a row waits behind its key's retry (up to twice eventbox.relay_sweep_interval)
--   every row after it is above W, and so is every pass's ack row
--   (docs/design/outbox-rotation.md, "The view's shape");
-- - held rows, pending or failed, with their columns (cancelled ones are not shown);
-- - sent: acknowledged rows while their ack row is within eventbox.outbox_retention (0 when the
--   library is not loaded; read with current_setting(), which whoever may read the view may
--   call: a function of the extension's would need EXECUTE granted to every such role).
CREATE VIEW eventbox.outbox AS
SELECT r.id, r.message_id, r.topic, r.key, r.payload, r.headers, r.created_at,
       'pending'::text AS status, 0 AS attempts, NULL::timestamptz AS next_attempt_at,
       NULL::timestamptz AS sent_at, NULL::integer AS kafka_partition,
       NULL::bigint AS kafka_offset, NULL::text AS last_error, r.cause_subscription,
       r.cause_received_at
  FROM eventbox._outbox_rows r
 WHERE r.id >= coalesce((SELECT least(s.settled_below, lower(s.gaps))
                            FROM eventbox.outbox_state s WHERE s.n = -1), 0)
   AND (r.id >= coalesce((SELECT s.settled_below FROM eventbox.outbox_state s WHERE s.n = -1), 0)
        OR (SELECT s.gaps FROM eventbox.outbox_state s WHERE s.n = -1) @> r.id)
   AND NOT EXISTS (SELECT FROM eventbox.outbox_held h WHERE h.id = r.id)
   AND NOT EXISTS (SELECT FROM eventbox._outbox_acks a, LATERAL (SELECT unnest(a.ids) AS id) u
                    WHERE a.max_id >= coalesce((SELECT least(s.settled_below, lower(s.gaps))
                                                  FROM eventbox.outbox_state s WHERE s.n = -1), 0)
                      AND a.max_id >= r.id AND r.id = ANY (a.ids) AND u.id = r.id)
UNION ALL
SELECT h.id, h.message_id, h.topic, h.key, h.payload, h.headers, h.created_at, h.status,
       h.attempts, h.next_attempt_at, NULL::timestamptz, NULL::integer, NULL::bigint,
       h.last_error, h.cause_subscription, h.cause_received_at
  FROM eventbox.outbox_held h
 WHERE h.status <> 'cancelled'
UNION ALL
SELECT r.id, r.message_id, r.topic, r.key, r.payload, r.headers, r.created_at, 'sent'::text,
       1, NULL::timestamptz, a.acked_at, nullif(u.partition, -1), nullif(u.kafka_offset, -1),
       NULL::text, r.cause_subscription, r.cause_received_at
  FROM eventbox._outbox_acks a
 CROSS JOIN LATERAL unnest(a.ids, a.partitions, a.offsets) AS u(id, partition, kafka_offset)
  JOIN eventbox._outbox_rows r ON r.id = u.id
 WHERE a.acked_at > now() - coalesce(nullif(pg_catalog.current_setting(
                                  'eventbox.outbox_retention', true), ''), '0')::interval
   AND NOT EXISTS (SELECT FROM eventbox.outbox_held h WHERE h.id = r.id);
-- What an INSERT without them gets (id is drawn by the trigger: an explicit one is refused).
ALTER VIEW eventbox.outbox ALTER COLUMN headers SET DEFAULT '{}';
ALTER VIEW eventbox.outbox ALTER COLUMN created_at SET DEFAULT now();
ALTER VIEW eventbox.outbox ALTER COLUMN status SET DEFAULT 'pending';
ALTER VIEW eventbox.outbox ALTER COLUMN attempts SET DEFAULT 0;

COMMENT ON VIEW eventbox.outbox IS
    'Messages to publish to Kafka; published if and only if the inserting transaction commits';
COMMENT ON COLUMN eventbox.outbox.cause_subscription IS
    'Subscription of the inbox message whose handler sent this message (NULL outside handlers)';
COMMENT ON COLUMN eventbox.outbox.cause_received_at IS
    'received_at of the inbox message whose handler sent this message (NULL outside handlers)';

-- The number of the open rotated table, read under a snapshot taken when it is called: after
-- next_outbox_id() assigned the writer's xid, so that a rotation committed later waits for it.
CREATE FUNCTION eventbox._outbox_open_table() RETURNS smallint
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'eventbox_outbox_open_table';

-- Whether message_id, just written into rotated table open_n, is in another rotated table
-- (23505 when it is), also among the rows of writers still running, whose outcome it waits for.
CREATE FUNCTION eventbox._outbox_unique_message_id(message_id uuid, open_n smallint) RETURNS void
LANGUAGE c VOLATILE STRICT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'eventbox_outbox_unique_message_id';

-- Moves outbox_held's generation (the relay's row is created when missing).
CREATE FUNCTION eventbox._outbox_held_changed() RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO eventbox.outbox_state AS s (n, settled_below, gaps, held_generation)
    VALUES (-1, 0, '{}', 1)
    ON CONFLICT (n) DO UPDATE SET held_generation = s.held_generation + 1
$$;

-- Checks a row given to the view as the old table's constraints did (23502, 23514, 23505).
CREATE FUNCTION eventbox._outbox_check_row(r eventbox.outbox, draw_id boolean)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF draw_id AND r.id IS NOT NULL THEN
        RAISE EXCEPTION 'an outbox row''s id cannot be given'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Leave id to its default: the id is drawn with the writer''s '
                         'transaction, which the relay needs to find rows that commit late.';
    END IF;
    IF r.message_id IS NULL OR r.topic IS NULL OR r.headers IS NULL OR r.created_at IS NULL
       OR r.status IS NULL OR r.attempts IS NULL THEN
        RAISE EXCEPTION 'null value in a NOT NULL column of relation "outbox"'
            USING ERRCODE = 'not_null_violation',
                  HINT = 'message_id, topic, headers, created_at, status and attempts are NOT NULL.';
    END IF;
    IF r.status NOT IN ('pending', 'sent', 'failed') THEN
        RAISE EXCEPTION 'new row for relation "outbox" violates check constraint "outbox_status_check"'
            USING ERRCODE = 'check_violation',
                  HINT = 'status is pending, sent or failed.';
    END IF;
    IF r.attempts < 0 THEN
        RAISE EXCEPTION 'new row for relation "outbox" violates check constraint "outbox_attempts_check"'
            USING ERRCODE = 'check_violation', HINT = 'attempts is 0 or more.';
    END IF;
    IF jsonb_typeof(r.headers) <> 'object' THEN
        RAISE EXCEPTION 'new row for relation "outbox" violates check constraint "outbox_headers_object"'
            USING ERRCODE = 'check_violation', HINT = 'headers is a JSON object.';
    END IF;
END $$;

-- INSERT INTO eventbox.outbox: into the open table (a row inserted as sent is settled at once:
-- an ack row; as failed, or with attempts, it is held too).
CREATE FUNCTION eventbox._outbox_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    open_n smallint;
BEGIN
    PERFORM eventbox._outbox_check_row(NEW, true);
    NEW.id := eventbox.next_outbox_id();  -- publishes the xid first, then the open table is read
    open_n := eventbox._outbox_open_table();
    EXECUTE format('INSERT INTO eventbox.outbox_rows_%s VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)',
                   open_n)
      USING NEW.id, NEW.message_id, NEW.topic, NEW.key, NEW.payload, NEW.headers, NEW.created_at,
            NEW.cause_subscription, NEW.cause_received_at;
    -- message_id is unique per table; a duplicate in another live table is looked for once the
    -- row is written (with the rows of writers still running: no lock per id).
    PERFORM eventbox._outbox_unique_message_id(NEW.message_id, open_n);
    IF NEW.status = 'sent' THEN
        EXECUTE format('INSERT INTO eventbox.outbox_acks_%s VALUES ($1, $2, ARRAY[$2], ARRAY[$3], '
                       'ARRAY[$4])', open_n)
          USING coalesce(NEW.sent_at, now()), NEW.id, coalesce(NEW.kafka_partition, -1),
                coalesce(NEW.kafka_offset, -1);
    ELSIF NEW.status = 'failed' OR NEW.attempts > 0 OR NEW.last_error IS NOT NULL
          OR NEW.next_attempt_at IS NOT NULL THEN
        INSERT INTO eventbox.outbox_held
        VALUES (NEW.id, NEW.message_id, NEW.topic, NEW.key, NEW.payload, NEW.headers,
                NEW.created_at, NEW.cause_subscription, NEW.cause_received_at, NEW.status,
                NEW.attempts, NEW.next_attempt_at, NEW.last_error);
        PERFORM eventbox._outbox_held_changed();
    END IF;
    RETURN NEW;
END $$;

-- UPDATE of a row: its new values are held (a held row is updated in place). A row changed to
-- sent is settled: an ack row, and out of outbox_held.
CREATE FUNCTION eventbox._outbox_update() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n_of smallint;
BEGIN
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.message_id IS DISTINCT FROM OLD.message_id THEN
        RAISE EXCEPTION 'an outbox row''s id and message_id cannot be changed'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Send a new message (eventbox.send()) and delete this one.';
    END IF;
    PERFORM eventbox._outbox_check_row(NEW, false);
    IF NEW.status = 'sent' THEN
        SELECT r.n INTO n_of FROM eventbox._outbox_rows r WHERE r.id = NEW.id;
        IF n_of IS NOT NULL THEN
            EXECUTE format('INSERT INTO eventbox.outbox_acks_%s VALUES ($1, $2, ARRAY[$2], '
                           'ARRAY[$3], ARRAY[$4])', n_of)
              USING coalesce(NEW.sent_at, now()), NEW.id, coalesce(NEW.kafka_partition, -1),
                    coalesce(NEW.kafka_offset, -1);
        END IF;
        DELETE FROM eventbox.outbox_held WHERE id = NEW.id;
    ELSE
        INSERT INTO eventbox.outbox_held AS h
        VALUES (NEW.id, NEW.message_id, NEW.topic, NEW.key, NEW.payload, NEW.headers,
                NEW.created_at, NEW.cause_subscription, NEW.cause_received_at, NEW.status,
                NEW.attempts, NEW.next_attempt_at, NEW.last_error)
        ON CONFLICT (id) DO UPDATE
           SET topic = EXCLUDED.topic, key = EXCLUDED.key, payload = EXCLUDED.payload,
               headers = EXCLUDED.headers, created_at = EXCLUDED.created_at,
               cause_subscription = EXCLUDED.cause_subscription,
               cause_received_at = EXCLUDED.cause_received_at, status = EXCLUDED.status,
               attempts = EXCLUDED.attempts, next_attempt_at = EXCLUDED.next_attempt_at,
               last_error = EXCLUDED.last_error;
    END IF;
    PERFORM eventbox._outbox_held_changed();
    RETURN NEW;
END $$;

-- DELETE of a row: a pending or failed row is cancelled (held as 'cancelled': never sent, not
-- shown, purged by the relay once below its settled position); a sent row cannot be deleted (its
-- ack row is the relay's), it leaves the view when the retention ends.
CREATE FUNCTION eventbox._outbox_delete() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF OLD.status = 'sent' THEN
        RAISE EXCEPTION 'a sent outbox row cannot be deleted'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Sent rows leave with their table, after eventbox.outbox_retention.';
    END IF;
    INSERT INTO eventbox.outbox_held AS h
    VALUES (OLD.id, OLD.message_id, OLD.topic, OLD.key, OLD.payload, OLD.headers,
            OLD.created_at, OLD.cause_subscription, OLD.cause_received_at, 'cancelled',
            OLD.attempts, NULL, OLD.last_error)
    ON CONFLICT (id) DO UPDATE SET status = 'cancelled';
    PERFORM eventbox._outbox_held_changed();
    RETURN OLD;
END $$;

CREATE TRIGGER outbox_insert INSTEAD OF INSERT ON eventbox.outbox
    FOR EACH ROW EXECUTE FUNCTION eventbox._outbox_insert();
CREATE TRIGGER outbox_update INSTEAD OF UPDATE ON eventbox.outbox
    FOR EACH ROW EXECUTE FUNCTION eventbox._outbox_update();
CREATE TRIGGER outbox_delete INSTEAD OF DELETE ON eventbox.outbox
    FOR EACH ROW EXECUTE FUNCTION eventbox._outbox_delete();

CREATE VIEW eventbox.outbox_stats AS
SELECT status,
       count(*)                      AS messages,
       min(created_at)               AS oldest,
       max(attempts)                 AS max_attempts,
       count(*) FILTER (WHERE last_error IS NOT NULL) AS with_error
  FROM eventbox.outbox
 GROUP BY status;

-- Emptied in one transaction: rows, acks and held rows; closed tables read as empty; W stays.
CREATE OR REPLACE FUNCTION eventbox._truncate_outbox(caller oid)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    TRUNCATE eventbox.outbox_rows_0, eventbox.outbox_rows_1, eventbox.outbox_rows_2,
             eventbox.outbox_acks_0, eventbox.outbox_acks_1, eventbox.outbox_acks_2,
             eventbox.outbox_held;
    -- W stays where the relay put it: a writer that drew its id before this truncate and writes
    -- its row after it (it holds no lock on the tables in between) must still be sent, and an id
    -- below W would read as settled.
    INSERT INTO eventbox.outbox_state AS s (n, settled_below, gaps, held_generation)
    VALUES (-1, 0, '{}', 1)
    ON CONFLICT (n) DO UPDATE SET held_generation = s.held_generation + 1;
    UPDATE eventbox.outbox_state SET state = 'empty', switched_xid = NULL, max_id = NULL,
                                     settled_at = NULL
     WHERE n >= 0 AND state <> 'open';
END $$;

-- Pending messages are business data: pg_dump carries the rows and the positions that go with
-- them, in one snapshot.
SELECT pg_catalog.pg_extension_config_dump('eventbox.outbox_rows_0', '');
SELECT pg_catalog.pg_extension_config_dump('eventbox.outbox_rows_1', '');
SELECT pg_catalog.pg_extension_config_dump('eventbox.outbox_rows_2', '');
SELECT pg_catalog.pg_extension_config_dump('eventbox.outbox_acks_0', '');
SELECT pg_catalog.pg_extension_config_dump('eventbox.outbox_acks_1', '');
SELECT pg_catalog.pg_extension_config_dump('eventbox.outbox_acks_2', '');
SELECT pg_catalog.pg_extension_config_dump('eventbox.outbox_held', '');
SELECT pg_catalog.pg_extension_config_dump('eventbox.outbox_state', '');

REVOKE ALL ON eventbox.outbox, eventbox.outbox_stats, eventbox._outbox_rows, eventbox._outbox_acks,
    eventbox.outbox_rows_0, eventbox.outbox_rows_1, eventbox.outbox_rows_2,
    eventbox.outbox_acks_0, eventbox.outbox_acks_1, eventbox.outbox_acks_2,
    eventbox.outbox_held, eventbox.outbox_state FROM PUBLIC;
REVOKE ALL ON FUNCTION eventbox._acked_ids(bigint), eventbox._outbox_open_table(),
    eventbox._outbox_unique_message_id(uuid, smallint),
    eventbox._outbox_held_changed(),
    eventbox._outbox_check_row(eventbox.outbox, boolean), eventbox._outbox_insert(),
    eventbox._outbox_update(), eventbox._outbox_delete() FROM PUBLIC;

-- ---- 0.6.0: rotation and truncation of the outbox tables ----
-- docs/design/outbox-rotation.md ("Writing: which table", "Truncating"). The relay opens the next
-- rotated table when the open one is older than eventbox.outbox_rotation_interval (or
-- eventbox.outbox_retention when longer): opened_at is when a table became the open one (NULL
-- for the others and for the relay's row).
ALTER TABLE eventbox.outbox_state ADD COLUMN opened_at timestamptz;
-- ---- 0.6.0: durable lane positions (issue 31) ----
-- Per lane (topic, partition) of a subscription and per range (live with backfill, replay), an
-- offset below which no inbox row waits to be handled (status 'received' or 'retry'): lane
-- reads and probes start there (docs/design/handlers.md, "Lane positions"). A handler worker's
-- pass raises it, in its last run transaction, past the leading messages it gave a final
-- outcome, when the version it read with the position is still the row's; whatever makes a row
-- wait below it, or releases rows a read left out below it, lowers it and moves the version in
-- its own transaction (the triggers below, replay() through _lower_position()).
-- Its updates change no indexed column: HOT, on a table of one row per lane and range.
CREATE TABLE eventbox.inbox_positions (
    subscription text    NOT NULL,
    topic        text    NOT NULL,
    "partition"  integer NOT NULL,
    replay       boolean NOT NULL,
    position     bigint  NOT NULL,
    version      bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (subscription, topic, "partition", replay)
) WITH (fillfactor = 50);
REVOKE ALL ON eventbox.inbox_positions FROM PUBLIC;

-- Announces to the handler workers, at commit, that inbox rows may wait below offsets they
-- passed: their low-water marks in memory are dropped (docs/design/handlers.md).
CREATE FUNCTION eventbox._inbox_requeued() RETURNS void
LANGUAGE c AS 'MODULE_PATHNAME', 'eventbox_inbox_requeued';

-- Lowers a lane range's position to `below` (if it is not lower already) and moves its version:
-- a pass that read the position before this commits does not raise it past the row that waits.
-- Once per transaction and range while the position is low enough (a redrive of many rows of a
-- lane writes one row version, not one per message).
CREATE FUNCTION eventbox._lower_position(subscription text, topic text, "partition" integer,
                                         replay boolean, below bigint)
RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO eventbox.inbox_positions AS p (subscription, topic, "partition", replay, position)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (subscription, topic, "partition", replay) DO UPDATE
       SET position = least(p.position, excluded.position), version = p.version + 1
     WHERE p.position > excluded.position OR p.xmin <> pg_current_xact_id()::xid;
    SELECT eventbox._inbox_requeued();
$$;

-- The inbox's triggers below leave alone what the extension's workers write themselves, by
-- eventbox.worker_role (a read-only setting each worker sets at its start, empty elsewhere; read
-- with current_setting(), which every role that writes the inbox may call). The ingest stores
-- at or above a lane's next offset to store, which a pass never raises a position past, and
-- lowers the positions itself in the rare batch stored below what it stored before
-- (_inbox_stored_below()); a pass's marks are the positions' own business
-- (docs/design/handlers.md, "Lane positions").

-- The ingest's batch that stores records below what its process stored before (a record read
-- again), or its first batch in a lane: each lane's position goes down to the batch's first
-- offset in it. Live range: the ingest stores live and backfill rows.
CREATE FUNCTION eventbox._inbox_stored_below(subscription text, topics text[],
                                             partitions integer[], offsets bigint[])
RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT count(eventbox._lower_position($1, u.topic, u."partition", false, u.first))
      FROM (SELECT t AS topic, p AS "partition", min(o) AS first
              FROM unnest($2, $3, $4) AS r(t, p, o) GROUP BY t, p) u;
$$;

-- A row that waits, or that held others back, for a reason the positions did not see: the
-- position of its range goes down to it (_lower_position()). The triggers' conditions are
-- checked before any call.
CREATE FUNCTION eventbox._inbox_requeued_row() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r eventbox.inbox;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    PERFORM eventbox._lower_position(r.subscription, r.topic, r."partition", r.mode = 'replay',
                                     r."offset");
    RETURN NULL;
END $$;
-- Rows inserted by hand (tests, tools, a consumer of one's own): one row trigger each, whose
-- write is once per transaction and range while the position is low enough.
CREATE TRIGGER inbox_inserted AFTER INSERT ON eventbox.inbox
    FOR EACH ROW
    WHEN (NEW.status IN ('received', 'retry')
          AND pg_catalog.current_setting('eventbox.worker_role', true) IS DISTINCT FROM 'ingest')
    EXECUTE FUNCTION eventbox._inbox_requeued_row();
-- Rows made to wait again (retry(), redrive(), reprocess(), or an UPDATE by hand), and rows
-- that waited for a retry given a final outcome other than by a handler worker's pass (skip(),
-- an UPDATE by hand): the messages of their key that a read left out behind them, which a
-- position may have passed, wait from there. A handler pass's own marks call nothing.
CREATE TRIGGER inbox_requeued AFTER UPDATE ON eventbox.inbox
    FOR EACH ROW
    WHEN ((NEW.status IN ('received', 'retry')
           AND (OLD.status NOT IN ('received', 'retry')
                OR (OLD.subscription, OLD.topic, OLD."partition", OLD."offset", OLD.mode)
                   IS DISTINCT FROM (NEW.subscription, NEW.topic, NEW."partition", NEW."offset",
                                     NEW.mode)))
          OR (OLD.status IN ('received', 'retry') AND NEW.status NOT IN ('received', 'retry')
              AND OLD.next_attempt_at IS NOT NULL
              AND pg_catalog.current_setting('eventbox.worker_role', true)
                  IS DISTINCT FROM 'handler'))
    EXECUTE FUNCTION eventbox._inbox_requeued_row();
-- A row that waited for a retry, deleted: the same (retention deletes no waiting row).
CREATE TRIGGER inbox_released AFTER DELETE ON eventbox.inbox
    FOR EACH ROW
    WHEN (OLD.status IN ('received', 'retry') AND OLD.next_attempt_at IS NOT NULL)
    EXECUTE FUNCTION eventbox._inbox_requeued_row();

-- A key a dead message held back is released (its message processed, skipped or deleted, the
-- subscription back to on_dead 'continue'): the messages of the key that the reads left out
-- wait from the dead message's offset, in both ranges of its lane.
CREATE FUNCTION eventbox._key_block_released() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventbox._lower_position(OLD.subscription, OLD.topic, OLD."partition", false,
                                     OLD."offset");
    PERFORM eventbox._lower_position(OLD.subscription, OLD.topic, OLD."partition", true,
                                     OLD."offset");
    RETURN NULL;
END $$;
CREATE TRIGGER key_blocks_released AFTER DELETE ON eventbox.key_blocks
    FOR EACH ROW EXECUTE FUNCTION eventbox._key_block_released();

-- What decides which messages a read leaves out changed (the handlers of a subscription that
-- keeps unhandled messages, its ordering or its unhandled option): its positions go back to the
-- lanes' first rows, which the next reads walk once (docs/design/handlers.md, "Lane positions").
CREATE FUNCTION eventbox._positions_reset() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sub text;
BEGIN
    IF TG_TABLE_NAME = 'subscriptions' THEN
        sub := OLD.name;
    ELSE
        IF TG_OP = 'DELETE' THEN sub := OLD.subscription; ELSE sub := NEW.subscription; END IF;
        IF NOT EXISTS (SELECT FROM eventbox.subscriptions s
                        WHERE s.name = sub AND s.unhandled = 'keep') THEN
            RETURN NULL;
        END IF;
    END IF;
    UPDATE eventbox.inbox_positions p SET position = -1, version = p.version + 1
     WHERE p.subscription = sub AND p.position <> -1;
    PERFORM eventbox._inbox_requeued();
    RETURN NULL;
END $$;
CREATE TRIGGER handlers_changed AFTER INSERT OR UPDATE OR DELETE ON eventbox.handlers
    FOR EACH ROW EXECUTE FUNCTION eventbox._positions_reset();
CREATE TRIGGER subscriptions_reads_changed AFTER UPDATE OF ordering, unhandled
    ON eventbox.subscriptions
    FOR EACH ROW WHEN ((OLD.ordering, OLD.unhandled) IS DISTINCT FROM (NEW.ordering, NEW.unhandled))
    EXECUTE FUNCTION eventbox._positions_reset();

REVOKE ALL ON FUNCTION eventbox._inbox_requeued(),
    eventbox._lower_position(text, text, integer, boolean, bigint),
    eventbox._inbox_stored_below(text, text[], integer[], bigint[]),
    eventbox._inbox_requeued_row(), eventbox._key_block_released(),
    eventbox._positions_reset() FROM PUBLIC;

-- ---- 0.6.0: a processed mark that touches no index (issue 31) ----
-- The inbox's indexes and fillfactor are defined where the table and indexes are created above
-- (inbox_todo_idx, inbox_retry_idx, inbox_received_idx, inbox_replay_idx).
