-- pg_eventbox 0.5.0 -> 0.6.0. Released scripts never change: every schema change of 0.6.0 is
-- made here and in pg_eventbox--0.6.0.sql, and the upgrade test proves both give the same schema.
\echo Use "ALTER EXTENSION pg_eventbox UPDATE TO '0.6.0'" to load this file. \quit

-- Each change of 0.6.0 goes in its own section above this line, headed
-- "-- ---- 0.6.0: <what> ----", and the same objects in the full install script.

-- Last, as in every upgrade script: the recorded roles get this release's set.
SELECT eventbox._regrant();
