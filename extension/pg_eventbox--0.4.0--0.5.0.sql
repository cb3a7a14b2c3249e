-- pg_eventbox 0.4.0 -> 0.5.0. Released scripts never change: every schema change of 0.5.0 is
-- made here and in pg_eventbox--0.5.0.sql, and the upgrade test proves both give the same schema.
\echo Use "ALTER EXTENSION pg_eventbox UPDATE TO '0.5.0'" to load this file. \quit

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
