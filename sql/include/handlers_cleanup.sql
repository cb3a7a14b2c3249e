-- Shared by the handlers_* suites: drops what handlers_setup.sql and the suite created.

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
  FROM regress_eventbox_owner, regress_eventbox_stranger, regress_eventbox_team,
       regress_eventbox_noinherit;
REVOKE ALL ON SCHEMA eventbox FROM regress_eventbox_owner, regress_eventbox_stranger,
                                   regress_eventbox_team, regress_eventbox_noinherit;
DROP ROLE regress_eventbox_colleague, regress_eventbox_team, regress_eventbox_noinherit,
          regress_eventbox_owner, regress_eventbox_runner, regress_eventbox_stranger,
          regress_eventbox_nobody, regress_eventbox_super;
