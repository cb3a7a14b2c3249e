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

-- Each change of 0.6.0 goes in its own section above this line, headed
-- "-- ---- 0.6.0: <what> ----", and the same objects in the full install script.

-- Last, as in every upgrade script: the recorded roles get this release's set.
SELECT eventbox._regrant();
