-- pg_eventbox 0.5.0 -> 0.6.0. Released scripts never change: every schema change of 0.6.0 is
-- made here and in pg_eventbox--0.6.0.sql, and the upgrade test proves both give the same schema.
\echo Use "ALTER EXTENSION pg_eventbox UPDATE TO '0.6.0'" to load this file. \quit

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

-- ---- 0.6.0: a crash counts the attempts of the run transaction in flight only ----
-- docs/design/handlers.md ("Claims"): each claimed message's place in the pass's run order, and
-- the places of the run transaction in flight. Claims written by 0.5.0 have neither, and count
-- every message that still waits, as 0.5.0 did.
ALTER TABLE eventbox.handler_claims ADD COLUMN positions integer[],
    ADD COLUMN running int4range;

-- ---- 0.6.0: room on the page for a processed mark ----
-- The mark's new row version goes on the row's own page when it fits (docs/design/plans.md).
-- With fillfactor 90 a page of 200 B rows had room for about three versions, one of 1 KiB rows
-- for about one; the others went elsewhere, often to a page the table grew by. Pages written
-- before keep their fill; the new setting holds for pages written from now on. (Reset and set
-- again in the order a fresh install has them.)
ALTER TABLE eventbox.inbox RESET (fillfactor, toast_tuple_target);
ALTER TABLE eventbox.inbox SET (fillfactor = 80, toast_tuple_target = 4096);
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

-- The positions of the lanes an install has rows in: each range's first waiting row, or past
-- its last row when none waits (0.4.0's workers kept their marks in memory only).
INSERT INTO eventbox.inbox_positions (subscription, topic, "partition", replay, position)
SELECT i.subscription, i.topic, i."partition", i.mode = 'replay',
       coalesce(min(i."offset") FILTER (WHERE i.status IN ('received', 'retry')),
                max(i."offset") + 1)
  FROM eventbox.inbox i
 GROUP BY 1, 2, 3, 4;

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

-- replay() lowers the next offset to store: records stored again at or above it wait there.
CREATE OR REPLACE FUNCTION eventbox._replay(caller oid, subscription text, topic text,
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

CREATE OR REPLACE FUNCTION eventbox._drop_subscription(caller oid, name text)
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

-- skip() of a message that waited for a retry lowers its lane's position itself (a handler's own
-- code calling it in a handler worker, whose writes the inbox's trigger leaves out).
CREATE OR REPLACE FUNCTION eventbox._skip(caller oid, subscription text, message_id text)
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

-- ---- 0.6.0: a processed mark that touches no index (issue 31) ----
-- No index of eventbox.inbox mentions a column a handler's outcome changes (status, attempts,
-- processed_at, last_error; next_attempt_at only where a retry set it): marking a message
-- processed, ignored or dead is a HOT update, with no new index entry (PostgreSQL counts the
-- columns of index predicates too). The work to do is found from the lanes' positions
-- (eventbox.inbox_positions): lane reads, probes, discovery, eventbox.process() and the metrics
-- walk inbox_todo_idx from there, testing the status on the row (docs/design/handlers.md,
-- "A processed mark that touches no index"). The retention purges walk inbox_received_idx.
-- The topic leads: see the full install script.
DROP INDEX eventbox.inbox_todo_idx;
CREATE INDEX inbox_todo_idx ON eventbox.inbox
    (topic, "partition", subscription, (mode = 'replay'), "offset");
-- Only a retry sets next_attempt_at (a processed mark or a dead one clears it).
DROP INDEX eventbox.inbox_retry_idx;
CREATE INDEX inbox_retry_idx ON eventbox.inbox (subscription, topic, "partition", next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;
DROP INDEX eventbox.inbox_replay_idx;
CREATE INDEX inbox_replay_idx ON eventbox.inbox (subscription, topic, "partition", "offset")
    WHERE mode = 'replay';
DROP INDEX eventbox.inbox_done_idx;
DROP INDEX eventbox.inbox_dead_idx;
CREATE INDEX inbox_received_idx ON eventbox.inbox (received_at);
-- Room on each page for the new versions of a whole page of rows marked in one transaction
-- (the old ones are dead only once it commits): the marks stay HOT. Rows stored before the
-- update keep their pages as they are. (Reset and set again: the options in a fresh install's
-- order.)
ALTER TABLE eventbox.inbox RESET (fillfactor, toast_tuple_target);
ALTER TABLE eventbox.inbox SET (fillfactor = 50, toast_tuple_target = 4096);

-- Each change of 0.6.0 goes in its own section above this line, headed
-- "-- ---- 0.6.0: <what> ----", and the same objects in the full install script.

-- Last, as in every upgrade script: the recorded roles get this release's set.
SELECT eventbox._regrant();
