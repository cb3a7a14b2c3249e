-- Handlers, what they run as (docs/guide/security.md, docs/design/guarantees.md): authority
-- checked again at run time (EXECUTE, membership, superuser, a dropped function or role), the
-- role and restrictions a handler runs under, its pinned search_path, settings it changes
-- ending with it, and eventbox's own statements not following the caller's search_path.
-- The handlers_* suites (handlers_register, _process, _failures, _ordering, _run_as,
-- _operations) each start from sql/include/handlers_setup.sql and end with
-- sql/include/handlers_cleanup.sql. Needs no broker: inbox rows are inserted directly.

-- pg_regress sets PG_ABS_SRCDIR to its --inputdir: the top of the repository.
\getenv abs_srcdir PG_ABS_SRCDIR
\set handlers_setup :abs_srcdir '/sql/include/handlers_setup.sql'
\set handlers_cleanup :abs_srcdir '/sql/include/handlers_cleanup.sql'
\i :handlers_setup

-- ---- process: authority checked again at run time ------------------------------------------

TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('auth', ARRAY['orders'], backoff => '1 hour',
                                   backoff_max => '10 hours');
SELECT eventbox.register_handler('auth', 'regress_eventbox_fn.guarded(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
-- run_as lost EXECUTE.
REVOKE EXECUTE ON FUNCTION regress_eventbox_fn.guarded(eventbox.inbox) FROM regress_eventbox_runner;
SELECT pg_temp.put('auth', 'orders', 0, 0);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('auth');
RESET ROLE;
SELECT message_id, status, attempts, last_error FROM msgs WHERE sub = 'auth';
GRANT EXECUTE ON FUNCTION regress_eventbox_fn.guarded(eventbox.inbox) TO regress_eventbox_runner;
-- The registering role is no longer a member of run_as.
REVOKE regress_eventbox_runner FROM regress_eventbox_owner;
SELECT pg_temp.due('auth');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('auth');
RESET ROLE;
SELECT message_id, status, attempts, last_error FROM msgs WHERE sub = 'auth';
GRANT regress_eventbox_runner TO regress_eventbox_owner;
-- run_as became a superuser.
ALTER ROLE regress_eventbox_runner SUPERUSER;
SELECT pg_temp.due('auth');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('auth');
RESET ROLE;
SELECT message_id, status, attempts, last_error FROM msgs WHERE sub = 'auth';
ALTER ROLE regress_eventbox_runner NOSUPERUSER;
-- All restored: it runs.
SELECT pg_temp.due('auth');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('auth');
RESET ROLE;
SELECT message_id, status, attempts, last_error FROM msgs WHERE sub = 'auth';
SELECT * FROM fx;
-- The function was dropped (regprocedure holds no dependency): a clear error, oid masked.
CREATE FUNCTION regress_eventbox_fn.doomed(msg eventbox.inbox) RETURNS void LANGUAGE sql AS '';
SET ROLE regress_eventbox_owner;
SELECT eventbox.register_handler('auth', 'regress_eventbox_fn.doomed(eventbox.inbox)', 'D',
                                 'regress_eventbox_runner');
RESET ROLE;
DROP FUNCTION regress_eventbox_fn.doomed(eventbox.inbox);
SELECT pg_temp.put('auth', 'orders', 1, 0, 'D');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('auth');
RESET ROLE;
SELECT message_id, status, attempts,
       regexp_replace(last_error, 'function [0-9]+', 'function N') AS last_error
  FROM msgs WHERE sub = 'auth' AND message_id = 'orders/1/0';
DELETE FROM eventbox.handlers WHERE subscription = 'auth' AND event_type = 'D';
-- The role that registered the handler was dropped: refused, and the error names no "(null)".
-- (Fails before the fix: "role (null), which registered handler ...".)
CREATE ROLE regress_eventbox_gone IN ROLE regress_eventbox_owner, regress_eventbox_runner;
SET ROLE regress_eventbox_gone;
SELECT eventbox.register_handler('auth', 'regress_eventbox_fn.guarded(eventbox.inbox)', 'G',
                                 'regress_eventbox_runner');
RESET ROLE;
DROP ROLE regress_eventbox_gone;
SELECT pg_temp.put('auth', 'orders', 2, 0, 'G');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('auth');
RESET ROLE;
SELECT message_id, status, attempts, left(last_error, 6) AS sqlstate,
       last_error LIKE '%(null)%' AS says_null
  FROM msgs WHERE sub = 'auth' AND message_id = 'orders/2/0';
DELETE FROM eventbox.handlers WHERE subscription = 'auth' AND event_type = 'G';

-- ---- process: the role and restrictions a handler runs under -------------------------------

-- 'reg' with the two handlers handlers_register leaves on it: the escape handler tries to add
-- one (offsets 5 and 6), and handlers_of_reg below shows it did not.
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('reg', ARRAY['orders']);
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 event_type => 'OrderCreated', run_as => 'regress_eventbox_runner');
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.also(eventbox.inbox)',
                                 event_type => 'OrderCreated', run_as => 'regress_eventbox_runner');
RESET ROLE;

-- It may neither change role nor create temporary objects (security-restricted operation), nor
-- write eventbox's tables or call its internals (run_as has no right on them).
TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('escape', ARRAY['orders'], backoff => '1 hour',
                                   backoff_max => '10 hours', ordering => 'none');
SELECT eventbox.register_handler('escape', 'regress_eventbox_fn.escape(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
SELECT pg_temp.put('escape', 'orders', 0, o) FROM generate_series(0, 7) AS o;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('escape');
RESET ROLE;
SELECT message_id, status, attempts, last_error FROM msgs WHERE sub = 'escape'
 ORDER BY message_id;
SELECT count(*) AS handlers_of_reg FROM eventbox.handlers WHERE subscription = 'reg';
SELECT current_user = session_user AS back_to_the_session_role;

-- search_path is pinned to "$user", public, pg_temp whatever the caller set. (Fails before the fix:
-- the handler runs with the caller's search_path, SET in the session.)
TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.register_handler('escape', 'regress_eventbox_fn.shout(eventbox.inbox)', 'S',
                                 'regress_eventbox_runner');
RESET ROLE;
SELECT pg_temp.put('escape', 'orders', 1, 0, 'S');
SET search_path = regress_eventbox_fn, pg_catalog;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('escape');
RESET ROLE;
SHOW search_path;
RESET search_path;
SELECT message_id, handler, run_as, search_path FROM regress_eventbox_fn.effects;
-- Which lets any member of the subscription's owner role run its own code as run_as, a role it
-- need not be a member of: team owns a subscription whose handler owner registered to run as
-- runner, and colleague, a member of team only, shadows pg_catalog's upper() for the handler.
-- (Fails before the fix: the row 'colleague ran as regress_eventbox_runner' appears.)
SET ROLE regress_eventbox_team;
SELECT eventbox.create_subscription('team', ARRAY['orders'], backoff => '1 hour',
                                   backoff_max => '10 hours');
RESET ROLE;
SET ROLE regress_eventbox_owner;
SELECT eventbox.register_handler('team', 'regress_eventbox_fn.shout(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
CREATE SCHEMA regress_eventbox_evil AUTHORIZATION regress_eventbox_colleague;
GRANT USAGE ON SCHEMA regress_eventbox_evil TO PUBLIC;
SET ROLE regress_eventbox_colleague;
CREATE FUNCTION regress_eventbox_evil.upper(t text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO regress_eventbox_fn.effects (message_id, handler, run_as)
    VALUES (t, 'colleague ran as ' || current_user, current_user);
    RETURN t;
END $$;
RESET ROLE;
SELECT pg_temp.put('team', 'orders', 0, 0);
TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_colleague;
SELECT pg_has_role('regress_eventbox_team', 'MEMBER') AS colleague_is_member_of_team,
       pg_has_role('regress_eventbox_runner', 'MEMBER') AS colleague_is_member_of_runner;
SET search_path = regress_eventbox_evil, pg_catalog;
SELECT eventbox.process('team');
RESET search_path;
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE sub = 'team';
SELECT message_id, handler, run_as FROM regress_eventbox_fn.effects ORDER BY n;
DROP FUNCTION regress_eventbox_evil.upper(text);
DROP SCHEMA regress_eventbox_evil;

-- pg_temp is searched last: the caller's temporary table does not shadow the table a handler
-- names unqualified. (Fails before the fix: with pg_temp left out of the pinned search_path it
-- is searched first, and the handler writes into the caller's temporary table.)
CREATE TABLE public.regress_eventbox_ledger (message_id text);
GRANT INSERT ON public.regress_eventbox_ledger TO regress_eventbox_runner;
CREATE FUNCTION regress_eventbox_fn.ledger(msg eventbox.inbox) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO regress_eventbox_ledger (message_id) VALUES (msg.message_id);
END $$;
GRANT EXECUTE ON FUNCTION regress_eventbox_fn.ledger(eventbox.inbox) TO regress_eventbox_runner;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('ledger', ARRAY['orders']);
SELECT eventbox.register_handler('ledger', 'regress_eventbox_fn.ledger(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
CREATE TEMP TABLE regress_eventbox_ledger (message_id text);
GRANT INSERT ON regress_eventbox_ledger TO regress_eventbox_runner;
RESET ROLE;
SELECT pg_temp.put('ledger', 'orders', 0, 0);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ledger');
SELECT count(*) AS in_the_callers_temp_table FROM pg_temp.regress_eventbox_ledger;
DROP TABLE pg_temp.regress_eventbox_ledger;
RESET ROLE;
SELECT message_id FROM public.regress_eventbox_ledger;
DROP TABLE public.regress_eventbox_ledger;

-- ---- process: settings a handler changes end with it ----------------------------------------

-- Each message's handlers start from the same settings: what one changes, even for the session
-- (set_config(..., false)), goes back when it returns, so it reaches neither the next message's
-- handler, which may run as another role, nor the session calling process(). (Fails before the
-- fix: the second message sees datestyle German, and so does the caller afterwards.)
TRUNCATE regress_eventbox_fn.effects;
CREATE FUNCTION regress_eventbox_fn.unsettle(msg eventbox.inbox) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO regress_eventbox_fn.effects (message_id, handler, run_as, search_path)
    VALUES (msg.message_id, 'unsettle saw ' || current_setting('datestyle'), current_user,
            current_setting('search_path'));
    PERFORM set_config('datestyle', 'German, DMY', false);
    PERFORM set_config('search_path', 'pg_catalog', false);
END $$;
GRANT EXECUTE ON FUNCTION regress_eventbox_fn.unsettle(eventbox.inbox) TO regress_eventbox_runner;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('settings', ARRAY['orders']);
SELECT eventbox.register_handler('settings', 'regress_eventbox_fn.unsettle(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
SELECT pg_temp.put('settings', 'orders', 0, o) FROM generate_series(0, 2) AS o;
SHOW datestyle;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('settings');
RESET ROLE;
SHOW datestyle;
SHOW search_path;
SELECT message_id, handler, run_as, search_path FROM regress_eventbox_fn.effects ORDER BY n;
SELECT message_id, status FROM msgs WHERE sub = 'settings' ORDER BY message_id;

-- 'basic' as handlers_process creates it (a handler for type 'A' only), for the trap below.
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('basic', ARRAY['orders'], backoff => '1 hour',
                                   backoff_max => '10 hours');
SELECT eventbox.register_handler('basic', 'regress_eventbox_fn.record(eventbox.inbox)', 'A',
                                 'regress_eventbox_runner');
RESET ROLE;

-- eventbox's own statements do not follow the caller's search_path: process() runs them as the
-- extension owner, so a function of the caller's that shadows one they use (here unnest(text[])
-- in a schema the caller put first) would run with the owner's rights. (Fails before the fix:
-- the trap records the extension owner.)
CREATE SCHEMA regress_eventbox_trap AUTHORIZATION regress_eventbox_owner;
SET ROLE regress_eventbox_owner;
CREATE TABLE regress_eventbox_trap.caught (who text);
GRANT INSERT ON regress_eventbox_trap.caught TO PUBLIC;
CREATE FUNCTION regress_eventbox_trap.unnest(a text[]) RETURNS SETOF text
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO regress_eventbox_trap.caught VALUES (current_user);
    RETURN QUERY SELECT pg_catalog.unnest(a);
END $$;
RESET ROLE;
SELECT pg_temp.put('basic', 'orders', 3, 0, 'B'), pg_temp.put('basic', 'orders', 3, 1, 'A');
SET ROLE regress_eventbox_owner;
SET search_path = regress_eventbox_trap, pg_catalog;
SELECT eventbox.process('basic');
RESET search_path;
SELECT who FROM regress_eventbox_trap.caught;
RESET ROLE;
SELECT message_id, status FROM msgs WHERE sub = 'basic' AND message_id LIKE 'orders/3/%'
 ORDER BY message_id;
SET client_min_messages = warning;
DROP SCHEMA regress_eventbox_trap CASCADE;
RESET client_min_messages;

\i :handlers_cleanup
