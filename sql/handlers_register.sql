-- Handlers, registration (docs/reference/functions.md, docs/reference/bad-input.md,
-- docs/guide/security.md): register_handler and unregister_handler with every refusal, and the
-- privilege boundaries around them: the API is closed to roles without its grants and to
-- roles that do not own the subscription, the tables and the internal functions to everyone.
-- The handlers_* suites (handlers_register, _process, _failures, _ordering, _run_as,
-- _operations) each start from sql/include/handlers_setup.sql and end with
-- sql/include/handlers_cleanup.sql. Needs no broker: inbox rows are inserted directly.

-- pg_regress sets PG_ABS_SRCDIR to its --inputdir: the top of the repository.
\getenv abs_srcdir PG_ABS_SRCDIR
\set handlers_setup :abs_srcdir '/sql/include/handlers_setup.sql'
\set handlers_cleanup :abs_srcdir '/sql/include/handlers_cleanup.sql'
\i :handlers_setup

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
 (9, $$SELECT eventbox._register_handler('regress_eventbox_owner'::regrole, 'reg', 'regress_eventbox_fn.record(eventbox.inbox)', NULL, 'regress_eventbox_runner', false)$$),
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

\i :handlers_cleanup
