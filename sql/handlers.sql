-- Handlers (DESIGN.md sections 2, 3, 5 and 6): register_handler and unregister_handler with
-- every refusal, the privilege boundaries around them, eventbox.process() (effects and status
-- commit together, run_as, retries with backoff, dead after max_attempts, ignored / kept
-- messages, ordering 'partition' / 'key' / 'none', authority checked again at run time) and the
-- operations retry, redrive, skip and replay. Needs no broker: inbox rows are inserted directly.
--
-- Deterministic only when no handler worker serves this database (eventbox.handler_workers = 0,
-- or eventbox.database is another database): then nothing but eventbox.process() runs
-- handlers. The first query below says whether that holds.
--
-- Errors: the default verbosity and the SQLSTATE printed after them, as in subscriptions.sql.
-- Nothing here prints a timestamp, an oid or a random value: next_attempt_at is shown as
-- 'later' / 'due' and checked against bounds, oids are masked.
--
-- Where a comment says "(Fails before the fix: ...)", the expected output is the behaviour the
-- design asks for and the comment says what the extension did when the test was written.
\set SHOW_CONTEXT never
\set after_error 'SELECT :''LAST_ERROR_SQLSTATE'' AS sqlstate, pg_temp.handler_rows() AS handlers;'
\set show_sqlstate 'SELECT :''LAST_ERROR_SQLSTATE'' AS sqlstate;'

SELECT current_setting('eventbox.handler_workers') = '0'
           OR current_setting('eventbox.database') <> current_database() AS no_handler_worker_here,
       current_setting('eventbox.allow_superuser_handlers') AS allow_superuser_handlers;

-- ---- setup ---------------------------------------------------------------------------------

-- owner owns the subscriptions and registers handlers; runner is the role they run as (owner is
-- a member of it); stranger owns nothing of the others; team owns a subscription too, with owner
-- and colleague as members, and colleague is not a member of runner; noinherit is a member of
-- runner that does not inherit its rights; nobody has no grant.
CREATE ROLE regress_eventbox_runner;
CREATE ROLE regress_eventbox_owner IN ROLE regress_eventbox_runner;
CREATE ROLE regress_eventbox_stranger;
CREATE ROLE regress_eventbox_team ROLE regress_eventbox_owner;
CREATE ROLE regress_eventbox_colleague IN ROLE regress_eventbox_team;
CREATE ROLE regress_eventbox_noinherit NOINHERIT IN ROLE regress_eventbox_runner;
CREATE ROLE regress_eventbox_nobody;
CREATE ROLE regress_eventbox_super SUPERUSER;
GRANT USAGE ON SCHEMA eventbox TO regress_eventbox_owner, regress_eventbox_stranger,
                                  regress_eventbox_team, regress_eventbox_noinherit;
GRANT EXECUTE ON FUNCTION
    eventbox.create_subscription(text, text[], text, text, integer, interval, interval, text,
                                 text, integer, text, text[], text, text, text, boolean),
    eventbox.alter_subscription(text, text[], text, text, integer, interval, interval, text, text,
                                integer, text, boolean, text[], text, text, text),
    eventbox.drop_subscription(text),
    eventbox.register_handler(text, regprocedure, text, name),
    eventbox.unregister_handler(text, regprocedure, text),
    eventbox.process(text, integer),
    eventbox.retry(text, text),
    eventbox.redrive(text, text),
    eventbox.skip(text, text),
    eventbox.replay(text, text, integer, bigint)
  TO regress_eventbox_owner, regress_eventbox_stranger, regress_eventbox_team,
     regress_eventbox_noinherit;

-- Handlers and what they leave behind. A handler writes one row into effects and then fails if
-- failing lists (message id, handler name).
CREATE SCHEMA regress_eventbox_fn;
GRANT USAGE ON SCHEMA regress_eventbox_fn TO PUBLIC;
CREATE TABLE regress_eventbox_fn.effects (
    n           int GENERATED ALWAYS AS IDENTITY,
    message_id  text,
    topic       text,
    "partition" int,
    "offset"    bigint,
    handler     text,
    run_as      text,
    attempts    int,
    search_path text
);
CREATE TABLE regress_eventbox_fn.failing (message_id text, handler text);
-- Counts the calls of record(): a sequence is not rolled back with the call's effects.
CREATE SEQUENCE regress_eventbox_fn.record_calls;
GRANT SELECT, INSERT ON regress_eventbox_fn.effects TO regress_eventbox_runner;
GRANT SELECT ON regress_eventbox_fn.failing TO regress_eventbox_runner;
GRANT USAGE ON SEQUENCE regress_eventbox_fn.record_calls TO PUBLIC;

CREATE FUNCTION regress_eventbox_fn.record(msg eventbox.inbox) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('regress_eventbox_fn.record_calls');
    INSERT INTO regress_eventbox_fn.effects
        (message_id, topic, "partition", "offset", handler, run_as, attempts, search_path)
    VALUES (msg.message_id, msg.topic, msg."partition", msg."offset", 'record', current_user,
            msg.attempts, current_setting('search_path'));
    IF EXISTS (SELECT FROM regress_eventbox_fn.failing f
                WHERE f.message_id = msg.message_id AND f.handler = 'record') THEN
        RAISE EXCEPTION 'record failed on %', msg.message_id
            USING DETAIL = format('attempt %s', msg.attempts);
    END IF;
END $$;
CREATE FUNCTION regress_eventbox_fn.also(msg eventbox.inbox) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO regress_eventbox_fn.effects
        (message_id, topic, "partition", "offset", handler, run_as, attempts, search_path)
    VALUES (msg.message_id, msg.topic, msg."partition", msg."offset", 'also', current_user,
            msg.attempts, current_setting('search_path'));
    IF EXISTS (SELECT FROM regress_eventbox_fn.failing f
                WHERE f.message_id = msg.message_id AND f.handler = 'also') THEN
        RAISE EXCEPTION 'also failed on %', msg.message_id;
    END IF;
END $$;
-- Calls upper() unqualified: which upper() runs depends on the search_path it runs with.
CREATE FUNCTION regress_eventbox_fn.shout(msg eventbox.inbox) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO regress_eventbox_fn.effects (message_id, handler, run_as, attempts, search_path)
    VALUES (upper(msg.message_id), 'shout', current_user, msg.attempts,
            current_setting('search_path'));
END $$;
-- Tries to leave the role and the restrictions it runs under, chosen by the message's offset
-- in partition 0; does nothing in other partitions.
CREATE FUNCTION regress_eventbox_fn.escape(msg eventbox.inbox) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF msg."partition" <> 0 THEN
        RETURN;
    END IF;
    CASE msg."offset"
        WHEN 0 THEN SET ROLE regress_eventbox_owner;
        WHEN 1 THEN RESET ROLE;
        WHEN 2 THEN SET SESSION AUTHORIZATION DEFAULT;
        WHEN 3 THEN CREATE TEMP TABLE regress_eventbox_escape (a int);
        WHEN 4 THEN UPDATE eventbox.inbox SET status = 'processed';
        WHEN 5 THEN INSERT INTO eventbox.handlers (subscription, handler, run_as, registered_by)
                    VALUES ('reg', 'regress_eventbox_fn.record(eventbox.inbox)',
                            'regress_eventbox_super', 'regress_eventbox_super');
        WHEN 6 THEN PERFORM eventbox._register_handler('regress_eventbox_super'::regrole::oid, 'reg',
                        'regress_eventbox_fn.record(eventbox.inbox)', NULL, 'regress_eventbox_super');
        ELSE NULL;
    END CASE;
END $$;
-- Same as record, for the authority checks at run time.
CREATE FUNCTION regress_eventbox_fn.guarded(msg eventbox.inbox) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO regress_eventbox_fn.effects (message_id, handler, run_as, attempts)
    VALUES (msg.message_id, 'guarded', current_user, msg.attempts);
END $$;
-- Not handlers: wrong arguments, or a procedure.
CREATE FUNCTION regress_eventbox_fn.wrong_arg(n integer) RETURNS void LANGUAGE sql AS '';
CREATE FUNCTION regress_eventbox_fn.text_arg(msg text) RETURNS void LANGUAGE sql AS '';
CREATE FUNCTION regress_eventbox_fn.no_args() RETURNS void LANGUAGE sql AS '';
CREATE FUNCTION regress_eventbox_fn.two_args(msg eventbox.inbox, n integer) RETURNS void
LANGUAGE sql AS '';
CREATE FUNCTION regress_eventbox_fn.many(VARIADIC msgs eventbox.inbox[]) RETURNS void
LANGUAGE sql AS '';
CREATE PROCEDURE regress_eventbox_fn.proc(msg eventbox.inbox) LANGUAGE sql AS '';
-- Handlers that only some roles may execute.
CREATE FUNCTION regress_eventbox_fn.secret(msg eventbox.inbox) RETURNS void LANGUAGE sql AS '';
CREATE FUNCTION regress_eventbox_fn.owner_only(msg eventbox.inbox) RETURNS void
LANGUAGE sql AS '';
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA regress_eventbox_fn FROM PUBLIC;
REVOKE ALL ON ALL PROCEDURES IN SCHEMA regress_eventbox_fn FROM PUBLIC;
GRANT EXECUTE ON FUNCTION regress_eventbox_fn.record(eventbox.inbox),
                          regress_eventbox_fn.also(eventbox.inbox),
                          regress_eventbox_fn.shout(eventbox.inbox),
                          regress_eventbox_fn.escape(eventbox.inbox),
                          regress_eventbox_fn.guarded(eventbox.inbox)
  TO regress_eventbox_runner;
GRANT EXECUTE ON PROCEDURE regress_eventbox_fn.proc(eventbox.inbox) TO regress_eventbox_runner;
GRANT EXECUTE ON FUNCTION regress_eventbox_fn.owner_only(eventbox.inbox) TO regress_eventbox_owner;

-- Who may execute what (owner inherits runner's grants; noinherit does not).
SELECT f AS handler,
       has_function_privilege('regress_eventbox_owner', f, 'EXECUTE') AS owner,
       has_function_privilege('regress_eventbox_runner', f, 'EXECUTE') AS runner,
       has_function_privilege('regress_eventbox_noinherit', f, 'EXECUTE') AS noinherit,
       has_function_privilege('regress_eventbox_stranger', f, 'EXECUTE') AS stranger
  FROM unnest(ARRAY['regress_eventbox_fn.record(eventbox.inbox)',
                    'regress_eventbox_fn.secret(eventbox.inbox)',
                    'regress_eventbox_fn.owner_only(eventbox.inbox)']) AS f;

-- Inbox rows as the ingest worker would store them: message id topic/partition/offset.
CREATE FUNCTION pg_temp.put(sub text, topic text, p int, o bigint, event_type text DEFAULT NULL,
                            key text DEFAULT NULL)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", key,
                                payload, event_type)
    VALUES (sub, topic || '/' || p || '/' || o, topic, p, o, convert_to(key, 'UTF8'),
            jsonb_build_object('o', o), event_type)
$$;
-- Makes every message of `sub` waiting for a retry due now.
CREATE FUNCTION pg_temp.due(sub text) RETURNS void LANGUAGE sql AS $$
    UPDATE eventbox.inbox SET next_attempt_at = now() - interval '1 second'
     WHERE subscription = sub AND status = 'retry'
$$;
-- 'ok', or the SQLSTATE and message of the error a statement raises.
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
-- How many handlers are registered, whatever role asks (for :after_error).
CREATE FUNCTION pg_temp.handler_rows() RETURNS bigint LANGUAGE sql SECURITY DEFINER
AS 'SELECT count(*) FROM eventbox.handlers';
-- Only the SQLSTATE, where the message would name the role running this file.
CREATE FUNCTION pg_temp.sqlstate_of(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END $$;

CREATE TEMP VIEW hs AS
SELECT subscription, event_type, handler, run_as, registered_by
  FROM eventbox.handlers;
CREATE TEMP VIEW msgs AS
SELECT subscription AS sub, message_id, convert_from(key, 'UTF8') AS key, event_type, status,
       attempts,
       CASE WHEN next_attempt_at IS NULL THEN NULL
            WHEN next_attempt_at > clock_timestamp() THEN 'later' ELSE 'due' END AS next,
       processed_at IS NOT NULL AS done, last_error
  FROM eventbox.inbox;
CREATE TEMP VIEW fx AS
SELECT message_id, handler, run_as, attempts FROM regress_eventbox_fn.effects;

-- ---- register_handler ----------------------------------------------------------------------

SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('reg', ARRAY['orders']);
-- For one event type, to run as runner.
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 event_type => 'OrderCreated', run_as => 'regress_eventbox_runner');
-- The same function for another type, and for every type (run_as defaults to current_user).
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 'OrderPaid', 'regress_eventbox_runner');
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)');
-- Another function for the same type.
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.also(eventbox.inbox)',
                                 event_type => 'OrderCreated', run_as => 'regress_eventbox_runner');
RESET ROLE;
SELECT * FROM hs ORDER BY handler::text, event_type NULLS FIRST;

SET ROLE regress_eventbox_owner;
-- Unknown subscription.
SELECT eventbox.register_handler('nope', 'regress_eventbox_fn.record(eventbox.inbox)');
:after_error
SELECT eventbox.register_handler(NULL, 'regress_eventbox_fn.record(eventbox.inbox)');
:after_error
-- NULL handler.
SELECT eventbox.register_handler('reg', NULL);
:after_error
-- Functions that do not take exactly one eventbox.inbox.
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.wrong_arg(integer)');
:after_error
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.text_arg(text)');
:after_error
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.no_args()');
:after_error
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.two_args(eventbox.inbox, integer)');
:after_error
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.many(eventbox.inbox[])');
:after_error
-- A function that does not exist is refused by the regprocedure cast itself.
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.missing(eventbox.inbox)');
:after_error
-- Empty event type (NULL means every type).
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 event_type => '');
:after_error
-- Unknown run_as role, and NULL.
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)', 'X',
                                 run_as => 'regress_eventbox_missing');
:after_error
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)', 'X',
                                 run_as => NULL);
:after_error
-- run_as a role the caller is not a member of.
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)', 'X',
                                 run_as => 'regress_eventbox_stranger');
:after_error
-- No EXECUTE for the caller nor run_as; for run_as only.
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.secret(eventbox.inbox)', 'X',
                                 run_as => 'regress_eventbox_runner');
:after_error
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.owner_only(eventbox.inbox)', 'X',
                                 run_as => 'regress_eventbox_runner');
:after_error
-- Duplicates: same subscription, type and function, whatever run_as; NULL types are equal.
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 event_type => 'OrderCreated', run_as => 'regress_eventbox_runner');
:after_error
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 event_type => 'OrderCreated', run_as => 'regress_eventbox_owner');
:after_error
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)');
:after_error
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)', NULL,
                                 'regress_eventbox_runner');
:after_error
-- A procedure is not a function that can be run on a message: every run of it would fail
-- (42809 "... is a procedure"), so registration refuses it like any other wrong signature.
-- (Fails before the fix: the procedure is accepted and every message it gets fails.)
SELECT pg_temp.sqlstate_of($$SELECT eventbox.register_handler('reg',
    'regress_eventbox_fn.proc(eventbox.inbox)', run_as => 'regress_eventbox_runner')$$)
       AS procedure_refused;
RESET ROLE;
DELETE FROM eventbox.handlers WHERE handler = 'regress_eventbox_fn.proc(eventbox.inbox)';

-- A superuser may register anything but a handler running as a superuser (allow_superuser_handlers
-- is off), be it named or the default current_user.
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)', 'X',
                                 run_as => 'regress_eventbox_super');
:after_error
SELECT pg_temp.sqlstate_of($$SELECT eventbox.register_handler('reg',
    'regress_eventbox_fn.record(eventbox.inbox)', 'X')$$) AS default_run_as_superuser;
-- A member of runner that does not inherit runner's EXECUTE has no EXECUTE of its own.
SET ROLE regress_eventbox_noinherit;
SELECT eventbox.create_subscription('ni', ARRAY['orders']);
SELECT eventbox.register_handler('ni', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
:after_error
SELECT eventbox.drop_subscription('ni');
RESET ROLE;

-- Nothing of the above was stored.
SELECT * FROM hs ORDER BY handler::text, event_type NULLS FIRST;

-- ---- unregister_handler --------------------------------------------------------------------

SET ROLE regress_eventbox_owner;
SELECT eventbox.unregister_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)', 'OrderPaid');
-- Gone, so unknown now; and the NULL-type registration is not the one for 'OrderCreated'.
SELECT eventbox.unregister_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)', 'OrderPaid');
:after_error
SELECT eventbox.unregister_handler('reg', 'regress_eventbox_fn.also(eventbox.inbox)');
:after_error
SELECT eventbox.unregister_handler('reg', 'regress_eventbox_fn.secret(eventbox.inbox)', 'X');
:after_error
SELECT eventbox.unregister_handler('reg', NULL);
:after_error
SELECT eventbox.unregister_handler('nope', 'regress_eventbox_fn.record(eventbox.inbox)');
:after_error
-- The every-type registration alone.
SELECT eventbox.unregister_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)');
RESET ROLE;
SELECT * FROM hs ORDER BY handler::text, event_type NULLS FIRST;

-- ---- privileges ----------------------------------------------------------------------------

-- A role without EXECUTE on the API.
SET ROLE regress_eventbox_nobody;
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)');
:show_sqlstate
SELECT eventbox.process('reg');
:show_sqlstate
RESET ROLE;

-- stranger may not manage owner's subscription at all.
SET ROLE regress_eventbox_stranger;
SELECT eventbox.register_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)', 'X',
                                 'regress_eventbox_stranger');
:after_error
SELECT eventbox.unregister_handler('reg', 'regress_eventbox_fn.record(eventbox.inbox)',
                                   'OrderCreated');
:after_error
SELECT eventbox.process('reg');
:show_sqlstate
-- On its own subscription: not as a role it is not a member of, not as a superuser, not a
-- function it cannot execute.
SELECT eventbox.create_subscription('st', ARRAY['orders']);
SELECT eventbox.register_handler('st', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
:after_error
SELECT eventbox.register_handler('st', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_super');
:after_error
SELECT eventbox.register_handler('st', 'regress_eventbox_fn.secret(eventbox.inbox)');
:after_error
SELECT eventbox.register_handler('st', 'regress_eventbox_fn.record(eventbox.inbox)');
:after_error
RESET ROLE;

-- Around the API: the tables, and the internal functions with a forged caller.
CREATE TEMP TABLE bypass (n int, stmt text);
GRANT SELECT ON bypass TO PUBLIC;
INSERT INTO bypass VALUES
 (1, $$INSERT INTO eventbox.handlers (subscription, handler, run_as, registered_by) VALUES ('st', 'regress_eventbox_fn.record(eventbox.inbox)', 'regress_eventbox_runner', 'regress_eventbox_owner')$$),
 (2, $$UPDATE eventbox.handlers SET run_as = 'regress_eventbox_super'$$),
 (3, $$DELETE FROM eventbox.handlers$$),
 (4, $$TRUNCATE eventbox.handlers$$),
 (5, $$SELECT count(*) FROM eventbox.handlers$$),
 (6, $$UPDATE eventbox.inbox SET status = 'processed'$$),
 (7, $$INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset") VALUES ('reg', 'forged', 'orders', 0, 0)$$),
 (8, $$UPDATE eventbox.subscriptions SET owner = 'regress_eventbox_stranger'$$),
 (9, $$SELECT eventbox._register_handler('regress_eventbox_owner'::regrole, 'reg', 'regress_eventbox_fn.record(eventbox.inbox)', NULL, 'regress_eventbox_runner')$$),
 (10, $$SELECT eventbox._unregister_handler('regress_eventbox_owner'::regrole, 'reg', 'regress_eventbox_fn.record(eventbox.inbox)', 'OrderCreated')$$),
 (11, $$SELECT eventbox._process('regress_eventbox_owner'::regrole, 'reg', 100)$$),
 (12, $$SELECT eventbox._managed_message('regress_eventbox_owner'::regrole, 'reg', 'm')$$),
 (13, $$SELECT eventbox._retry('regress_eventbox_owner'::regrole, 'reg', 'm')$$),
 (14, $$SELECT eventbox._redrive('regress_eventbox_owner'::regrole, 'reg', NULL)$$),
 (15, $$SELECT eventbox._skip('regress_eventbox_owner'::regrole, 'reg', 'm')$$),
 (16, $$SELECT eventbox._replay('regress_eventbox_owner'::regrole, 'reg', 'orders', 0, 0)$$);
SET ROLE regress_eventbox_stranger;
SELECT n, pg_temp.try(stmt) AS stranger FROM bypass ORDER BY n;
-- Owning a subscription grants no right on the tables either.
SET ROLE regress_eventbox_owner;
SELECT n, pg_temp.try(stmt) AS owner FROM bypass ORDER BY n;
RESET ROLE;
SELECT * FROM hs ORDER BY handler::text, event_type NULLS FIRST;
SELECT count(*) AS inbox_rows FROM eventbox.inbox;
SELECT name, owner FROM eventbox.subscriptions ORDER BY name;

-- ---- process: processed, ignored, effects commit with the status ----------------------------

SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('basic', ARRAY['orders'], backoff => '1 hour',
                                   backoff_max => '10 hours');
SELECT eventbox.register_handler('basic', 'regress_eventbox_fn.record(eventbox.inbox)', 'A',
                                 'regress_eventbox_runner');
RESET ROLE;
-- One message with a handler, one of another type and one without a type: those two are
-- ignored ('ignore' is the default for unhandled messages).
SELECT pg_temp.put('basic', 'orders', 0, 0, 'A'),
       pg_temp.put('basic', 'orders', 0, 1, 'B'),
       pg_temp.put('basic', 'orders', 0, 2);
SELECT * FROM msgs WHERE sub = 'basic' ORDER BY message_id;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('basic');
RESET ROLE;
SELECT * FROM msgs WHERE sub = 'basic' ORDER BY message_id;
-- The handler ran once, as runner, on the row with its attempt counted, with the pinned
-- search_path.
SELECT message_id, handler, run_as, attempts, search_path FROM regress_eventbox_fn.effects;
-- Nothing is due now.
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('basic');
RESET ROLE;

-- process() works in the caller's transaction: rolled back, it leaves no effect, no status
-- and no counted attempt; committed, effect and status come together.
SELECT pg_temp.put('basic', 'orders', 0, 3, 'A');
BEGIN;
SET LOCAL ROLE regress_eventbox_owner;
SELECT eventbox.process('basic');
RESET ROLE;
SELECT status, attempts FROM msgs WHERE message_id = 'orders/0/3';
SELECT * FROM fx WHERE message_id = 'orders/0/3';
ROLLBACK;
SELECT status, attempts, next, done FROM msgs WHERE message_id = 'orders/0/3';
SELECT * FROM fx WHERE message_id = 'orders/0/3';
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('basic');
RESET ROLE;
SELECT status, attempts, next, done FROM msgs WHERE message_id = 'orders/0/3';
SELECT * FROM fx WHERE message_id = 'orders/0/3';

-- max_messages bounds a call.
SELECT pg_temp.put('basic', 'orders', 1, 0, 'A'), pg_temp.put('basic', 'orders', 1, 1, 'A'),
       pg_temp.put('basic', 'orders', 1, 2, 'A');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('basic', 2);
SELECT eventbox.process('basic', 2);
SELECT eventbox.process('basic', 2);
RESET ROLE;
SELECT message_id, status FROM msgs WHERE sub = 'basic' AND message_id LIKE 'orders/1/%'
 ORDER BY message_id;

-- Bad calls.
SET ROLE regress_eventbox_owner;
SELECT eventbox.process(NULL);
:show_sqlstate
SELECT eventbox.process('basic', 0);
:show_sqlstate
SELECT eventbox.process('basic', -1);
:show_sqlstate
SELECT eventbox.process('nope');
:show_sqlstate
-- A disabled subscription is not processed; enabled again, it is.
RESET ROLE;
SELECT pg_temp.put('basic', 'orders', 0, 4, 'A');
SET ROLE regress_eventbox_owner;
SELECT eventbox.alter_subscription('basic', enabled => false);
SELECT eventbox.process('basic');
SELECT eventbox.alter_subscription('basic', enabled => true);
SELECT eventbox.process('basic');
RESET ROLE;
SELECT message_id, status FROM msgs WHERE message_id = 'orders/0/4';

-- ---- process: every-type and typed handlers, one subtransaction per message ----------------

TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('both', ARRAY['orders'], backoff => '1 hour',
                                   backoff_max => '10 hours');
-- Registered in this order, they run in this order; each as its own run_as.
SELECT eventbox.register_handler('both', 'regress_eventbox_fn.record(eventbox.inbox)', 'A',
                                 'regress_eventbox_runner');
SELECT eventbox.register_handler('both', 'regress_eventbox_fn.also(eventbox.inbox)');
RESET ROLE;
GRANT SELECT, INSERT ON regress_eventbox_fn.effects TO regress_eventbox_owner;
GRANT SELECT ON regress_eventbox_fn.failing TO regress_eventbox_owner;
-- A: both handlers; B and no type: the every-type one only.
SELECT pg_temp.put('both', 'orders', 0, 0, 'A'), pg_temp.put('both', 'orders', 0, 1, 'B'),
       pg_temp.put('both', 'orders', 0, 2);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('both');
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE sub = 'both' ORDER BY message_id;
-- In run order: one partition.
SELECT message_id, handler, run_as, attempts FROM regress_eventbox_fn.effects ORDER BY n;
-- When the second handler of a message fails, the first one's effects are rolled back with it;
-- a message of another partition in the same call keeps its effects.
TRUNCATE regress_eventbox_fn.effects;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/1/0', 'also');
SELECT pg_temp.put('both', 'orders', 1, 0, 'A'), pg_temp.put('both', 'orders', 2, 0, 'A');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('both');
RESET ROLE;
SELECT message_id, status, attempts, next, done, last_error FROM msgs
 WHERE sub = 'both' AND message_id IN ('orders/1/0', 'orders/2/0') ORDER BY message_id;
SELECT message_id, handler, run_as, attempts FROM regress_eventbox_fn.effects
 ORDER BY message_id, n;
-- The messages of a transaction run in one subtransaction until one fails: that one's error is
-- kept (it is not run twice), the ones before it run again, each in a subtransaction of its
-- own, and the ones after it run each in its own. Effects: exactly once for every message that
-- succeeded, none for the failed one. Calls of record(): 3/0 twice, 4/0 and 5/0 once.
TRUNCATE regress_eventbox_fn.effects, regress_eventbox_fn.failing;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/4/0', 'also');
SELECT pg_temp.put('both', 'orders', 3, 0, 'A'), pg_temp.put('both', 'orders', 4, 0, 'A'),
       pg_temp.put('both', 'orders', 5, 0, 'A');
SELECT setval('regress_eventbox_fn.record_calls', 1, false);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('both');
RESET ROLE;
SELECT nextval('regress_eventbox_fn.record_calls') - 1 AS record_calls;
SELECT message_id, status, attempts, last_error FROM msgs
 WHERE sub = 'both' AND message_id IN ('orders/3/0', 'orders/4/0', 'orders/5/0')
 ORDER BY message_id;
SELECT message_id, handler, count(*) FROM regress_eventbox_fn.effects
 GROUP BY message_id, handler ORDER BY message_id, handler;
TRUNCATE regress_eventbox_fn.failing;

-- ---- process: retry with backoff, dead after exactly max_attempts --------------------------

TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('retries', ARRAY['orders'], max_attempts => 3,
                                   backoff => '1 hour', backoff_max => '10 hours');
SELECT eventbox.register_handler('retries', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/0', 'record');
SELECT pg_temp.put('retries', 'orders', 0, 0);
-- Attempt 1 fails: retry after backoff * [1/2, 1] = 30 to 60 minutes, the error kept.
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('retries');
RESET ROLE;
SELECT status, attempts, next, done, last_error FROM msgs WHERE sub = 'retries';
SELECT next_attempt_at - now() BETWEEN interval '29 minutes' AND interval '60 minutes'
       AS first_backoff FROM eventbox.inbox WHERE subscription = 'retries';
-- Not due yet: nothing runs.
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('retries');
RESET ROLE;
SELECT status, attempts, next FROM msgs WHERE sub = 'retries';
-- Attempt 2 fails: the backoff doubled, 1 to 2 hours.
SELECT pg_temp.due('retries');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('retries');
RESET ROLE;
SELECT status, attempts, next, done, last_error FROM msgs WHERE sub = 'retries';
SELECT next_attempt_at - now() BETWEEN interval '59 minutes' AND interval '120 minutes'
       AS second_backoff FROM eventbox.inbox WHERE subscription = 'retries';
-- Attempt 3 = max_attempts fails: dead, with the last error and no retry time.
SELECT pg_temp.due('retries');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('retries');
RESET ROLE;
SELECT status, attempts, next, done, last_error FROM msgs WHERE sub = 'retries';
-- Dead messages are not run again.
SELECT pg_temp.due('retries');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('retries');
RESET ROLE;
SELECT status, attempts FROM msgs WHERE sub = 'retries';
-- The failed attempts left no effect.
SELECT count(*) AS effects FROM regress_eventbox_fn.effects;
-- max_attempts 1: the first failure is final.
SET ROLE regress_eventbox_owner;
SELECT eventbox.alter_subscription('retries', max_attempts => 1);
RESET ROLE;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/1', 'record');
SELECT pg_temp.put('retries', 'orders', 0, 1);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('retries');
RESET ROLE;
SELECT message_id, status, attempts, next, last_error FROM msgs WHERE sub = 'retries'
 ORDER BY message_id;
TRUNCATE regress_eventbox_fn.failing;

-- The backoff runs from the failure, not from the start of the caller's transaction: a call
-- made late in a transaction does not run a failed message again at once. (Fails before the
-- fix: next_attempt_at is now() + delay, now() being the transaction's start, so after the
-- 1.5 s sleep the retry is due at once and the same call runs it two or three times.)
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('slow', ARRAY['orders'], max_attempts => 10,
                                   backoff => '1 second', backoff_max => '1 hour');
SELECT eventbox.register_handler('slow', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/0', 'record');
SELECT pg_temp.put('slow', 'orders', 0, 0);
BEGIN;
SELECT pg_sleep(1.5);
SET LOCAL ROLE regress_eventbox_owner;
SELECT eventbox.process('slow') = 1 AS one_message_handled;
RESET ROLE;
SELECT attempts = 1 AS one_attempt, status FROM msgs WHERE sub = 'slow';
ROLLBACK;
TRUNCATE regress_eventbox_fn.failing;

-- A backoff whose retry time cannot be stored is refused when the subscription is created, or
-- clamped when a message fails: never an error that aborts the whole call. (Fails before the
-- fix: create_subscription accepts it, and process() ends in ERROR 22008 "interval out of
-- range" at the first failure, which rolls back the other messages of the call too.)
SET ROLE regress_eventbox_owner;
SELECT pg_temp.sqlstate_of($$SELECT eventbox.create_subscription('huge', ARRAY['orders'],
    backoff => '1000000 years', backoff_max => '1000000 years')$$) IN ('ok', '22023')
       AS created_or_refused;
SELECT pg_temp.sqlstate_of($$SELECT eventbox.register_handler('huge',
    'regress_eventbox_fn.record(eventbox.inbox)', run_as => 'regress_eventbox_runner')$$)
       IN ('ok', '42704') AS registered_if_created;
RESET ROLE;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/0', 'record');
SELECT pg_temp.put('huge', 'orders', 0, 0), pg_temp.put('huge', 'orders', 1, 0);
SET ROLE regress_eventbox_owner;
SELECT pg_temp.sqlstate_of($$SELECT eventbox.process('huge')$$) IN ('ok', '42704')
       AS process_did_not_fail;
RESET ROLE;
SELECT count(*) >= 0 AS dropped
  FROM (SELECT eventbox.drop_subscription(name) FROM eventbox.subscriptions
         WHERE name = 'huge') AS d;
DELETE FROM eventbox.inbox WHERE subscription = 'huge';
TRUNCATE regress_eventbox_fn.failing;

-- ---- process: ordering ---------------------------------------------------------------------

-- 'partition': a message waiting for its retry holds back the later messages of its partition
-- (neither run nor counted), not those of other partitions or topics.
TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('ordp', ARRAY['orders', 'refunds'], backoff => '1 hour',
                                   backoff_max => '10 hours');
SELECT eventbox.register_handler('ordp', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/0', 'record');
SELECT pg_temp.put('ordp', 'orders', 0, 0), pg_temp.put('ordp', 'orders', 0, 1),
       pg_temp.put('ordp', 'orders', 0, 2), pg_temp.put('ordp', 'orders', 1, 0),
       pg_temp.put('ordp', 'orders', 1, 1), pg_temp.put('ordp', 'refunds', 0, 0);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordp');
RESET ROLE;
SELECT message_id, status, attempts, next FROM msgs WHERE sub = 'ordp' ORDER BY message_id;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordp');
RESET ROLE;
-- Fixed and due: the partition goes on, in offset order.
TRUNCATE regress_eventbox_fn.failing;
SELECT pg_temp.due('ordp');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordp');
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE sub = 'ordp' ORDER BY message_id;
SELECT topic, "partition", "offset", attempts FROM regress_eventbox_fn.effects
 ORDER BY topic, "partition", n;

-- 'key': it holds back only the later messages with the same key (messages without a key are
-- one key of their own).
TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('ordk', ARRAY['orders'], ordering => 'key',
                                   backoff => '1 hour', backoff_max => '10 hours');
SELECT eventbox.register_handler('ordk', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/0', 'record'), ('orders/0/3', 'record');
SELECT pg_temp.put('ordk', 'orders', 0, 0, key => 'a'), pg_temp.put('ordk', 'orders', 0, 1, key => 'b'),
       pg_temp.put('ordk', 'orders', 0, 2, key => 'a'), pg_temp.put('ordk', 'orders', 0, 3),
       pg_temp.put('ordk', 'orders', 0, 4), pg_temp.put('ordk', 'orders', 0, 5, key => 'b');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordk');
RESET ROLE;
SELECT message_id, key, status, attempts, next FROM msgs WHERE sub = 'ordk' ORDER BY message_id;
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordk');
RESET ROLE;
TRUNCATE regress_eventbox_fn.failing;
SELECT pg_temp.due('ordk');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordk');
RESET ROLE;
SELECT message_id, key, status, attempts FROM msgs WHERE sub = 'ordk' ORDER BY message_id;
SELECT "offset", attempts FROM regress_eventbox_fn.effects ORDER BY n;

-- 'none': it holds back nothing.
TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('ordn', ARRAY['orders'], ordering => 'none',
                                   backoff => '1 hour', backoff_max => '10 hours');
SELECT eventbox.register_handler('ordn', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/0', 'record');
SELECT pg_temp.put('ordn', 'orders', 0, 0, key => 'a'), pg_temp.put('ordn', 'orders', 0, 1, key => 'a'),
       pg_temp.put('ordn', 'orders', 0, 2);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordn');
RESET ROLE;
SELECT message_id, key, status, attempts, next FROM msgs WHERE sub = 'ordn' ORDER BY message_id;
TRUNCATE regress_eventbox_fn.failing;

-- Messages that wait do not hide later due messages of their partition from a call, however
-- many of them come first. (Fails before the fix: a pass reads only the first max_messages
-- messages of each partition - the first 1000 with ordering 'key' - so waiting messages there
-- stop every later one; the handler workers pass 64 as max_messages.)
-- 'none', with max_messages => 2: two waiting retries, then a due message.
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", status,
                            attempts, next_attempt_at)
VALUES ('ordn', 'orders/1/0', 'orders', 1, 0, 'retry', 1, now() + interval '1 hour'),
       ('ordn', 'orders/1/1', 'orders', 1, 1, 'retry', 1, now() + interval '1 hour');
SELECT pg_temp.put('ordn', 'orders', 1, 2);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordn', 2) AS none_window;
SELECT eventbox.process('ordn') IS NOT NULL AS drained;
RESET ROLE;
SELECT message_id, status, attempts, next FROM msgs WHERE sub = 'ordn' AND message_id LIKE 'orders/1/%'
 ORDER BY message_id;
-- 'key': key 'a' waits and has 1000 more messages; then one message with key 'b'.
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", key, status,
                            attempts, next_attempt_at)
VALUES ('ordk', 'orders/1/0', 'orders', 1, 0, 'a', 'retry', 1, now() + interval '1 hour');
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", key)
SELECT 'ordk', 'orders/1/' || o, 'orders', 1, o, 'a' FROM generate_series(1, 1000) AS o;
SELECT pg_temp.put('ordk', 'orders', 1, 1001, key => 'b');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ordk') AS key_window;
RESET ROLE;
SELECT key, status, count(*) FROM msgs WHERE sub = 'ordk' AND message_id LIKE 'orders/1/%'
 GROUP BY 1, 2 ORDER BY 1, 2;
DELETE FROM eventbox.inbox WHERE subscription = 'ordk' AND "partition" = 1;

-- ---- process: unhandled messages kept ------------------------------------------------------

TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('keep', ARRAY['orders'], unhandled => 'keep',
                                   backoff => '1 hour', backoff_max => '10 hours');
SELECT eventbox.register_handler('keep', 'regress_eventbox_fn.record(eventbox.inbox)', 'A',
                                 'regress_eventbox_runner');
RESET ROLE;
-- Kept messages stay 'received', uncounted, and do not hold back the later ones.
SELECT pg_temp.put('keep', 'orders', 0, 0, 'B'), pg_temp.put('keep', 'orders', 0, 1, 'A'),
       pg_temp.put('keep', 'orders', 0, 2);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('keep');
RESET ROLE;
SELECT message_id, event_type, status, attempts, next, done FROM msgs WHERE sub = 'keep'
 ORDER BY message_id;
-- A handler registered later gets them.
SET ROLE regress_eventbox_owner;
SELECT eventbox.register_handler('keep', 'regress_eventbox_fn.record(eventbox.inbox)', 'B',
                                 'regress_eventbox_runner');
SELECT eventbox.process('keep');
RESET ROLE;
SELECT message_id, event_type, status, attempts FROM msgs WHERE sub = 'keep' ORDER BY message_id;
-- Kept messages do not use up a call's max_messages either. (Fails before the fix: the two
-- kept messages fill the window of two and the call handles nothing.)
SELECT pg_temp.put('keep', 'orders', 1, 0, 'C'), pg_temp.put('keep', 'orders', 1, 1, 'C'),
       pg_temp.put('keep', 'orders', 1, 2, 'A');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('keep', 2) AS keep_window;
SELECT eventbox.process('keep') IS NOT NULL AS drained;
RESET ROLE;
SELECT message_id, event_type, status, attempts FROM msgs WHERE sub = 'keep' ORDER BY message_id;
-- Back to 'ignore': the kept ones are ignored now.
SET ROLE regress_eventbox_owner;
SELECT eventbox.alter_subscription('keep', unhandled => 'ignore');
SELECT eventbox.process('keep');
RESET ROLE;
SELECT message_id, event_type, status, attempts, done FROM msgs WHERE sub = 'keep'
 ORDER BY message_id;

-- ---- process: a message whose last attempt never finished ----------------------------------

-- A worker's pass claims a lane's messages (eventbox.handler_claims, committed before they run)
-- and empties the claim with their last outcome. A claim left behind means the backend running
-- them died: a message still waiting with the attempts it had when claimed gets that attempt
-- counted; with attempts left it runs again, alone; without, it goes dead unrun. A message whose
-- outcome committed since (attempts moved on) is not counted again.
TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('crashed', ARRAY['orders'], max_attempts => 2,
                                   backoff => '1 hour', backoff_max => '10 hours');
SELECT eventbox.register_handler('crashed', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", status,
                            attempts)
VALUES ('crashed', 'orders/0/0', 'orders', 0, 0, 'received', 1),
       ('crashed', 'orders/1/0', 'orders', 1, 0, 'received', 0),
       ('crashed', 'orders/3/0', 'orders', 3, 0, 'retry', 1);
SELECT pg_temp.put('crashed', 'orders', 2, 0);
SELECT pg_temp.due('crashed');
INSERT INTO eventbox.handler_claims (subscription, topic, "partition", message_ids, attempts)
VALUES ('crashed', 'orders', 0, ARRAY['orders/0/0'], ARRAY[1]),
       ('crashed', 'orders', 1, ARRAY['orders/1/0'], ARRAY[0]),
       ('crashed', 'orders', 3, ARRAY['orders/3/0'], ARRAY[0]);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('crashed');
RESET ROLE;
SELECT message_id, status, attempts, next, last_error FROM msgs WHERE sub = 'crashed'
 ORDER BY message_id;
SELECT * FROM fx ORDER BY message_id;
-- The settled claims are empty (process() runs in the caller's transaction and claims nothing).
SELECT "partition", message_ids, attempts FROM eventbox.handler_claims
 WHERE subscription = 'crashed' ORDER BY 1;

-- ---- process: a handler that changes its own message through the API -----------------------

-- The processed mark finds the row where the pass read it; a handler that moved it (here with
-- eventbox.retry() on its own message) leaves it elsewhere, and the mark finds it by id: the
-- message ends processed with one attempt, and its effects are there once.
TRUNCATE regress_eventbox_fn.effects;
CREATE FUNCTION regress_eventbox_fn.self_retry(msg eventbox.inbox) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO regress_eventbox_fn.effects
        (message_id, topic, "partition", "offset", handler, run_as, attempts, search_path)
    VALUES (msg.message_id, msg.topic, msg."partition", msg."offset", 'self_retry', current_user,
            msg.attempts, current_setting('search_path'));
    PERFORM eventbox.retry(msg.subscription, msg.message_id);
END $$;
GRANT EXECUTE ON FUNCTION regress_eventbox_fn.self_retry(eventbox.inbox) TO regress_eventbox_owner;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('selfop', ARRAY['orders']);
SELECT eventbox.register_handler('selfop', 'regress_eventbox_fn.self_retry(eventbox.inbox)',
                                 run_as => 'regress_eventbox_owner');
RESET ROLE;
SELECT pg_temp.put('selfop', 'orders', 0, 0);
SELECT pg_temp.put('selfop', 'orders', 0, 1);
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('selfop');
SELECT eventbox.process('selfop');
RESET ROLE;
SELECT message_id, status, attempts, next, last_error FROM msgs WHERE sub = 'selfop'
 ORDER BY message_id;
SELECT message_id, handler, run_as, attempts FROM regress_eventbox_fn.effects
 ORDER BY message_id;

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

-- ---- process: by a role that does not own the subscription ---------------------------------

SELECT pg_temp.put('basic', 'orders', 0, 5, 'A');
SET ROLE regress_eventbox_stranger;
SELECT eventbox.process('basic');
:show_sqlstate
SELECT eventbox.process('basic', 1);
:show_sqlstate
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE message_id = 'orders/0/5' AND sub = 'basic';
-- The owner may.
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('basic');
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE message_id = 'orders/0/5' AND sub = 'basic';

-- ---- operations: retry, redrive, skip, replay ----------------------------------------------

TRUNCATE regress_eventbox_fn.effects;
SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('ops', ARRAY['orders', 'refunds'], max_attempts => 1,
                                   backoff => '1 hour', backoff_max => '10 hours');
SELECT eventbox.register_handler('ops', 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
-- Four messages that die (X, X, Y and an untyped one), one processed, one received.
INSERT INTO regress_eventbox_fn.failing
SELECT 'orders/' || p || '/0', 'record' FROM generate_series(0, 3) AS p;
SELECT pg_temp.put('ops', 'orders', 0, 0, 'X'), pg_temp.put('ops', 'orders', 1, 0, 'X'),
       pg_temp.put('ops', 'orders', 2, 0, 'Y'), pg_temp.put('ops', 'orders', 3, 0),
       pg_temp.put('ops', 'orders', 4, 0, 'X');
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ops');
RESET ROLE;
SELECT pg_temp.put('ops', 'orders', 5, 0, 'X');
TRUNCATE regress_eventbox_fn.failing;
SELECT message_id, event_type, status, attempts FROM msgs WHERE sub = 'ops' ORDER BY message_id;

-- retry: a dead message again, attempts from zero, due now.
SET ROLE regress_eventbox_owner;
SELECT eventbox.retry('ops', 'orders/0/0');
RESET ROLE;
SELECT message_id, status, attempts, next, last_error FROM msgs
 WHERE sub = 'ops' AND message_id = 'orders/0/0';
SET ROLE regress_eventbox_owner;
SELECT eventbox.process('ops');
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE sub = 'ops' AND message_id = 'orders/0/0';
-- A processed message is not run again; unknown messages and subscriptions.
SET ROLE regress_eventbox_owner;
SELECT eventbox.retry('ops', 'orders/0/0');
:show_sqlstate
SELECT eventbox.retry('ops', 'orders/9/9');
:show_sqlstate
SELECT eventbox.retry('ops', NULL);
:show_sqlstate
SELECT eventbox.retry('nope', 'orders/0/0');
:show_sqlstate
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE sub = 'ops' AND message_id = 'orders/0/0';

-- redrive: dead -> retry, by event type or all; returns how many.
SET ROLE regress_eventbox_owner;
SELECT eventbox.redrive('ops', 'Y');
RESET ROLE;
SELECT message_id, status, attempts, next FROM msgs WHERE sub = 'ops' AND status <> 'processed'
 ORDER BY message_id;
SET ROLE regress_eventbox_owner;
SELECT eventbox.redrive('ops', 'Z');
SELECT eventbox.redrive('ops');
RESET ROLE;
SELECT message_id, status, attempts, next FROM msgs WHERE sub = 'ops' AND status <> 'processed'
 ORDER BY message_id;
SET ROLE regress_eventbox_owner;
SELECT eventbox.redrive('ops');
SELECT eventbox.redrive('nope');
:show_sqlstate
SELECT eventbox.process('ops');
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE sub = 'ops' ORDER BY message_id;

-- skip: received, retry, dead or unparsable -> ignored, noting who skipped it.
SELECT pg_temp.put('ops', 'orders', 6, 0, 'X');
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", status,
                            attempts, next_attempt_at, last_error)
VALUES ('ops', 'orders/7/0', 'orders', 7, 0, 'dead', 1, NULL, 'P0001: boom'),
       ('ops', 'orders/8/0', 'orders', 8, 0, 'unparsable', 0, NULL, NULL),
       ('ops', 'orders/9/0', 'orders', 9, 0, 'retry', 1, now() + interval '1 hour', 'P0001: boom');
SET ROLE regress_eventbox_owner;
SELECT eventbox.skip('ops', 'orders/6/0');
SELECT eventbox.skip('ops', 'orders/7/0');
SELECT eventbox.skip('ops', 'orders/8/0');
SELECT eventbox.skip('ops', 'orders/9/0');
RESET ROLE;
SELECT message_id, status, attempts, done, last_error FROM msgs
 WHERE sub = 'ops' AND message_id IN ('orders/6/0', 'orders/7/0', 'orders/8/0', 'orders/9/0')
 ORDER BY message_id;
-- Processed and ignored messages cannot be skipped; unknown ones.
SET ROLE regress_eventbox_owner;
SELECT eventbox.skip('ops', 'orders/0/0');
:show_sqlstate
SELECT eventbox.skip('ops', 'orders/6/0');
:show_sqlstate
SELECT eventbox.skip('ops', 'orders/9/9');
:show_sqlstate
SELECT eventbox.skip('nope', 'orders/6/0');
:show_sqlstate
-- An ignored message can be retried.
SELECT eventbox.retry('ops', 'orders/6/0');
SELECT eventbox.process('ops');
RESET ROLE;
SELECT message_id, status, attempts FROM msgs WHERE sub = 'ops' AND message_id = 'orders/6/0';

-- replay: sets the partition's next offset, backwards or forwards.
SET ROLE regress_eventbox_owner;
SELECT eventbox.replay('ops', 'orders', 0, 5);
SELECT eventbox.replay('ops', 'refunds', 3, 0);
SELECT eventbox.replay('ops', 'orders', 0, 2);
RESET ROLE;
SELECT subscription, topic, "partition", next_offset FROM eventbox.offsets
 WHERE subscription = 'ops' ORDER BY 2, 3;
SET ROLE regress_eventbox_owner;
SELECT eventbox.replay('ops', 'payments', 0, 0);
:show_sqlstate
SELECT eventbox.replay('ops', NULL, 0, 0);
:show_sqlstate
SELECT eventbox.replay('ops', 'orders', -1, 0);
:show_sqlstate
SELECT eventbox.replay('ops', 'orders', 0, -1);
:show_sqlstate
SELECT eventbox.replay('ops', 'orders', NULL, 0);
:show_sqlstate
SELECT eventbox.replay('nope', 'orders', 0, 0);
:show_sqlstate
RESET ROLE;
-- None of the operations is open to a role that does not own the subscription.
SET ROLE regress_eventbox_stranger;
SELECT eventbox.retry('ops', 'orders/1/0');
:show_sqlstate
SELECT eventbox.redrive('ops');
:show_sqlstate
SELECT eventbox.skip('ops', 'orders/1/0');
:show_sqlstate
SELECT eventbox.replay('ops', 'orders', 0, 0);
:show_sqlstate
RESET ROLE;
SELECT subscription, topic, "partition", next_offset FROM eventbox.offsets
 WHERE subscription = 'ops' ORDER BY 2, 3;
SELECT message_id, status, attempts FROM msgs WHERE sub = 'ops' ORDER BY message_id;

-- ---- process() leaves the caller's settings alone ------------------------------------------

-- A search_path the session got from the database's settings is the same after a call, and
-- so is what RESET goes back to. (Fails before the fix: process() pins the handler's
-- search_path as a new session default, so the session keeps "$user", public.)
SELECT current_database() AS dbname \gset
ALTER DATABASE :"dbname" SET search_path = regress_eventbox_fn, public;
\c -
SHOW search_path;
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", event_type)
VALUES ('basic', 'orders/0/6', 'orders', 0, 6, 'A');
SELECT eventbox.process('basic');
SHOW search_path;
RESET search_path;
SHOW search_path;
ALTER DATABASE :"dbname" RESET search_path;
\c -

-- ---- clean up ------------------------------------------------------------------------------

SELECT name, owner FROM eventbox.subscriptions ORDER BY name;
SELECT eventbox.drop_subscription(name) FROM eventbox.subscriptions ORDER BY name;
SELECT count(*) AS subscriptions FROM eventbox.subscriptions;
SELECT count(*) AS handlers FROM eventbox.handlers;
SELECT count(*) AS inbox_rows FROM eventbox.inbox;
SELECT count(*) AS offset_rows FROM eventbox.offsets;
SET client_min_messages = warning;
DROP SCHEMA regress_eventbox_fn CASCADE;
RESET client_min_messages;
REVOKE ALL ON FUNCTION
    eventbox.create_subscription(text, text[], text, text, integer, interval, interval, text,
                                 text, integer, text, text[], text, text, text, boolean),
    eventbox.alter_subscription(text, text[], text, text, integer, interval, interval, text, text,
                                integer, text, boolean, text[], text, text, text),
    eventbox.drop_subscription(text),
    eventbox.register_handler(text, regprocedure, text, name),
    eventbox.unregister_handler(text, regprocedure, text),
    eventbox.process(text, integer),
    eventbox.retry(text, text),
    eventbox.redrive(text, text),
    eventbox.skip(text, text),
    eventbox.replay(text, text, integer, bigint)
  FROM regress_eventbox_owner, regress_eventbox_stranger, regress_eventbox_team,
       regress_eventbox_noinherit;
REVOKE ALL ON SCHEMA eventbox FROM regress_eventbox_owner, regress_eventbox_stranger,
                                   regress_eventbox_team, regress_eventbox_noinherit;
DROP ROLE regress_eventbox_colleague, regress_eventbox_team, regress_eventbox_noinherit,
          regress_eventbox_owner, regress_eventbox_runner, regress_eventbox_stranger,
          regress_eventbox_nobody, regress_eventbox_super;

-- ---- a handler calling eventbox.process() --------------------------------------------------

-- Last, in a transaction that is rolled back: before the fix this crashes the backend
-- (segfault: the nested pass resets the memory and the lane state the outer pass is still
-- using), which ends this file here and restarts the server. A nested call must be refused
-- with an error; the handler then fails like any other and the message waits for its retry.
BEGIN;
CREATE ROLE regress_eventbox_nested;
GRANT USAGE ON SCHEMA eventbox TO regress_eventbox_nested;
GRANT EXECUTE ON FUNCTION
    eventbox.create_subscription(text, text[], text, text, integer, interval, interval, text,
                                 text, integer, text, text[], text, text, text, boolean),
    eventbox.register_handler(text, regprocedure, text, name),
    eventbox.process(text, integer)
  TO regress_eventbox_nested;
CREATE FUNCTION pg_temp.nested(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM eventbox.process('nested');
END $$;
GRANT EXECUTE ON FUNCTION pg_temp.nested(eventbox.inbox) TO regress_eventbox_nested;
SET LOCAL ROLE regress_eventbox_nested;
SELECT eventbox.create_subscription('nested', ARRAY['orders'], backoff => '1 hour',
                                   backoff_max => '10 hours');
SELECT eventbox.register_handler('nested', 'pg_temp.nested(eventbox.inbox)');
RESET ROLE;
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset")
VALUES ('nested', 'orders/0/0', 'orders', 0, 0), ('nested', 'orders/0/1', 'orders', 0, 1),
       ('nested', 'orders/1/0', 'orders', 1, 0);
SET LOCAL ROLE regress_eventbox_nested;
SELECT eventbox.process('nested');
RESET ROLE;
SELECT message_id, status, attempts, last_error ~ '^[0-9A-Z]{5}: ' AS failed_with_sqlstate
  FROM eventbox.inbox WHERE subscription = 'nested' ORDER BY message_id;
ROLLBACK;

-- Handlers are called directly (fmgr), their call set up once per function: a changed function
-- (another language, a SET clause, SECURITY DEFINER) is called as it is now, within a session.
BEGIN;
CREATE ROLE regress_eventbox_redef;
CREATE TABLE pg_temp.redef_seen (message_id text, how text, who name, datestyle text);
GRANT INSERT ON pg_temp.redef_seen TO regress_eventbox_redef;
CREATE FUNCTION pg_temp.redef(msg eventbox.inbox) RETURNS void LANGUAGE sql AS $$
    INSERT INTO pg_temp.redef_seen VALUES (msg.message_id, 'sql', current_user,
                                          current_setting('datestyle'))
$$;
GRANT EXECUTE ON FUNCTION pg_temp.redef(eventbox.inbox) TO regress_eventbox_redef;
SELECT eventbox.create_subscription('redef', ARRAY['orders']);
SELECT eventbox.register_handler('redef', 'pg_temp.redef(eventbox.inbox)',
                                 run_as => 'regress_eventbox_redef');
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset")
VALUES ('redef', 'r1', 'orders', 0, 0), ('redef', 'r2', 'orders', 0, 1),
       ('redef', 'r3', 'orders', 0, 2);
SELECT eventbox.process('redef', 1);
CREATE OR REPLACE FUNCTION pg_temp.redef(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pg_temp.redef_seen VALUES (msg.message_id, 'plpgsql', current_user,
                                          current_setting('datestyle'));
END $$;
SELECT eventbox.process('redef', 1);
ALTER FUNCTION pg_temp.redef(eventbox.inbox) SET datestyle = 'German, DMY';
SELECT eventbox.process('redef', 1);
SELECT message_id, how, who, datestyle FROM pg_temp.redef_seen ORDER BY message_id;
ROLLBACK;
