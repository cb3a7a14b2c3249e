-- The upgrade path: 0.1.0 as released, filled with state, then ALTER EXTENSION ... UPDATE, must
-- give exactly the schema of a fresh install of the current version. pg_dump leaves an
-- extension's own objects out, so the catalog of both is compared: every member's definition,
-- columns, constraints, indexes, triggers, function signatures and attributes, grants, comments
-- and config-dump registrations.
\set SHOW_CONTEXT never
SET client_min_messages = warning;

-- One line per property of every object of the extension (names only, never OIDs).
CREATE SCHEMA upgrade_check;
CREATE FUNCTION upgrade_check.eventbox_catalog() RETURNS SETOF text LANGUAGE sql AS $$
WITH ext AS (SELECT oid, extconfig, extcondition FROM pg_extension WHERE extname = 'pg_eventbox'),
members AS (
    SELECT d.classid, d.objid FROM pg_depend d, ext
     WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'
),
rels AS (SELECT c.* FROM pg_class c JOIN members m ON m.classid = 'pg_class'::regclass
                                                           AND m.objid = c.oid)
SELECT 'member ' || pg_describe_object(classid, objid, 0) FROM members
UNION ALL
SELECT format('relation %s kind=%s persistence=%s options=%s acl=%s comment=%s',
              r.oid::regclass, r.relkind, r.relpersistence, r.reloptions, r.relacl,
              obj_description(r.oid, 'pg_class'))
  FROM rels r
UNION ALL
SELECT format('column %s.%s #%s %s notnull=%s default=%s identity=%s generated=%s collation=%s acl=%s storage=%s compression=%s',
              a.attrelid::regclass, a.attname, a.attnum, format_type(a.atttypid, a.atttypmod),
              a.attnotnull, pg_get_expr(ad.adbin, ad.adrelid), a.attidentity, a.attgenerated,
              a.attcollation::regcollation, a.attacl, a.attstorage, a.attcompression)
  FROM rels r JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
UNION ALL
SELECT format('constraint %s.%s %s deferrable=%s', con.conrelid::regclass, con.conname,
              pg_get_constraintdef(con.oid), con.condeferrable)
  FROM rels r JOIN pg_constraint con ON con.conrelid = r.oid
UNION ALL
SELECT format('index %s %s', i.indexrelid::regclass, pg_get_indexdef(i.indexrelid))
       || coalesce(' options=' || ic.reloptions::text, '')
  FROM rels r JOIN pg_index i ON i.indrelid = r.oid JOIN pg_class ic ON ic.oid = i.indexrelid
UNION ALL
SELECT format('trigger %s.%s %s', t.tgrelid::regclass, t.tgname, pg_get_triggerdef(t.oid))
  FROM rels r JOIN pg_trigger t ON t.tgrelid = r.oid
UNION ALL
SELECT format('view %s %s', r.oid::regclass, pg_get_viewdef(r.oid)) FROM rels r
 WHERE r.relkind IN ('v', 'm')
UNION ALL
SELECT format('sequence %s %s start=%s inc=%s min=%s max=%s cache=%s cycle=%s owned_by=%s',
              s.seqrelid::regclass, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement,
              s.seqmin, s.seqmax, s.seqcache, s.seqcycle,
              (SELECT format('%s.%s', d.refobjid::regclass, a.attname) FROM pg_depend d
                 JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                WHERE d.classid = 'pg_class'::regclass AND d.objid = s.seqrelid AND d.deptype = 'a'))
  FROM rels r JOIN pg_sequence s ON s.seqrelid = r.oid
UNION ALL
SELECT format('function %s acl=%s comment=%s def=%s', p.oid::regprocedure, p.proacl,
              obj_description(p.oid, 'pg_proc'), pg_get_functiondef(p.oid))
  FROM pg_proc p JOIN members m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
UNION ALL
SELECT format('type %s %s', t.oid::regtype, t.typtype)
  FROM pg_type t JOIN members m ON m.classid = 'pg_type'::regclass AND m.objid = t.oid
UNION ALL
SELECT format('schema %s owner=%s acl=%s', n.nspname, n.nspowner::regrole, n.nspacl)
  FROM pg_namespace n WHERE n.nspname = 'eventbox'
UNION ALL
SELECT format('config_dump %s condition=%s', c.rel::regclass, c.cond)
  FROM ext, unnest(ext.extconfig, ext.extcondition) AS c(rel, cond)
$$;

-- A fresh install of the current version (pg_regress created it).
SELECT extversion FROM pg_extension WHERE extname = 'pg_eventbox';
CREATE TEMP TABLE fresh AS SELECT * FROM upgrade_check.eventbox_catalog() AS line;

-- 0.1.0 as released, with state in it.
DROP EXTENSION pg_eventbox;
CREATE EXTENSION pg_eventbox VERSION '0.1.0';
-- What the releases since 0.1.0 change, as the comparison sees it (so it is known to see
-- differences).
CREATE TEMP TABLE released AS SELECT * FROM upgrade_check.eventbox_catalog() AS line;
SELECT 'only in current' AS side, left(line, 100) AS line FROM (TABLE fresh EXCEPT ALL TABLE released) f
UNION ALL
SELECT 'only in 0.1.0', left(line, 100) FROM (TABLE released EXCEPT ALL TABLE fresh) r
ORDER BY 1, 2;
CREATE ROLE regress_upgrade_app;
-- An administrator's grants on the API functions 0.2.0 creates again with more options.
GRANT EXECUTE ON FUNCTION eventbox.create_subscription(text, text[], text, text, integer, interval,
    interval, text, text, integer, text) TO regress_upgrade_app WITH GRANT OPTION;
GRANT EXECUTE ON FUNCTION eventbox.alter_subscription(text, text[], text, text, integer, interval,
    interval, text, text, integer, text, boolean) TO regress_upgrade_app;
CREATE SCHEMA "Upgrade App";
CREATE FUNCTION "Upgrade App"."On Order"(msg eventbox.inbox) RETURNS void LANGUAGE sql AS 'SELECT';
CREATE FUNCTION "Upgrade App".gone(msg eventbox.inbox) RETURNS void LANGUAGE sql AS 'SELECT';
SELECT eventbox.create_subscription('upgrade-sub', ARRAY['orders']);
SELECT eventbox.register_handler('upgrade-sub', '"Upgrade App"."On Order"(eventbox.inbox)'::regprocedure,
                                 event_type => 'OrderCreated', run_as => 'regress_upgrade_app');
SELECT eventbox.register_handler('upgrade-sub', '"Upgrade App".gone(eventbox.inbox)'::regprocedure,
                                 run_as => 'regress_upgrade_app');
-- A 0.1.0 handler whose function was dropped since: it keeps failing its check, never blocks the
-- upgrade.
DROP FUNCTION "Upgrade App".gone(eventbox.inbox);
SELECT count(*) AS handlers_before FROM eventbox.handlers;

ALTER EXTENSION pg_eventbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'pg_eventbox';
-- The grants are on the new functions (taken back before comparing with a fresh install).
SELECT p.oid::regprocedure AS function, a.privilege_type, a.is_grantable
  FROM pg_proc p, aclexplode(p.proacl) a
 WHERE a.grantee = 'regress_upgrade_app'::regrole ORDER BY 1;
-- (By name: each release may give them new last parameters.)
REVOKE ALL ON FUNCTION eventbox.create_subscription, eventbox.alter_subscription
  FROM regress_upgrade_app;
CREATE TEMP TABLE upgraded AS SELECT * FROM upgrade_check.eventbox_catalog() AS line;

-- Both sides describe many objects, and no line differs.
SELECT count(*) > 100 AS fresh_has_lines, (SELECT count(*) FROM upgraded) = count(*) AS same_count
  FROM fresh;
SELECT 'only in fresh install' AS side, line FROM (TABLE fresh EXCEPT ALL TABLE upgraded) f
UNION ALL
SELECT 'only after upgrade', line FROM (TABLE upgraded EXCEPT ALL TABLE fresh) u
ORDER BY 1, 2;

-- No column of a type pg_upgrade refuses.
SELECT a.attrelid::regclass, a.attname, a.atttypid::regtype
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
 WHERE c.relnamespace = 'eventbox'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
   AND a.atttypid IN ('regproc'::regtype, 'regprocedure'::regtype, 'regoper'::regtype,
                      'regoperator'::regtype, 'regconfig'::regtype, 'regdictionary'::regtype,
                      'regnamespace'::regtype, 'regcollation'::regtype);

-- The handlers came through as signatures that resolve to the same functions (the dropped one
-- is named by its old OID under eventbox, resolves to nothing and fails at run time, as in 0.1.0).
SELECT regexp_replace(handler, '[0-9]+', 'N') AS handler, to_regprocedure(handler) IS NOT NULL AS resolves,
       event_type
  FROM eventbox.handlers ORDER BY handler;
-- Unregistering by function works on migrated rows.
SELECT eventbox.unregister_handler('upgrade-sub', '"Upgrade App"."On Order"(eventbox.inbox)'::regprocedure,
                                   'OrderCreated');
SELECT count(*) AS handlers_after FROM eventbox.handlers;

DROP SCHEMA "Upgrade App" CASCADE;

-- 0.2.0 as released, with a role given the admin grants by hand (as 0.2.0's README showed) and a
-- subscription that dead-letters into a topic it reads (0.2.0 accepted it), then the update.
DROP EXTENSION pg_eventbox;
CREATE EXTENSION pg_eventbox VERSION '0.2.0';
-- What 0.3.0 changes.
CREATE TEMP TABLE released_0_2 AS SELECT * FROM upgrade_check.eventbox_catalog() AS line;
SELECT 'only in current' AS side, left(line, 100) AS line
  FROM (TABLE fresh EXCEPT ALL TABLE released_0_2) f
UNION ALL
SELECT 'only in 0.2.0', left(line, 100) FROM (TABLE released_0_2 EXCEPT ALL TABLE fresh) r
ORDER BY 1, 2;
GRANT USAGE ON SCHEMA eventbox TO regress_upgrade_app;
GRANT EXECUTE ON FUNCTION eventbox.drop_subscription(text), eventbox.retry(text, text)
  TO regress_upgrade_app;
SELECT eventbox.create_subscription('upgrade-loop', ARRAY['orders'], dead_letter_topic => 'orders');
ALTER EXTENSION pg_eventbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'pg_eventbox';
-- Grants given by hand are kept; the row written before the check exists is kept too, and the
-- next change of it must fix the loop.
SELECT has_function_privilege('regress_upgrade_app', 'eventbox.retry(text, text)', 'EXECUTE')
    AS kept_grant;
SELECT name, topics, dead_letter_topic FROM eventbox.subscriptions;
SELECT eventbox.alter_subscription('upgrade-loop', max_attempts => 3);
SELECT eventbox.alter_subscription('upgrade-loop', dead_letter_topic => 'orders.dead');
SELECT eventbox.drop_subscription('upgrade-loop');
REVOKE ALL ON FUNCTION eventbox.drop_subscription(text), eventbox.retry(text, text)
  FROM regress_upgrade_app;
REVOKE ALL ON SCHEMA eventbox FROM regress_upgrade_app;
-- The same catalog as a fresh install.
CREATE TEMP TABLE upgraded_0_2 AS SELECT * FROM upgrade_check.eventbox_catalog() AS line;
SELECT 'only in fresh install' AS side, line FROM (TABLE fresh EXCEPT ALL TABLE upgraded_0_2) f
UNION ALL
SELECT 'only after upgrade', line FROM (TABLE upgraded_0_2 EXCEPT ALL TABLE fresh) u
ORDER BY 1, 2;

-- 0.3.0 as released, with a subscription, a handler and a writer role in it, then the update.
DROP EXTENSION pg_eventbox;
CREATE EXTENSION pg_eventbox VERSION '0.3.0';
-- What 0.4.0 changes.
CREATE TEMP TABLE released_0_3 AS SELECT * FROM upgrade_check.eventbox_catalog() AS line;
SELECT 'only in current' AS side, left(line, 100) AS line
  FROM (TABLE fresh EXCEPT ALL TABLE released_0_3) f
UNION ALL
SELECT 'only in 0.3.0', left(line, 100) FROM (TABLE released_0_3 EXCEPT ALL TABLE fresh) r
ORDER BY 1, 2;
CREATE FUNCTION public.upgrade_on_order(msg eventbox.inbox) RETURNS void LANGUAGE sql AS 'SELECT';
SELECT eventbox.create_subscription('upgrade-0-3', ARRAY['orders'], dead_letter_topic => 'orders.dead');
SELECT eventbox.register_handler('upgrade-0-3', 'public.upgrade_on_order(eventbox.inbox)'::regprocedure,
                                 run_as => 'regress_upgrade_app');
SELECT eventbox.grant_writer('regress_upgrade_app');
-- A grant given by hand on register_handler(), which 0.4.0 creates again with batch.
GRANT EXECUTE ON FUNCTION eventbox.register_handler(text, regprocedure, text, name)
  TO regress_upgrade_app WITH GRANT OPTION;
ALTER EXTENSION pg_eventbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'pg_eventbox';
-- State and recorded grants came through; the handler registered before is not a batch one.
SELECT name, topics, dead_letter_topic FROM eventbox.subscriptions;
SELECT handler, batch FROM eventbox.handlers;
SELECT has_function_privilege('regress_upgrade_app', 'eventbox.send(text, jsonb, text, jsonb, uuid)',
                              'EXECUTE') AS writer_kept;
SELECT a.privilege_type, a.is_grantable
  FROM pg_proc p, aclexplode(p.proacl) a
 WHERE p.oid = 'eventbox.register_handler(text, regprocedure, text, name, boolean)'::regprocedure
   AND a.grantee = 'regress_upgrade_app'::regrole;
REVOKE ALL ON FUNCTION eventbox.register_handler(text, regprocedure, text, name, boolean)
  FROM regress_upgrade_app;
SELECT eventbox.drop_subscription('upgrade-0-3');
SELECT eventbox.revoke_writer('regress_upgrade_app');
DROP FUNCTION public.upgrade_on_order(eventbox.inbox);
-- The same catalog as a fresh install.
CREATE TEMP TABLE upgraded_0_3 AS SELECT * FROM upgrade_check.eventbox_catalog() AS line;
SELECT 'only in fresh install' AS side, line FROM (TABLE fresh EXCEPT ALL TABLE upgraded_0_3) f
UNION ALL
SELECT 'only after upgrade', line FROM (TABLE upgraded_0_3 EXCEPT ALL TABLE fresh) u
ORDER BY 1, 2;

-- 0.4.0 as released, with a batch handler, a subscription that keeps raw bytes, a bulk HTTP
-- destination and a writer role in it, then the update.
DROP EXTENSION pg_eventbox;
CREATE EXTENSION pg_eventbox VERSION '0.4.0';
-- What 0.5.0 changes.
CREATE TEMP TABLE released_0_4 AS SELECT * FROM upgrade_check.eventbox_catalog() AS line;
SELECT 'only in current' AS side, left(line, 100) AS line
  FROM (TABLE fresh EXCEPT ALL TABLE released_0_4) f
UNION ALL
SELECT 'only in 0.4.0', left(line, 100) FROM (TABLE released_0_4 EXCEPT ALL TABLE fresh) r
ORDER BY 1, 2;
CREATE FUNCTION public.upgrade_on_orders(msgs eventbox.inbox[]) RETURNS void LANGUAGE sql AS 'SELECT';
SELECT eventbox.create_subscription('upgrade-0-4', ARRAY['orders'], keep_raw => true);
SELECT eventbox.register_handler('upgrade-0-4', 'public.upgrade_on_orders(eventbox.inbox[])'::regprocedure,
                                 run_as => 'regress_upgrade_app', batch => true);
SELECT eventbox.create_http_destination('crm', 'http://127.0.0.1:9/records', batch_size => 100,
                                        batch_format => 'ndjson');
SELECT eventbox.grant_writer('regress_upgrade_app');
-- A grant given by hand on create_subscription(), which 0.5.0 creates again with value_format,
-- key_format and membership.
GRANT EXECUTE ON FUNCTION eventbox.create_subscription(text, text[], text, text, integer, interval,
    interval, text, text, integer, text, text[], text, text, text, boolean, text, boolean)
  TO regress_upgrade_app;
ALTER EXTENSION pg_eventbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'pg_eventbox';
-- State and recorded grants came through; the subscription has the defaults of the new options.
SELECT name, value_format, key_format, membership FROM eventbox.subscriptions;
SELECT p.oid::regprocedure AS function, a.privilege_type, a.is_grantable
  FROM pg_proc p, aclexplode(p.proacl) a
 WHERE p.proname = 'create_subscription' AND p.pronamespace = 'eventbox'::regnamespace
   AND a.grantee = 'regress_upgrade_app'::regrole;
REVOKE ALL ON FUNCTION eventbox.create_subscription FROM regress_upgrade_app;
SELECT name, topics, keep_raw FROM eventbox.subscriptions;
SELECT handler, batch FROM eventbox.handlers;
SELECT topic, batch_size, batch_format FROM eventbox.http_destinations;
SELECT has_function_privilege('regress_upgrade_app', 'eventbox.send(text, jsonb, text, jsonb, uuid)',
                              'EXECUTE') AS writer_kept;
SELECT eventbox.drop_http_destination('crm');
SELECT eventbox.drop_subscription('upgrade-0-4');
SELECT eventbox.revoke_writer('regress_upgrade_app');
DROP FUNCTION public.upgrade_on_orders(eventbox.inbox[]);
-- The same catalog as a fresh install.
CREATE TEMP TABLE upgraded_0_4 AS SELECT * FROM upgrade_check.eventbox_catalog() AS line;
SELECT 'only in fresh install' AS side, line FROM (TABLE fresh EXCEPT ALL TABLE upgraded_0_4) f
UNION ALL
SELECT 'only after upgrade', line FROM (TABLE upgraded_0_4 EXCEPT ALL TABLE fresh) u
ORDER BY 1, 2;

-- 0.5.0 as released, with a group-membership subscription reading registry values and keeping
-- raw headers, and a topic encoded through the registry, then the update.
DROP EXTENSION pg_eventbox;
CREATE EXTENSION pg_eventbox VERSION '0.5.0';
-- What 0.6.0 changes.
CREATE TEMP TABLE released_0_5 AS SELECT * FROM upgrade_check.eventbox_catalog() AS line;
SELECT 'only in current' AS side, left(line, 100) AS line
  FROM (TABLE fresh EXCEPT ALL TABLE released_0_5) f
UNION ALL
SELECT 'only in 0.5.0', left(line, 100) FROM (TABLE released_0_5 EXCEPT ALL TABLE fresh) r
ORDER BY 1, 2;
SELECT eventbox.create_subscription('upgrade-0-5', ARRAY['orders'], value_format => 'registry',
                                    membership => 'group', keep_raw => true);
SELECT eventbox.set_topic_format('orders-out', 'registry', 'orders-out-value');
-- A subscription with a handler and messages in every state: processed, dead, waiting for a
-- retry (due), received; one lane with work, one without, one with a queued replay.
CREATE FUNCTION public.upgrade_on_lane(msg eventbox.inbox) RETURNS void LANGUAGE sql AS 'SELECT';
SELECT eventbox.create_subscription('upgrade-0-5-lanes', ARRAY['orders']);
SELECT eventbox.register_handler('upgrade-0-5-lanes',
                                 'public.upgrade_on_lane(eventbox.inbox)'::regprocedure,
                                 run_as => 'regress_upgrade_app');
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", payload,
                            status, attempts, next_attempt_at, processed_at, mode)
VALUES ('upgrade-0-5-lanes', 'm0', 'orders', 0, 0, '{}', 'processed', 1, NULL, now(), 'live'),
       ('upgrade-0-5-lanes', 'm1', 'orders', 0, 1, '{}', 'dead', 3, NULL, NULL, 'live'),
       ('upgrade-0-5-lanes', 'm2', 'orders', 0, 2, '{}', 'retry', 1, now() - interval '1 second',
        NULL, 'live'),
       ('upgrade-0-5-lanes', 'm3', 'orders', 0, 3, '{}', 'received', 0, NULL, NULL, 'live'),
       ('upgrade-0-5-lanes', 'm4', 'orders', 1, 7, '{}', 'processed', 1, NULL, now(), 'live'),
       ('upgrade-0-5-lanes', 'm5', 'orders', 1, 8, '{}', 'processed', 1, NULL, now(), 'live'),
       ('upgrade-0-5-lanes', 'm6', 'orders', 2, 4, '{}', 'received', 0, NULL, NULL, 'replay');
-- Outbox rows of every status: pending, pending after failed attempts, sent, given up.
INSERT INTO eventbox.outbox (message_id, topic, payload, status, attempts, next_attempt_at,
                             sent_at, kafka_partition, kafka_offset, last_error)
VALUES ('00000000-0000-0000-0000-000000000001', 'orders-out', '\x01', 'pending', 0, NULL, NULL,
        NULL, NULL, NULL),
       ('00000000-0000-0000-0000-000000000002', 'orders-out', '\x02', 'pending', 2,
        '2030-01-01 00:00:00+00', NULL, NULL, NULL, 'broker down'),
       ('00000000-0000-0000-0000-000000000003', 'orders-out', '\x03', 'sent', 1, NULL,
        '2026-01-01 00:00:00+00', 3, 41, NULL),
       ('00000000-0000-0000-0000-000000000004', 'orders-out', '\x04', 'failed', 5, NULL, NULL,
        NULL, NULL, 'rejected'),
       ('00000000-0000-0000-0000-000000000005', 'orders-out', '\x05', 'pending', 0, NULL, NULL,
        NULL, NULL, NULL);
-- An index the update does not know: refused (55000), nothing changed, until it is dropped.
CREATE INDEX upgrade_outbox_topic_idx ON eventbox.outbox (topic);
ALTER EXTENSION pg_eventbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'pg_eventbox';
DROP INDEX eventbox.upgrade_outbox_topic_idx;
ALTER EXTENSION pg_eventbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'pg_eventbox';
-- Each lane range's position is at its first waiting message, or past its last one.
SELECT topic, "partition", replay, position, version FROM eventbox.inbox_positions
 ORDER BY 1, 2, 3;
-- The same work to do: the retry, the received and the replayed message run, nothing else.
SELECT eventbox.process('upgrade-0-5-lanes');
SELECT message_id, status, attempts FROM eventbox.inbox ORDER BY message_id;
SELECT topic, "partition", replay, position FROM eventbox.inbox_positions ORDER BY 1, 2, 3;
SELECT eventbox.drop_subscription('upgrade-0-5-lanes');
DROP FUNCTION public.upgrade_on_lane(eventbox.inbox);
-- State came through.
SELECT name, topics, value_format, membership, keep_raw FROM eventbox.subscriptions;
SELECT topic, value_format, value_subject FROM eventbox.topic_formats;
SELECT eventbox.reset_topic_format('orders-out');
SELECT eventbox.drop_subscription('upgrade-0-5');
-- The outbox's rows came through, as the view shows them (the sent row is past a retention of
-- 0), and where they are kept: every row in the open table, the attempted and failed ones held,
-- the sent one acknowledged, W at the lowest pending id.
SHOW eventbox.outbox_retention;
SELECT id, message_id, payload, status, attempts, next_attempt_at, sent_at, last_error
  FROM eventbox.outbox ORDER BY id;
SELECT n, id, message_id FROM eventbox._outbox_rows ORDER BY id;
SELECT id, status, attempts, last_error FROM eventbox.outbox_held ORDER BY id;
SELECT n, acked_at, max_id, ids, partitions, offsets FROM eventbox._outbox_acks;
SELECT n, state, settled_below, gaps FROM eventbox.outbox_state ORDER BY n;
SELECT status, messages FROM eventbox.outbox_stats ORDER BY status;
SELECT eventbox.truncate_outbox();
-- The same catalog as a fresh install.
CREATE TEMP TABLE upgraded_0_5 AS SELECT * FROM upgrade_check.eventbox_catalog() AS line;
SELECT 'only in fresh install' AS side, line FROM (TABLE fresh EXCEPT ALL TABLE upgraded_0_5) f
UNION ALL
SELECT 'only after upgrade', line FROM (TABLE upgraded_0_5 EXCEPT ALL TABLE fresh) u
ORDER BY 1, 2;

-- Leave the database as the other suites expect it: a fresh install.
DROP SCHEMA upgrade_check CASCADE;
DROP EXTENSION pg_eventbox;
DROP ROLE regress_upgrade_app;
CREATE EXTENSION pg_eventbox;
