-- Grants by role (issue 27, item 8): eventbox.grant_writer() and grant_admin() give a role
-- exactly the installed version's set, revoke_writer() and revoke_admin() take it back, and
-- _regrant() (which every upgrade script runs last) gives recorded roles their set again.
-- See docs/guide/security.md.
\set SHOW_CONTEXT never
\set VERBOSITY default
SET client_min_messages = warning;

CREATE ROLE regress_grants_writer;
CREATE ROLE regress_grants_admin;
CREATE ROLE regress_grants_both;

-- Before: nothing.
SELECT has_schema_privilege('regress_grants_writer', 'eventbox', 'USAGE') AS writer_usage,
       has_function_privilege('regress_grants_writer',
           'eventbox.send(text, jsonb, text, jsonb, uuid)', 'EXECUTE') AS writer_send;

SELECT eventbox.grant_writer('regress_grants_writer');
SELECT eventbox.grant_admin('regress_grants_admin');
SELECT eventbox.grant_writer('regress_grants_both');
SELECT eventbox.grant_admin('regress_grants_both');
-- Granting twice changes nothing.
SELECT eventbox.grant_admin('regress_grants_admin');
SELECT role, kind FROM eventbox.role_grants ORDER BY 1, 2;

-- What each role holds, by object (every privilege the roles hold in schema eventbox).
CREATE TEMP VIEW held AS
SELECT r.rolname AS role, 'function' AS kind, p.oid::regprocedure::text AS object
  FROM pg_proc p, aclexplode(p.proacl) a, pg_roles r
 WHERE p.pronamespace = 'eventbox'::regnamespace AND a.grantee = r.oid
   AND r.rolname LIKE 'regress_grants_%'
UNION ALL
SELECT r.rolname, 'relation', c.oid::regclass::text || ' ' || a.privilege_type
  FROM pg_class c, aclexplode(c.relacl) a, pg_roles r
 WHERE c.relnamespace = 'eventbox'::regnamespace AND a.grantee = r.oid
   AND r.rolname LIKE 'regress_grants_%'
UNION ALL
SELECT r.rolname, 'schema', n.nspname || ' ' || a.privilege_type
  FROM pg_namespace n, aclexplode(n.nspacl) a, pg_roles r
 WHERE n.nspname = 'eventbox' AND a.grantee = r.oid AND r.rolname LIKE 'regress_grants_%';
SELECT kind, object FROM held WHERE role = 'regress_grants_writer' ORDER BY 1, 2;
SELECT kind, object FROM held WHERE role = 'regress_grants_admin' ORDER BY 1, 2;

-- Every function of the API a caller may use (no leading underscore) is in the writer set, the
-- admin set, or is one of those only the extension's owner runs: a function a later release adds
-- without deciding which set it belongs to shows here.
SELECT p.oid::regprocedure AS unclassified
  FROM pg_proc p
 WHERE p.pronamespace = 'eventbox'::regnamespace AND p.proname !~ '^_'
   AND p.proname NOT IN ('grant_writer', 'grant_admin', 'revoke_writer', 'revoke_admin',
                         'next_outbox_id')
   AND NOT has_function_privilege('regress_grants_both', p.oid, 'EXECUTE')
 ORDER BY 1;
-- next_outbox_id() is called by send() and the outbox's default; nobody else needs it.

-- The admin can use what it was given: create, change and drop a subscription, read the views.
SET ROLE regress_grants_admin;
SELECT eventbox.create_subscription('regress-grants', ARRAY['regress-grants-topic']);
SELECT eventbox.alter_subscription('regress-grants', max_attempts => 3);
SELECT name, max_attempts FROM eventbox.subscriptions WHERE name = 'regress-grants';
SELECT count(*) >= 0 AS reads_workers FROM eventbox.workers;
SELECT eventbox.drop_subscription('regress-grants');
-- ... but not send(), nor grant itself more.
SELECT eventbox.send('regress-grants-out', '{}'::jsonb);
SELECT eventbox.grant_writer('regress_grants_admin');
RESET ROLE;
-- The writer can send, and nothing else.
SET ROLE regress_grants_writer;
SELECT eventbox.send('regress-grants-out', '{"n": 1}'::jsonb) IS NOT NULL AS sent;
SELECT eventbox.create_subscription('regress-grants', ARRAY['t']);
SELECT count(*) FROM eventbox.outbox;
RESET ROLE;
DELETE FROM eventbox.outbox WHERE topic = 'regress-grants-out';

-- A privilege taken by hand comes back with _regrant(), as after an upgrade that creates the
-- functions again.
REVOKE EXECUTE ON FUNCTION eventbox.retry(text, text) FROM regress_grants_admin;
SELECT has_function_privilege('regress_grants_admin', 'eventbox.retry(text, text)', 'EXECUTE')
    AS before_regrant;
SELECT eventbox._regrant();
SELECT has_function_privilege('regress_grants_admin', 'eventbox.retry(text, text)', 'EXECUTE')
    AS after_regrant;

-- Revoking one set keeps the other, and the schema's USAGE with it.
SELECT eventbox.revoke_writer('regress_grants_both');
SELECT count(*) AS writer_functions_left FROM held
 WHERE role = 'regress_grants_both' AND object LIKE 'eventbox.send(%';
SELECT has_schema_privilege('regress_grants_both', 'eventbox', 'USAGE') AS both_keeps_usage;
-- Revoking everything leaves nothing, and the roles can be dropped.
SELECT eventbox.revoke_admin('regress_grants_both');
SELECT eventbox.revoke_admin('regress_grants_admin');
SELECT eventbox.revoke_writer('regress_grants_writer');
SELECT count(*) AS privileges_left FROM held;
SELECT count(*) AS recorded_left FROM eventbox.role_grants;

-- Bad input: a role that does not exist, NULL, PUBLIC.
SELECT eventbox.grant_admin('regress_grants_nobody');
SELECT eventbox.grant_writer(NULL);
SELECT eventbox.grant_writer('public');

DROP VIEW held;
DROP ROLE regress_grants_writer, regress_grants_admin, regress_grants_both;
