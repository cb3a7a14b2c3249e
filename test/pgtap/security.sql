-- pgTAP: privileges and security (docs/guide/security.md). Roles are created inside the
-- transaction and vanish with the ROLLBACK.
BEGIN;
CREATE EXTENSION IF NOT EXISTS pg_eventbox;

SELECT plan(52);

-- Nothing in schema eventbox is granted to PUBLIC.
SELECT schema_privs_are('eventbox', 'public', '{}'::name[], 'PUBLIC has no privilege on schema eventbox');
SELECT table_privs_are('eventbox', 'outbox', 'public', '{}'::name[], 'PUBLIC has no privilege on eventbox.outbox');
SELECT table_privs_are('eventbox', 'outbox_stats', 'public', '{}'::name[],
                       'PUBLIC has no privilege on eventbox.outbox_stats');
SELECT table_privs_are('eventbox', 'workers', 'public', '{}'::name[], 'PUBLIC has no privilege on eventbox.workers');
SELECT sequence_privs_are('eventbox', 'outbox_id_seq', 'public', '{}'::name[],
                          'PUBLIC has no privilege on eventbox.outbox_id_seq');
SELECT function_privs_are('eventbox', 'send', ARRAY['text', 'jsonb', 'text', 'jsonb', 'uuid'], 'public',
                          '{}'::name[], 'PUBLIC cannot execute send(jsonb)');
SELECT function_privs_are('eventbox', 'send', ARRAY['text', 'bytea', 'text', 'jsonb', 'uuid'], 'public',
                          '{}'::name[], 'PUBLIC cannot execute send(bytea)');
SELECT function_privs_are('eventbox', 'next_outbox_id', '{}'::name[], 'public', '{}'::name[],
                          'PUBLIC cannot execute next_outbox_id()');
SELECT function_privs_are('eventbox', 'workers', '{}'::name[], 'public', '{}'::name[],
                          'PUBLIC cannot execute workers()');
-- The same, from the catalogs, for every object the schema holds now or later: no ACL entry
-- for PUBLIC (grantee 0) in the effective ACL (a NULL ACL is the built-in default, which
-- grants EXECUTE on functions to PUBLIC).
SELECT is_empty($$
    SELECT c.oid::regclass::text FROM pg_class c,
           aclexplode(coalesce(c.relacl, acldefault((CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END)::"char",
                                                    c.relowner))) a
     WHERE c.relnamespace = 'eventbox'::regnamespace AND a.grantee = 0
    UNION ALL
    SELECT p.oid::regprocedure::text FROM pg_proc p,
           aclexplode(coalesce(p.proacl, acldefault('f'::"char", p.proowner))) a
     WHERE p.pronamespace = 'eventbox'::regnamespace AND a.grantee = 0
    UNION ALL
    SELECT n.nspname::text FROM pg_namespace n,
           aclexplode(coalesce(n.nspacl, acldefault('n'::"char", n.nspowner))) a
     WHERE n.nspname = 'eventbox' AND a.grantee = 0$$,
    'no object in schema eventbox grants anything to PUBLIC');

-- The extension created no roles (only this test's regress_eventbox_* roles may match).
SELECT is_empty($$SELECT rolname FROM pg_roles
                   WHERE rolname ILIKE '%eventbox%' AND rolname NOT LIKE 'regress\_eventbox\_%'$$,
                'the extension created no roles');
SELECT is_empty($$SELECT 1 FROM pg_shdepend d JOIN pg_extension e ON d.objid = e.oid
                   WHERE d.classid = 'pg_extension'::regclass AND e.extname = 'pg_eventbox'
                     AND d.deptype <> 'o'$$,
                'the extension depends on no role other than its owner');

-- A role with no grants at all.
CREATE ROLE regress_eventbox_nobody;
SELECT schema_privs_are('eventbox', 'regress_eventbox_nobody', '{}'::name[],
                        'a new role has no privilege on schema eventbox');
SELECT function_privs_are('eventbox', 'send', ARRAY['text', 'jsonb', 'text', 'jsonb', 'uuid'],
                          'regress_eventbox_nobody', '{}'::name[], 'a new role cannot execute send(jsonb)');
SELECT table_privs_are('eventbox', 'outbox', 'regress_eventbox_nobody', '{}'::name[],
                       'a new role has no privilege on the outbox');
SET ROLE regress_eventbox_nobody;
SELECT throws_ok($$SELECT eventbox.send('t', '{}'::jsonb)$$, '42501', NULL,
                 'send(jsonb) without grants: 42501');
SELECT throws_ok($$SELECT eventbox.send('t', '\x00'::bytea)$$, '42501', NULL,
                 'send(bytea) without grants: 42501');
SELECT throws_ok($$SELECT * FROM eventbox.outbox$$, '42501', NULL, 'reading the outbox without grants: 42501');
RESET ROLE;

-- Schema USAGE alone does not give EXECUTE.
CREATE ROLE regress_eventbox_usage_only;
GRANT USAGE ON SCHEMA eventbox TO regress_eventbox_usage_only;
SET ROLE regress_eventbox_usage_only;
SELECT throws_ok($$SELECT eventbox.send('t', '{}'::jsonb)$$, '42501', 'permission denied for function send',
                 'send(jsonb) with schema USAGE only: permission denied for function send');
SELECT throws_ok($$SELECT eventbox.send('t', '\x00'::bytea)$$, '42501', 'permission denied for function send',
                 'send(bytea) with schema USAGE only: permission denied for function send');
RESET ROLE;

-- The writer grants of docs/guide/security.md.
CREATE ROLE regress_eventbox_writer;
GRANT USAGE ON SCHEMA eventbox TO regress_eventbox_writer;
GRANT EXECUTE ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid),
                          eventbox.send(text, bytea, text, jsonb, uuid) TO regress_eventbox_writer;
SELECT function_privs_are('eventbox', 'send', ARRAY['text', 'jsonb', 'text', 'jsonb', 'uuid'],
                          'regress_eventbox_writer', ARRAY['EXECUTE'], 'the writer can execute send(jsonb)');
SELECT function_privs_are('eventbox', 'send', ARRAY['text', 'bytea', 'text', 'jsonb', 'uuid'],
                          'regress_eventbox_writer', ARRAY['EXECUTE'], 'the writer can execute send(bytea)');
SELECT function_privs_are('eventbox', 'next_outbox_id', '{}'::name[], 'regress_eventbox_writer', '{}'::name[],
                          'the writer cannot execute next_outbox_id()');
SELECT table_privs_are('eventbox', 'outbox', 'regress_eventbox_writer', '{}'::name[],
                       'the writer has no table privilege on the outbox');
SELECT sequence_privs_are('eventbox', 'outbox_id_seq', 'regress_eventbox_writer', '{}'::name[],
                          'the writer has no privilege on the id sequence');

SET ROLE regress_eventbox_writer;
SELECT lives_ok($$SELECT eventbox.send('pgtap.writer', '{"n": 1}'::jsonb, key => 'k',
                                       headers => '{"event_type": "T"}',
                                       message_id => '0190a6d2-0000-7000-8000-00000000f001')$$,
                'the writer can send jsonb');
SELECT lives_ok($$SELECT eventbox.send('pgtap.writer', '\x0102'::bytea,
                                       message_id => '0190a6d2-0000-7000-8000-00000000f002')$$,
                'the writer can send bytea');
SELECT throws_ok($$SELECT eventbox.send('bad topic', '{}'::jsonb)$$, '22023', NULL,
                 'the writer gets the validation errors (22023)');
SELECT throws_ok($$SELECT eventbox.send('pgtap.writer', '{}'::jsonb,
                                        message_id => '0190a6d2-0000-7000-8000-00000000f001')$$,
                 '23505', NULL, 'a duplicate message_id from the writer: 23505');
SELECT throws_ok($$SELECT * FROM eventbox.outbox$$, '42501', 'permission denied for view outbox',
                 'the writer cannot SELECT from the outbox');
SELECT throws_ok($$INSERT INTO eventbox.outbox (message_id, topic) VALUES (gen_random_uuid(), 't')$$,
                 '42501', 'permission denied for view outbox', 'the writer cannot INSERT into the outbox');
SELECT throws_ok($$UPDATE eventbox.outbox SET status = 'sent'$$, '42501',
                 'permission denied for view outbox', 'the writer cannot UPDATE the outbox');
SELECT throws_ok($$DELETE FROM eventbox.outbox$$, '42501', 'permission denied for view outbox',
                 'the writer cannot DELETE from the outbox');
-- The outbox is a view (TRUNCATE refuses it for everyone, 42809); its rows are in the rotated
-- tables.
SELECT throws_ok($$TRUNCATE eventbox.outbox_rows_0, eventbox.outbox_rows_1, eventbox.outbox_rows_2$$,
                 '42501', 'permission denied for table outbox_rows_0',
                 'the writer cannot TRUNCATE the outbox''s tables');
SELECT throws_ok($$SELECT eventbox.truncate_outbox()$$, '42501',
                 'permission denied for function truncate_outbox',
                 'the writer cannot empty the outbox with truncate_outbox() either');
SELECT throws_ok($$SELECT * FROM eventbox.outbox_stats$$, '42501', NULL,
                 'the writer cannot read outbox_stats');
SELECT throws_ok($$SELECT * FROM eventbox.workers$$, '42501', NULL, 'the writer cannot read workers');
SELECT throws_ok($$SELECT eventbox.next_outbox_id()$$, '42501', NULL, 'the writer cannot draw outbox ids');
SELECT throws_ok($$SELECT nextval('eventbox.outbox_id_seq')$$, '42501', NULL,
                 'the writer cannot advance the id sequence');
SELECT throws_ok($$CREATE TABLE eventbox.writer_table (id int)$$, '42501', NULL,
                 'the writer cannot create objects in schema eventbox');
-- Credentials: eventbox.kafka_options is unreadable for non-superusers.
SELECT throws_ok($$SELECT current_setting('eventbox.kafka_options')$$, '42501', NULL,
                 'the writer cannot read eventbox.kafka_options');
SELECT is_empty($$SELECT name FROM pg_settings WHERE name = 'eventbox.kafka_options'$$,
                'eventbox.kafka_options is not listed in pg_settings for the writer');
RESET ROLE;

-- What the writer sent is stored, as sent, pending.
SELECT results_eq(
    $$SELECT message_id::text, topic, key, payload, headers, status, attempts FROM eventbox.outbox
       WHERE topic = 'pgtap.writer' ORDER BY id$$,
    $$VALUES ('0190a6d2-0000-7000-8000-00000000f001', 'pgtap.writer', 'k'::bytea,
              convert_to('{"n": 1}', 'UTF8'), '{"event_type": "T"}'::jsonb, 'pending', 0),
             ('0190a6d2-0000-7000-8000-00000000f002', 'pgtap.writer', NULL::bytea,
              '\x0102'::bytea, '{}'::jsonb, 'pending', 0)$$,
    'the writer''s messages are in the outbox as sent');

-- send() runs as the extension owner (SECURITY DEFINER) with its own search_path, so a caller's
-- objects named like the ones it uses are never picked up.
CREATE SCHEMA regress_eventbox_shadow;
CREATE TABLE regress_eventbox_shadow.outbox (LIKE eventbox.outbox INCLUDING DEFAULTS);
GRANT USAGE ON SCHEMA regress_eventbox_shadow TO regress_eventbox_writer;
GRANT ALL ON regress_eventbox_shadow.outbox TO regress_eventbox_writer;
SET ROLE regress_eventbox_writer;
SET LOCAL search_path = regress_eventbox_shadow, public;
SELECT lives_ok($$SELECT eventbox.send('pgtap.shadow', '{}'::jsonb)$$, 'send works with a hostile search_path');
RESET search_path;
RESET ROLE;
SELECT is((SELECT count(*) FROM regress_eventbox_shadow.outbox), 0::bigint,
          'nothing went to the caller''s lookalike outbox');
SELECT is((SELECT count(*) FROM eventbox.outbox WHERE topic = 'pgtap.shadow'), 1::bigint,
          'the message went to eventbox.outbox');

-- An outbox table given a trigger: send() stores the row through an INSERT, which (and the
-- trigger) runs as the table's owner with search_path pinned, whatever the writer's session has: the
-- writer itself has no privilege on the outbox, and a schema of its own first in its
-- search_path shadows nothing there.
CREATE TABLE public.regress_send_seen (who name, path text);
CREATE FUNCTION public.regress_send_seen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.regress_send_seen VALUES (current_user, current_setting('search_path'));
    RETURN NEW;
END $$;
SELECT format('eventbox.outbox_rows_%s', eventbox._outbox_open_table()) AS open_rows \gset
CREATE TRIGGER regress_send_seen BEFORE INSERT ON :open_rows
    FOR EACH ROW EXECUTE FUNCTION public.regress_send_seen();
CREATE SCHEMA regress_writer_schema AUTHORIZATION regress_eventbox_writer;
SET ROLE regress_eventbox_writer;
SET search_path = regress_writer_schema, public;
SELECT lives_ok($$SELECT eventbox.send('pgtap.trigger', '{"n": 3}'::jsonb)$$,
                'the writer can send into an outbox with a trigger (SQL path)');
SELECT is(current_user, 'regress_eventbox_writer'::name, 'the writer is itself again after send()');
SELECT is(current_setting('search_path'), 'regress_writer_schema, public',
          'the writer''s search_path is its own again after send()');
RESET search_path;
RESET ROLE;
SELECT results_eq($$SELECT who::text, path FROM public.regress_send_seen$$,
                  $$VALUES (session_user::text, 'pg_catalog, pg_temp')$$,
                  'the INSERT and its trigger ran as the outbox owner with search_path pinned');
DROP TRIGGER regress_send_seen ON :open_rows;

-- A member of the writer role inherits EXECUTE; revoking it takes it away again.
CREATE ROLE regress_eventbox_app IN ROLE regress_eventbox_writer;
SET ROLE regress_eventbox_app;
SELECT lives_ok($$SELECT eventbox.send('pgtap.member', '{}'::jsonb)$$, 'a member of the writer role can send');
RESET ROLE;
REVOKE EXECUTE ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid) FROM regress_eventbox_writer;
SET ROLE regress_eventbox_app;
SELECT throws_ok($$SELECT eventbox.send('pgtap.member', '{}'::jsonb)$$, '42501', NULL,
                 'after REVOKE the member cannot send(jsonb) any more');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
