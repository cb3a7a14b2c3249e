-- Replay and backfill modes (issue 18): eventbox.current_mode(), eventbox.reprocess(), send()
-- suppressed into eventbox.suppressed_sends in modes 'replay' and 'backfill' (and its explicit
-- publish_in_replay override), the lane order of replays, and eventbox.dry_run(). Needs no
-- broker: inbox rows are inserted directly (a row with mode 'backfill' as the ingest worker
-- stores it below a backfill subscription's boundary) and handled by eventbox.process(), the
-- workers' code path (deterministic only when no handler worker serves this database).
\set SHOW_CONTEXT never
SELECT current_setting('eventbox.handler_workers') = '0'
           OR current_setting('eventbox.database') <> current_database() AS no_handler_worker_here;
SELECT eventbox.truncate_outbox();

CREATE ROLE regress_modes_runner;
CREATE ROLE regress_modes_owner;
CREATE ROLE regress_modes_outsider;
CREATE SCHEMA regress_modes;
GRANT USAGE ON SCHEMA eventbox, regress_modes TO regress_modes_runner;
GRANT EXECUTE ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid),
    eventbox.send(text, jsonb, text, jsonb, uuid, boolean), eventbox.current_mode()
    TO regress_modes_runner;
-- What the handler did and in which mode; it writes a read model and sends a notification.
CREATE TABLE regress_modes.seen (message_id text, mode text, n bigserial);
CREATE TABLE regress_modes.totals (id int PRIMARY KEY, total int NOT NULL);
CREATE TABLE regress_modes.failing (message_id text PRIMARY KEY);
GRANT INSERT, SELECT ON regress_modes.seen TO regress_modes_runner;
GRANT USAGE ON SEQUENCE regress_modes.seen_n_seq TO regress_modes_runner;
GRANT INSERT, UPDATE, SELECT, DELETE ON regress_modes.totals TO regress_modes_runner;
GRANT SELECT ON regress_modes.failing TO regress_modes_runner;
CREATE FUNCTION regress_modes.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO regress_modes.seen (message_id, mode) VALUES (msg.message_id, eventbox.current_mode());
    IF EXISTS (SELECT 1 FROM regress_modes.failing f WHERE f.message_id = msg.message_id) THEN
        RAISE EXCEPTION 'refused %', msg.message_id USING ERRCODE = '22023';
    END IF;
    INSERT INTO regress_modes.totals VALUES ((msg.payload->>'id')::int, (msg.payload->>'total')::int)
        ON CONFLICT (id) DO UPDATE SET total = excluded.total;
    PERFORM eventbox.send('mails', jsonb_build_object('mail_for', msg.payload->'id'),
                          key => msg.message_id);
    -- Audit events must go out whatever the mode: the explicit override.
    IF msg.payload ? 'audit' THEN
        PERFORM eventbox.send('audit', msg.payload, msg.message_id, '{}', NULL,
                              publish_in_replay => true);
    END IF;
END $$;
GRANT EXECUTE ON FUNCTION regress_modes.handle(eventbox.inbox) TO regress_modes_runner;
GRANT regress_modes_runner TO regress_modes_owner;
SELECT eventbox.create_subscription('modes', ARRAY['orders']);
SELECT eventbox.register_handler('modes', 'regress_modes.handle(eventbox.inbox)',
                                 run_as => 'regress_modes_runner');
CREATE FUNCTION pg_temp.put(o bigint, payload jsonb, mode text DEFAULT 'live')
RETURNS void LANGUAGE sql AS $$
    INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", payload,
                                mode)
    VALUES ('modes', 'orders/0/' || o, 'orders', 0, o, payload, mode)
$$;
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- ---- outside a handler there is no mode ---------------------------------------------------
SELECT eventbox.current_mode() IS NULL AS no_mode_outside_handlers;

-- ---- live: sends go to the outbox ---------------------------------------------------------
SELECT pg_temp.put(0, '{"id": 1, "total": 10}');
SELECT pg_temp.put(1, '{"id": 2, "total": 20, "audit": true}');
SELECT eventbox.process('modes');
SELECT message_id, mode FROM regress_modes.seen ORDER BY n;
SELECT topic, convert_from(key, 'UTF8') AS key FROM eventbox.outbox ORDER BY id;
SELECT count(*) AS suppressed FROM eventbox.suppressed_sends;
SELECT message_id, status, mode, attempts FROM eventbox.inbox WHERE subscription = 'modes'
 ORDER BY "offset";

-- ---- reprocess: bad input is refused, nothing changes --------------------------------------
SELECT eventbox.reprocess('nope');
SELECT eventbox.reprocess('modes', since => '2030-01-02', until => '2030-01-01');
SELECT eventbox.reprocess('modes', message_ids => ARRAY['orders/0/0', NULL]);
SET ROLE regress_modes_outsider;
SELECT pg_temp.try($$SELECT eventbox.reprocess('modes')$$) LIKE '42501:%' AS outsider_refused;
RESET ROLE;
SELECT count(*) AS still_processed FROM eventbox.inbox WHERE subscription = 'modes'
   AND status = 'processed';

-- ---- replay: the handler fixed, both messages re-run; sends are suppressed, not lost -------
SELECT eventbox.truncate_outbox();
SELECT eventbox.reprocess('modes', event_type => 'NoSuchType') AS none_of_that_type;
SELECT eventbox.reprocess('modes', since => now() - interval '1 hour') AS queued;
SELECT message_id, status, mode, attempts, processed_at IS NULL AS not_processed
  FROM eventbox.inbox WHERE subscription = 'modes' ORDER BY "offset";
-- A replay is not run again while it waits: a second call finds nothing handled to queue.
SELECT eventbox.reprocess('modes') AS queued_again;
SELECT eventbox.process('modes');
SELECT message_id, mode FROM regress_modes.seen ORDER BY n;
-- The mail is suppressed; the audit event was sent with publish_in_replay => true.
SELECT topic, convert_from(key, 'UTF8') AS key FROM eventbox.outbox ORDER BY id;
SELECT topic, convert_from(key, 'UTF8') AS key, convert_from(payload, 'UTF8') AS payload, mode,
       subscription, caused_by, headers ? 'causation_id' AS has_lineage
  FROM eventbox.suppressed_sends ORDER BY id;
SELECT message_id, status, mode, attempts FROM eventbox.inbox WHERE subscription = 'modes'
 ORDER BY "offset";

-- A replay that fails is tracked like a live run (22023 is non_retryable: dead at once), and
-- reprocess() takes dead messages too.
INSERT INTO regress_modes.failing VALUES ('orders/0/0');
SELECT eventbox.reprocess('modes', message_ids => ARRAY['orders/0/0']) AS queued;
SELECT eventbox.process('modes');
SELECT message_id, status, mode, attempts, last_error FROM eventbox.inbox
 WHERE subscription = 'modes' AND message_id = 'orders/0/0';
UPDATE eventbox.inbox SET status = 'dead', next_attempt_at = NULL
 WHERE subscription = 'modes' AND message_id = 'orders/0/0';
DELETE FROM regress_modes.failing;
SELECT eventbox.reprocess('modes', message_ids => ARRAY['orders/0/0']) AS dead_queued;
SELECT eventbox.process('modes');
SELECT message_id, status, mode, attempts, last_error FROM eventbox.inbox
 WHERE subscription = 'modes' AND message_id = 'orders/0/0';

-- ---- lane order: live messages of a lane run before its queued replays ----------------------
TRUNCATE regress_modes.seen;
SELECT pg_temp.put(2, '{"id": 3, "total": 30}');
SELECT eventbox.reprocess('modes', message_ids => ARRAY['orders/0/0', 'orders/0/1']) AS queued;
-- The live message (offset 2) comes first although the replays have lower offsets.
SELECT eventbox.process('modes', max_messages => 1);
SELECT message_id, mode FROM regress_modes.seen ORDER BY n;
SELECT eventbox.process('modes');
SELECT message_id, mode FROM regress_modes.seen ORDER BY n;

-- ---- backfill: rows the ingest worker stored in mode 'backfill' suppress like replays -------
SELECT eventbox.truncate_outbox();
TRUNCATE eventbox.suppressed_sends;
SELECT pg_temp.put(3, '{"id": 4, "total": 40}', 'backfill');
SELECT pg_temp.put(4, '{"id": 5, "total": 50}');
SELECT eventbox.process('modes');
SELECT message_id, mode FROM regress_modes.seen WHERE message_id IN ('orders/0/3', 'orders/0/4')
 ORDER BY n;
SELECT topic, convert_from(key, 'UTF8') AS key FROM eventbox.outbox ORDER BY id;
SELECT convert_from(key, 'UTF8') AS key, mode, caused_by FROM eventbox.suppressed_sends ORDER BY id;
-- The option itself: history only exists for start_from 'earliest'.
SELECT eventbox.create_subscription('modes_bf', ARRAY['orders'], backfill => true);
SELECT backfill, start_from FROM eventbox.subscriptions WHERE name = 'modes_bf';
SELECT eventbox.create_subscription('modes_bad', ARRAY['orders'], start_from => 'latest',
                                    backfill => true);
SELECT eventbox.create_subscription('modes_bad', ARRAY['orders'], backfill => NULL);
SELECT eventbox.drop_subscription('modes_bf');

-- ---- dry run: what the current handler would do, and nothing persists -----------------------
UPDATE regress_modes.totals SET total = 0;
INSERT INTO regress_modes.failing VALUES ('orders/0/1');
CREATE TEMP TABLE sums AS
SELECT (SELECT md5(string_agg(i::text, '|' ORDER BY message_id)) FROM eventbox.inbox i) AS inbox,
       (SELECT md5(coalesce(string_agg(o::text, '|' ORDER BY id), '')) FROM eventbox.outbox o) AS outbox,
       (SELECT md5(coalesce(string_agg(s::text, '|' ORDER BY id), '')) FROM eventbox.suppressed_sends s) AS suppressed,
       (SELECT md5(string_agg(t::text, '|' ORDER BY id)) FROM regress_modes.totals t) AS totals,
       (SELECT md5(string_agg(s::text, '|' ORDER BY n)) FROM regress_modes.seen s) AS seen;
SELECT message_id, outcome, sqlstate, error, tables, sends
  FROM eventbox.dry_run('modes', message_ids => ARRAY['orders/0/0', 'orders/0/1', 'orders/0/2']);
SELECT count(*) AS rows_since_then FROM eventbox.dry_run('modes', since => now() - interval '1 hour',
                                                         max_messages => 3);
SELECT (SELECT md5(string_agg(i::text, '|' ORDER BY message_id)) FROM eventbox.inbox i) = s.inbox AS inbox_unchanged,
       (SELECT md5(coalesce(string_agg(o::text, '|' ORDER BY id), '')) FROM eventbox.outbox o) = s.outbox AS outbox_unchanged,
       (SELECT md5(coalesce(string_agg(x::text, '|' ORDER BY id), '')) FROM eventbox.suppressed_sends x) = s.suppressed AS suppressed_unchanged,
       (SELECT md5(string_agg(t::text, '|' ORDER BY id)) FROM regress_modes.totals t) = s.totals AS totals_unchanged,
       (SELECT md5(string_agg(x::text, '|' ORDER BY n)) FROM regress_modes.seen x) = s.seen AS seen_unchanged
  FROM sums s;
-- Bad input, and who may: members of the owner role who could also act as every run_as role.
SELECT * FROM eventbox.dry_run('nope');
SELECT * FROM eventbox.dry_run('modes', max_messages => 0);
SELECT * FROM eventbox.dry_run(NULL);
GRANT USAGE ON SCHEMA eventbox TO regress_modes_outsider, regress_modes_owner;
GRANT EXECUTE ON FUNCTION eventbox.dry_run(text, text[], timestamptz, integer),
    eventbox.create_subscription,
    eventbox.register_handler(text, regprocedure, text, name, boolean)
    TO regress_modes_outsider, regress_modes_owner;
SET ROLE regress_modes_outsider;
SELECT pg_temp.try($$SELECT * FROM eventbox.dry_run('modes')$$) LIKE '42501:%' AS outsider_refused;
RESET ROLE;
-- An owner whose handler runs as a role it is not a member of cannot dry-run it.
GRANT regress_modes_outsider TO regress_modes_owner;
SET ROLE regress_modes_owner;
SELECT eventbox.create_subscription('modes_owned', ARRAY['orders']);
SELECT eventbox.register_handler('modes_owned', 'regress_modes.handle(eventbox.inbox)',
                                 run_as => 'regress_modes_runner');
RESET ROLE;
REVOKE regress_modes_runner FROM regress_modes_owner;
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", payload)
VALUES ('modes_owned', 'orders/0/0', 'orders', 0, 0, '{"id": 9, "total": 90}');
SET ROLE regress_modes_owner;
SELECT * FROM eventbox.dry_run('modes_owned');
RESET ROLE;
-- A dry run inside a handler is refused like process().
CREATE FUNCTION regress_modes.nested(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM * FROM eventbox.dry_run('modes');
END $$;
SELECT eventbox.unregister_handler('modes_owned', 'regress_modes.handle(eventbox.inbox)');
GRANT regress_modes_runner TO regress_modes_owner;
SELECT eventbox.register_handler('modes_owned', 'regress_modes.nested(eventbox.inbox)',
                                 run_as => 'regress_modes_runner');
GRANT EXECUTE ON FUNCTION eventbox.dry_run(text, text[], timestamptz, integer) TO regress_modes_runner;
SELECT message_id, outcome, sqlstate, error FROM eventbox.dry_run('modes_owned');

-- ---- cleanup -----------------------------------------------------------------------------
SELECT eventbox.drop_subscription('modes');
SELECT eventbox.drop_subscription('modes_owned');
SELECT eventbox.truncate_outbox();
TRUNCATE eventbox.suppressed_sends;
DROP SCHEMA regress_modes CASCADE;
REVOKE ALL ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid),
    eventbox.send(text, jsonb, text, jsonb, uuid, boolean), eventbox.current_mode(),
    eventbox.dry_run(text, text[], timestamptz, integer)
    FROM regress_modes_runner, regress_modes_outsider, regress_modes_owner;
REVOKE ALL ON FUNCTION
    eventbox.create_subscription,
    eventbox.register_handler(text, regprocedure, text, name, boolean)
    FROM regress_modes_outsider, regress_modes_owner;
REVOKE ALL ON SCHEMA eventbox FROM regress_modes_runner, regress_modes_outsider, regress_modes_owner;
DROP ROLE regress_modes_runner, regress_modes_outsider, regress_modes_owner;
