-- Handlers, lane positions (docs/design/handlers.md, "Lane positions"): every way a row comes to
-- wait (an insert by hand, retry(), redrive(), reprocess(), replay(), an UPDATE by hand) leaves
-- its lane range's position at or below it and moves the version a pass's raise compares, once
-- per transaction and range while the position is low enough. The ingest workers' inserts are
-- left alone by the trigger (they store at or above the next offset to store, which no raise
-- passes). Reads start at the position. Needs no broker: inbox rows are inserted directly.

\getenv abs_srcdir PG_ABS_SRCDIR
\set handlers_setup :abs_srcdir '/sql/include/handlers_setup.sql'
\set handlers_cleanup :abs_srcdir '/sql/include/handlers_cleanup.sql'
\i :handlers_setup

CREATE TEMP VIEW positions AS
SELECT topic, "partition", replay, position, version FROM eventbox.inbox_positions
 WHERE subscription = 'pos';

SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('pos', ARRAY['orders'], max_attempts => 1);
SELECT eventbox.register_handler('pos', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;

-- A lane's first rows (by hand, one transaction each): its position is their first offset, and
-- each transaction moves the version.
SELECT pg_temp.put('pos', 'orders', 0, o) FROM generate_series(10, 14) AS o;
SELECT * FROM positions;
-- A row by hand below it: lowered.
SELECT pg_temp.put('pos', 'orders', 0, 5);
SELECT * FROM positions;
-- Rows that do not wait (unparsable) leave it.
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", status)
VALUES ('pos', 'orders/0/2', 'orders', 0, 2, 'unparsable');
SELECT * FROM positions;
-- With a stored offset: a batch by hand at or above it and above the position moves the version
-- (a pass that read the position before it commits must not raise it past the batch), as one
-- below it does.
INSERT INTO eventbox.offsets (subscription, topic, "partition", next_offset)
VALUES ('pos', 'orders', 0, 21);
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", payload)
SELECT 'pos', 'orders/0/' || o, 'orders', 0, o, '{}' FROM generate_series(21, 22) AS o;
SELECT * FROM positions;
SELECT pg_temp.put('pos', 'orders', 0, 20);
SELECT * FROM positions;
-- A new lane gets its own.
SELECT pg_temp.put('pos', 'orders', 1, 3);
SELECT * FROM positions ORDER BY "partition";

-- Reads start at the position: a row below it is not read (here the position is set by hand,
-- past what waits, to show it; nothing else lets that happen).
UPDATE eventbox.inbox_positions SET position = 11
 WHERE subscription = 'pos' AND "partition" = 0 AND NOT replay;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('pos', 100);
RESET ROLE;
SELECT message_id, status FROM msgs WHERE sub = 'pos' AND status <> 'processed' ORDER BY 1;
-- The pass raised the positions past what it handled, never past the next offset to store
-- (21 in partition 0; partition 1 has none).
SELECT * FROM positions ORDER BY "partition";
-- An UPDATE by hand that makes rows wait again lowers it, once per transaction and range
-- while it is low enough (5, then nothing for 10: the version moves once).
UPDATE eventbox.inbox_positions SET position = 23
 WHERE subscription = 'pos' AND "partition" = 0 AND NOT replay;
BEGIN;
UPDATE eventbox.inbox SET status = 'ignored'
 WHERE subscription = 'pos' AND "partition" = 0 AND "offset" IN (5, 10);
UPDATE eventbox.inbox SET status = 'received'
 WHERE subscription = 'pos' AND "partition" = 0 AND "offset" = 5;
UPDATE eventbox.inbox SET status = 'received'
 WHERE subscription = 'pos' AND "partition" = 0 AND "offset" = 10;
SELECT * FROM positions WHERE "partition" = 0;
COMMIT;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('pos', 100);
RESET ROLE;
SELECT message_id, status FROM msgs WHERE sub = 'pos' AND status <> 'processed' ORDER BY 1;

-- The operations, each from a position raised past what they make wait (as a worker's passes
-- would have raised it): retry() and redrive() of dead messages.
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/30', 'record'), ('orders/0/31', 'record'),
                                               ('orders/0/32', 'record');
SELECT pg_temp.put('pos', 'orders', 0, o) FROM generate_series(30, 32) AS o;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('pos', 100);
RESET ROLE;
TRUNCATE regress_eventbox_fn.failing;
SELECT message_id, status FROM msgs WHERE sub = 'pos' AND status <> 'processed' ORDER BY 1;
UPDATE eventbox.inbox_positions SET position = 40 WHERE subscription = 'pos' AND NOT replay;
SET ROLE regress_eventbox_owner;
SELECT eventbox.retry('pos', 'orders/0/31');
RESET ROLE;
SELECT * FROM positions WHERE "partition" = 0;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('pos', 100);
RESET ROLE;
UPDATE eventbox.inbox_positions SET position = 40 WHERE subscription = 'pos' AND NOT replay;
SET ROLE regress_eventbox_owner;
SELECT eventbox.redrive('pos');
RESET ROLE;
SELECT * FROM positions WHERE "partition" = 0;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('pos', 100);
RESET ROLE;
SELECT message_id, status FROM msgs WHERE sub = 'pos' AND status <> 'processed' ORDER BY 1;
-- reprocess(): the replay range.
SELECT eventbox.reprocess('pos', message_ids => ARRAY['orders/0/14', 'orders/0/21']);
SELECT * FROM positions ORDER BY "partition", replay;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('pos', 100);
RESET ROLE;
SELECT message_id, status, mode FROM eventbox.inbox WHERE subscription = 'pos' AND mode = 'replay'
 ORDER BY 1;
-- replay(): the live range goes down to where the ingest stores again.
UPDATE eventbox.inbox_positions SET position = 40 WHERE subscription = 'pos' AND NOT replay;
SET ROLE regress_eventbox_owner;
SELECT eventbox.replay('pos', 'orders', 0, 18);
RESET ROLE;
SELECT * FROM positions WHERE "partition" = 0 AND NOT replay;

-- A pass's marks (processed, failed, dead) call nothing: only rows that come to wait, or that
-- held others back, do (each trigger's condition is checked before any call).
SELECT tgname, pg_get_triggerdef(oid) LIKE '%WHEN%' AS conditional
  FROM pg_trigger WHERE tgrelid = 'eventbox.inbox'::regclass AND NOT tgisinternal ORDER BY 1;

-- Dropping the subscription drops its positions.
SET ROLE regress_eventbox_owner;
SELECT eventbox.drop_subscription('pos');
RESET ROLE;
SELECT count(*) AS positions_left FROM eventbox.inbox_positions WHERE subscription = 'pos';

\i :handlers_cleanup
