-- Shared by the handlers_* suites (\i from each, see handlers_register.sql): the roles, the
-- handler functions and the helpers every suite starts from. handlers_cleanup.sql removes
-- them again, so each suite runs alone as well as in the schedule.
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
    eventbox.create_subscription,
    eventbox.alter_subscription,
    eventbox.drop_subscription(text),
    eventbox.register_handler(text, regprocedure, text, name, boolean),
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
                        'regress_eventbox_fn.record(eventbox.inbox)', NULL, 'regress_eventbox_super',
                        false);
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
