-- Privileges: nothing in schema eventbox is granted to PUBLIC; a writer role needs exactly the
-- README's grants to send, and cannot touch the outbox directly.
\set SHOW_CONTEXT never
\set show_sqlstate 'SELECT :''LAST_ERROR_SQLSTATE'' AS sqlstate;'
SELECT eventbox.truncate_outbox();

-- Every object of the schema, with its ACL as it is in effect (a NULL ACL means the built-in
-- default, which for functions includes EXECUTE for PUBLIC).
CREATE TEMP VIEW eventbox_acls AS
SELECT 'schema' AS kind, n.nspname::text AS object, coalesce(n.nspacl, acldefault('n'::"char", n.nspowner)) AS acl
  FROM pg_namespace n WHERE n.nspname = 'eventbox'
UNION ALL
SELECT CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' WHEN 'S' THEN 'sequence'
                      WHEN 'i' THEN 'index' ELSE c.relkind::text END,
       c.oid::regclass::text,
       coalesce(c.relacl, acldefault((CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END)::"char", c.relowner))
  FROM pg_class c WHERE c.relnamespace = 'eventbox'::regnamespace
UNION ALL
SELECT 'function', p.oid::regprocedure::text, coalesce(p.proacl, acldefault('f'::"char", p.proowner))
  FROM pg_proc p WHERE p.pronamespace = 'eventbox'::regnamespace;

SELECT kind, object FROM eventbox_acls ORDER BY kind, object;
-- No privilege on any of them for PUBLIC (grantee 0), and none granted to any role other than
-- the owner.
SELECT kind, object, a.privilege_type, a.grantee::regrole AS grantee
  FROM eventbox_acls, aclexplode(acl) a
 WHERE a.grantee = 0 OR a.grantee <> (SELECT extowner FROM pg_extension WHERE extname = 'pg_eventbox');
-- Everything belongs to the role that created the extension.
SELECT count(*) AS objects_not_owned_by_extension_owner
  FROM (SELECT nspowner AS owner FROM pg_namespace WHERE nspname = 'eventbox'
        UNION ALL SELECT relowner FROM pg_class WHERE relnamespace = 'eventbox'::regnamespace
        UNION ALL SELECT proowner FROM pg_proc WHERE pronamespace = 'eventbox'::regnamespace) o
 WHERE owner <> (SELECT extowner FROM pg_extension WHERE extname = 'pg_eventbox');

-- send() runs as its owner with a pinned search_path; the other functions are not definers.
SELECT p.oid::regprocedure AS function, p.prosecdef AS security_definer, p.proconfig
  FROM pg_proc p WHERE p.pronamespace = 'eventbox'::regnamespace ORDER BY p.oid::regprocedure::text;

-- The extension created no roles.
SELECT count(*) AS eventbox_roles FROM pg_roles
 WHERE rolname ILIKE '%eventbox%' AND rolname NOT LIKE 'regress\_eventbox\_%';

-- A role with no grants: no access to anything, as has_*_privilege sees it ...
CREATE ROLE regress_eventbox_nobody;
SELECT has_schema_privilege('regress_eventbox_nobody', 'eventbox', 'USAGE') AS schema_usage,
       has_schema_privilege('regress_eventbox_nobody', 'eventbox', 'CREATE') AS schema_create,
       has_function_privilege('regress_eventbox_nobody',
                              'eventbox.send(text, jsonb, text, jsonb, uuid)', 'EXECUTE') AS send_jsonb,
       has_function_privilege('regress_eventbox_nobody',
                              'eventbox.send(text, bytea, text, jsonb, uuid)', 'EXECUTE') AS send_bytea,
       has_function_privilege('regress_eventbox_nobody', 'eventbox.next_outbox_id()', 'EXECUTE') AS next_outbox_id,
       has_function_privilege('regress_eventbox_nobody', 'eventbox.workers()', 'EXECUTE') AS workers_fn;
SELECT t.relname,
       has_table_privilege('regress_eventbox_nobody', c.oid, 'SELECT') AS sel,
       has_table_privilege('regress_eventbox_nobody', c.oid, 'INSERT') AS ins,
       has_table_privilege('regress_eventbox_nobody', c.oid, 'UPDATE') AS upd,
       has_table_privilege('regress_eventbox_nobody', c.oid, 'DELETE') AS del,
       has_table_privilege('regress_eventbox_nobody', c.oid, 'TRUNCATE') AS trunc,
       has_table_privilege('regress_eventbox_nobody', c.oid, 'REFERENCES') AS refs,
       has_table_privilege('regress_eventbox_nobody', c.oid, 'TRIGGER') AS trig
  FROM pg_class c CROSS JOIN LATERAL (SELECT c.relname::text) t(relname)
 WHERE c.relnamespace = 'eventbox'::regnamespace AND c.relkind IN ('r', 'v')
 ORDER BY 1;
SELECT has_sequence_privilege('regress_eventbox_nobody', 'eventbox.outbox_id_seq', 'USAGE') AS seq_usage,
       has_sequence_privilege('regress_eventbox_nobody', 'eventbox.outbox_id_seq', 'SELECT') AS seq_select,
       has_sequence_privilege('regress_eventbox_nobody', 'eventbox.outbox_id_seq', 'UPDATE') AS seq_update;

-- ... and in practice.
SET ROLE regress_eventbox_nobody;
SELECT eventbox.send('t', '{}'::jsonb);
:show_sqlstate
SELECT eventbox.send('t', '\x00'::bytea);
:show_sqlstate
SELECT count(*) FROM eventbox.outbox;
:show_sqlstate
INSERT INTO eventbox.outbox (message_id, topic) VALUES (gen_random_uuid(), 't');
:show_sqlstate
SELECT * FROM eventbox.workers;
:show_sqlstate
RESET ROLE;

-- USAGE on the schema alone is not enough either: EXECUTE is revoked on the functions themselves.
CREATE ROLE regress_eventbox_usage_only;
GRANT USAGE ON SCHEMA eventbox TO regress_eventbox_usage_only;
SET ROLE regress_eventbox_usage_only;
SELECT eventbox.send('t', '{}'::jsonb);
:show_sqlstate
SELECT eventbox.send('t', '\x00'::bytea);
:show_sqlstate
SELECT eventbox.next_outbox_id();
:show_sqlstate
SELECT count(*) FROM eventbox.outbox;
:show_sqlstate
SELECT count(*) FROM eventbox.outbox_stats;
:show_sqlstate
SELECT count(*) FROM eventbox.workers;
:show_sqlstate
SELECT nextval('eventbox.outbox_id_seq');
:show_sqlstate
RESET ROLE;

-- The README's writer grants: the role can send (send() is SECURITY DEFINER) ...
CREATE ROLE regress_eventbox_writer;
GRANT USAGE ON SCHEMA eventbox TO regress_eventbox_writer;
GRANT EXECUTE ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid),
                          eventbox.send(text, bytea, text, jsonb, uuid) TO regress_eventbox_writer;
-- The grants made so far, as the ACL view sees them (it does see grants).
SELECT kind, object, a.privilege_type, a.grantee::regrole AS grantee
  FROM eventbox_acls, aclexplode(acl) a
 WHERE a.grantee <> (SELECT extowner FROM pg_extension WHERE extname = 'pg_eventbox')
 ORDER BY kind, object, grantee::text;
SET ROLE regress_eventbox_writer;
SELECT eventbox.send('writer', '{"n": 1}'::jsonb, key => 'k', headers => '{"event_type": "W"}')
    IS NOT NULL AS sent_jsonb;
SELECT eventbox.send('writer', '\x0102'::bytea) IS NOT NULL AS sent_bytea;
SELECT eventbox.send('writer', '{"n": 3}'::jsonb, message_id => '0190a6d2-0000-7000-8000-0000000000aa');
BEGIN;
SELECT eventbox.send('writer', '{"n": 4}'::jsonb) IS NOT NULL AS sent_then_rolled_back;
ROLLBACK;
-- ... gets the same validation errors as anyone ...
SELECT eventbox.send('bad topic', '{}'::jsonb);
:show_sqlstate
-- ... but cannot read, write or empty the outbox directly, nor draw ids, nor see the workers.
SELECT count(*) FROM eventbox.outbox;
:show_sqlstate
SELECT message_id FROM eventbox.outbox WHERE false;
:show_sqlstate
INSERT INTO eventbox.outbox (message_id, topic) VALUES (gen_random_uuid(), 't');
:show_sqlstate
UPDATE eventbox.outbox SET status = 'sent';
:show_sqlstate
DELETE FROM eventbox.outbox;
:show_sqlstate
-- (The outbox is a view, which TRUNCATE refuses for everyone, 42809; its rows are in the rotated
-- tables, which the writer cannot truncate.)
TRUNCATE eventbox.outbox;
:show_sqlstate
TRUNCATE eventbox.outbox_rows_0;
:show_sqlstate
TRUNCATE eventbox.outbox_rows_1, eventbox.outbox_rows_2;
:show_sqlstate
TRUNCATE eventbox.outbox_held;
:show_sqlstate
SELECT eventbox.truncate_outbox();
:show_sqlstate
COPY eventbox.outbox TO STDOUT;
:show_sqlstate
SELECT count(*) FROM eventbox.outbox_stats;
:show_sqlstate
SELECT count(*) FROM eventbox.workers;
:show_sqlstate
SELECT * FROM eventbox.workers();
:show_sqlstate
SELECT eventbox.next_outbox_id();
:show_sqlstate
SELECT nextval('eventbox.outbox_id_seq');
:show_sqlstate
SELECT setval('eventbox.outbox_id_seq', 1);
:show_sqlstate
-- Nor create objects in the schema.
CREATE TABLE eventbox.mine (id int);
:show_sqlstate
CREATE FUNCTION eventbox.send(topic text, payload text) RETURNS uuid LANGUAGE sql
    AS $$ SELECT NULL::uuid $$;
:show_sqlstate
RESET ROLE;

-- What the writer sent is there, exactly as sent.
SELECT topic, convert_from(key, 'UTF8') AS key, payload, headers, status, attempts
  FROM eventbox.outbox ORDER BY id;
SELECT count(*) AS with_given_id FROM eventbox.outbox
 WHERE message_id = '0190a6d2-0000-7000-8000-0000000000aa';

-- A member of the writer role inherits the right to send.
CREATE ROLE regress_eventbox_app IN ROLE regress_eventbox_writer;
SET ROLE regress_eventbox_app;
SELECT eventbox.send('writer', '{"n": 5}'::jsonb) IS NOT NULL AS sent_by_member;
SELECT count(*) FROM eventbox.outbox;
:show_sqlstate
RESET ROLE;

-- Revoking EXECUTE takes the right away again.
REVOKE EXECUTE ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid) FROM regress_eventbox_writer;
SET ROLE regress_eventbox_writer;
SELECT eventbox.send('writer', '{"n": 6}'::jsonb);
:show_sqlstate
SELECT eventbox.send('writer', '\x06'::bytea) IS NOT NULL AS bytea_still_granted;
RESET ROLE;

SELECT count(*) AS rows_sent_by_writer FROM eventbox.outbox WHERE topic = 'writer';

-- Clean up: the grants go with DROP OWNED, then the roles.
SELECT eventbox.truncate_outbox();
DROP OWNED BY regress_eventbox_nobody, regress_eventbox_usage_only, regress_eventbox_writer,
              regress_eventbox_app;
DROP ROLE regress_eventbox_app;
DROP ROLE regress_eventbox_writer;
DROP ROLE regress_eventbox_usage_only;
DROP ROLE regress_eventbox_nobody;
-- And the schema is back to no grants at all.
SELECT count(*) AS grants_left FROM eventbox_acls, aclexplode(acl) a
 WHERE a.grantee <> (SELECT extowner FROM pg_extension WHERE extname = 'pg_eventbox');
