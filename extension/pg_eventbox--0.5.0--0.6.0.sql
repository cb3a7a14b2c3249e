-- pg_eventbox 0.5.0 -> 0.6.0. Released scripts never change: every schema change of 0.6.0 is
-- made here and in pg_eventbox--0.6.0.sql, and the upgrade test proves both give the same schema.
\echo Use "ALTER EXTENSION pg_eventbox UPDATE TO '0.6.0'" to load this file. \quit

-- ---- 0.6.0: durable lane positions (issue 31) ----
-- Per lane (topic, partition) of a subscription and per range (live with backfill, replay), an
-- offset below which no inbox row waits to be handled (status 'received' or 'retry'): lane
-- reads and probes start there (docs/design/handlers.md, "Lane positions"). A handler worker's
-- pass raises it, in its last run transaction, past the leading messages it gave a final
-- outcome, when the version it read with the position is still the row's; whatever makes a row
-- wait below it lowers it and moves the version in its own transaction: inserts through
-- _inbox_inserted(), updates (retry(), redrive(), reprocess(), by hand) through
-- _inbox_requeued_row(), replay() through _lower_position().
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

-- Rows inserted into the inbox, by the ingest workers or by hand: a lane range whose first new
-- waiting row lands below its position, or below its next offset to store (where a pass may
-- raise the position to), or that has no position or no stored offset, has its position lowered
-- and its version moved. The ingest stores at or above the next offset: its batches write
-- nothing here but a lane's first position.
CREATE FUNCTION eventbox._inbox_inserted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO eventbox.inbox_positions AS p (subscription, topic, "partition", replay, position)
    SELECT n.subscription, n.topic, n."partition", n.replay, n.first
      FROM (SELECT r.subscription, r.topic, r."partition", r.mode = 'replay' AS replay,
                   min(r."offset") AS first
              FROM inserted_rows r
             WHERE r.status IN ('received', 'retry')
             GROUP BY 1, 2, 3, 4) n
     WHERE NOT EXISTS (
           SELECT 1 FROM eventbox.inbox_positions q
            WHERE q.subscription = n.subscription AND q.topic = n.topic
              AND q."partition" = n."partition" AND q.replay = n.replay
              AND n.first >= q.position
              AND n.first >= (SELECT o.next_offset FROM eventbox.offsets o
                               WHERE o.subscription = n.subscription AND o.topic = n.topic
                                 AND o."partition" = n."partition"))
    ON CONFLICT (subscription, topic, "partition", replay) DO UPDATE
       SET position = least(p.position, excluded.position), version = p.version + 1;
    IF FOUND THEN
        PERFORM eventbox._inbox_requeued();
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER inbox_inserted AFTER INSERT ON eventbox.inbox
    REFERENCING NEW TABLE AS inserted_rows
    FOR EACH STATEMENT EXECUTE FUNCTION eventbox._inbox_inserted();

-- Rows made to wait again (retry(), redrive(), reprocess(), or an UPDATE by hand): the position
-- of the row's range goes down to it. The condition is checked before any call: a handler pass's
-- marks (processed, ignored, dead, a retry of a waiting row) call nothing.
CREATE FUNCTION eventbox._inbox_requeued_row() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventbox._lower_position(NEW.subscription, NEW.topic, NEW."partition",
                                     NEW.mode = 'replay', NEW."offset");
    RETURN NULL;
END $$;
CREATE TRIGGER inbox_requeued AFTER UPDATE ON eventbox.inbox
    FOR EACH ROW
    WHEN (NEW.status IN ('received', 'retry')
          AND (OLD.status NOT IN ('received', 'retry')
               OR (OLD.subscription, OLD.topic, OLD."partition", OLD."offset", OLD.mode)
                  IS DISTINCT FROM (NEW.subscription, NEW.topic, NEW."partition", NEW."offset",
                                    NEW.mode)))
    EXECUTE FUNCTION eventbox._inbox_requeued_row();

REVOKE ALL ON FUNCTION eventbox._inbox_requeued(),
    eventbox._lower_position(text, text, integer, boolean, bigint),
    eventbox._inbox_inserted(), eventbox._inbox_requeued_row() FROM PUBLIC;

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
