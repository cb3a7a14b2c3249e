-- pg_eventbox 0.1.0: transactional outbox for Kafka.
\echo Use "CREATE EXTENSION pg_eventbox" to load this file. \quit

-- Nothing in this schema is usable by PUBLIC; see the README for the writer/admin grants.
REVOKE ALL ON SCHEMA eventbox FROM PUBLIC;

-- One row per message to publish. The relay deletes a row when the broker acknowledges it
-- (eventbox.outbox_retention = 0) or marks it sent and purges it after the retention.
--
-- Ids come from next_outbox_id(), which publishes the writer's xid before drawing the id, and
-- the sequence keeps CACHE 1 so ids are handed out in allocation order across sessions: together
-- they let the relay find rows that commit late with a lower id (see src/relay_recheck.hpp).
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
LANGUAGE c VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'eventbox_send_jsonb';

CREATE FUNCTION eventbox.send(topic text, payload bytea, key text DEFAULT NULL,
                              headers jsonb DEFAULT '{}', message_id uuid DEFAULT NULL)
RETURNS uuid
LANGUAGE c VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'eventbox_send_bytea';

COMMENT ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid) IS
    'Queue a JSON message for Kafka; published if and only if the transaction commits';
COMMENT ON FUNCTION eventbox.send(text, bytea, text, jsonb, uuid) IS
    'Queue raw bytes for Kafka; published if and only if the transaction commits';

-- Running workers as seen by the launcher's shared state.
CREATE FUNCTION eventbox.workers(OUT pid integer, OUT role text, OUT state text,
                                 OUT last_activity timestamptz, OUT started_at timestamptz,
                                 OUT messages bigint, OUT errors bigint, OUT last_error text)
RETURNS SETOF record
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'eventbox_workers';

CREATE VIEW eventbox.workers AS SELECT * FROM eventbox.workers();

REVOKE ALL ON ALL TABLES IN SCHEMA eventbox FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA eventbox FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA eventbox FROM PUBLIC;
