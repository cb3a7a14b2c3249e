-- Lineage headers (issue 17): eventbox.send() called while a handler runs adds causation_id,
-- correlation_id and traceparent unless the caller set them, on the direct insert path and on
-- its SQL fallback; outside handlers nothing is added. Also the message_id_rule option and the
-- conflicts a subscription leaves behind. Needs no broker: inbox rows are inserted directly and
-- handled by eventbox.process() (deterministic only when no handler worker serves this
-- database, which the first query checks).
\set SHOW_CONTEXT never
SELECT current_setting('eventbox.handler_workers') = '0'
           OR current_setting('eventbox.database') <> current_database() AS no_handler_worker_here;
SELECT eventbox.truncate_outbox();

CREATE ROLE regress_lineage_runner;
CREATE SCHEMA regress_lineage;
GRANT USAGE ON SCHEMA eventbox, regress_lineage TO regress_lineage_runner;
GRANT EXECUTE ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid) TO regress_lineage_runner;
-- Sends twice per message: with headers of its own, and with lineage headers it sets itself.
CREATE FUNCTION regress_lineage.forward(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM eventbox.send('lineage-out', msg.payload, key => msg.message_id,
                          headers => '{"event_type": "Forwarded"}');
    PERFORM eventbox.send('lineage-out', msg.payload, key => msg.message_id || '/own',
                          headers => '{"correlation_id": "mine", "causation_id": "mine too"}');
END $$;
GRANT EXECUTE ON FUNCTION regress_lineage.forward(eventbox.inbox) TO regress_lineage_runner;
SELECT eventbox.create_subscription('lineage', ARRAY['lineage-in']);
SELECT eventbox.register_handler('lineage', 'regress_lineage.forward(eventbox.inbox)',
                                 run_as => 'regress_lineage_runner');

-- A message without lineage, one in a conversation with a trace, one with a malformed trace.
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", headers, payload)
VALUES ('lineage', 'm-plain', 'lineage-in', 0, 0, '{}', '{"n": 1}'),
       ('lineage', 'm-traced', 'lineage-in', 0, 1,
        '{"correlation_id": "order-42",
          "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}', '{"n": 2}'),
       ('lineage', 'm-bad-trace', 'lineage-in', 0, 2, '{"traceparent": "00-garbage"}', '{"n": 3}');
SELECT eventbox.process('lineage');

-- What the handler sent: causation_id is the handled message, correlation_id its conversation
-- (else itself), traceparent the same trace and flags under a new parent span; the caller's own
-- values stay.
CREATE FUNCTION pg_temp.sent() RETURNS TABLE (key text, headers jsonb) LANGUAGE sql AS $$
    SELECT convert_from(o.key, 'UTF8'),
           CASE WHEN o.headers ? 'traceparent'
                THEN o.headers || jsonb_build_object('traceparent',
                         regexp_replace(o.headers->>'traceparent', '-[0-9a-f]{16}-', '-<span>-'))
                ELSE o.headers END
      FROM eventbox.outbox o ORDER BY o.id
$$;
SELECT * FROM pg_temp.sent();
-- The new parent span is the sender's own: valid, and not the incoming one.
SELECT headers->>'traceparent' ~ '^00-4bf92f3577b34da6a3ce929d0e0e4736-[0-9a-f]{16}-01$' AS valid,
       headers->>'traceparent' NOT LIKE '%00f067aa0ba902b7%' AS new_parent
  FROM eventbox.outbox WHERE headers ? 'traceparent';
-- The cause of each send, for eventbox_e2e_seconds: the handled message's subscription and
-- received_at (NULL outside handlers).
CREATE FUNCTION pg_temp.causes() RETURNS TABLE (key text, cause_subscription text,
                                                 received_at_matches boolean) LANGUAGE sql AS $$
    SELECT convert_from(o.key, 'UTF8'), o.cause_subscription,
           o.cause_received_at = (SELECT i.received_at FROM eventbox.inbox i
                                   WHERE i.subscription = o.cause_subscription
                                     AND i.message_id = split_part(convert_from(o.key, 'UTF8'),
                                                                   '/', 1))
      FROM eventbox.outbox o ORDER BY o.id
$$;
SELECT * FROM pg_temp.causes();

-- Outside a handler nothing is added.
SELECT eventbox.truncate_outbox();
SELECT eventbox.send('lineage-out', '{"n": 0}'::jsonb, key => 'outside') IS NOT NULL AS sent;
SELECT * FROM pg_temp.sent();
SELECT * FROM pg_temp.causes();

-- A table with a trigger makes send() insert through SQL: the headers are the same there.
SELECT eventbox.truncate_outbox();
CREATE FUNCTION regress_lineage.keep() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';
SELECT format('eventbox.outbox_rows_%s', eventbox._outbox_open_table()) AS open_rows \gset
CREATE TRIGGER regress_lineage_keep BEFORE INSERT ON :open_rows
    FOR EACH ROW EXECUTE FUNCTION regress_lineage.keep();
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", headers, payload)
VALUES ('lineage', 'm-sql-path', 'lineage-in', 0, 3,
        '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}', '{"n": 4}');
SELECT eventbox.process('lineage');
SELECT * FROM pg_temp.sent();
SELECT * FROM pg_temp.causes();
DROP TRIGGER regress_lineage_keep ON :open_rows;

-- ---- message_id_rule ----------------------------------------------------------------------
SELECT eventbox.create_subscription('lineage-fp', ARRAY['t'], message_id_rule => 'fingerprint');
SELECT eventbox.create_subscription('lineage-bad', ARRAY['t'], message_id_rule => 'hash');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT eventbox.create_subscription('lineage-bad', ARRAY['t'], message_id_rule => NULL);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT name, message_id_rule FROM eventbox.subscriptions WHERE name LIKE 'lineage%' ORDER BY name;
SELECT eventbox.alter_subscription('lineage-fp', batch_size => 10);  -- NULL keeps the rule
SELECT eventbox.alter_subscription('lineage', message_id_rule => 'fingerprint');
SELECT eventbox.alter_subscription('lineage-fp', message_id_rule => 'sha1');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT name, message_id_rule FROM eventbox.subscriptions WHERE name LIKE 'lineage%' ORDER BY name;
-- The change-data-capture rules, and keep_raw (false by default; NULL keeps it on alter).
SELECT eventbox.create_subscription('lineage-dbz', ARRAY['t'], message_id_rule => 'debezium',
                                    keep_raw => true);
SELECT eventbox.create_subscription('lineage-bad', ARRAY['t'], keep_raw => NULL);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT eventbox.alter_subscription('lineage-fp', message_id_rule => 'cockroachdb');
SELECT eventbox.alter_subscription('lineage-dbz', batch_size => 10);
SELECT name, message_id_rule, keep_raw FROM eventbox.subscriptions
 WHERE name LIKE 'lineage%' ORDER BY name;
SELECT eventbox.alter_subscription('lineage-dbz', keep_raw => false);
SELECT keep_raw FROM eventbox.subscriptions WHERE name = 'lineage-dbz';
SELECT eventbox.drop_subscription('lineage-dbz');

-- A subscription's conflicts go with it.
INSERT INTO eventbox.conflicts (subscription, message_id, stored_topic, stored_partition,
                                stored_offset, topic, "partition", "offset")
VALUES ('lineage', 'm-plain', 'lineage-in', 0, 0, 'lineage-in', 1, 7),
       ('lineage-fp', 'x', 't', 0, 0, 't', 0, 1);
SELECT eventbox.drop_subscription('lineage');
SELECT subscription, message_id FROM eventbox.conflicts ORDER BY 1;

-- Clean up.
SELECT eventbox.drop_subscription('lineage-fp');
SELECT eventbox.truncate_outbox();
REVOKE ALL ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid) FROM regress_lineage_runner;
REVOKE ALL ON SCHEMA eventbox FROM regress_lineage_runner;
DROP SCHEMA regress_lineage CASCADE;
DROP ROLE regress_lineage_runner;
