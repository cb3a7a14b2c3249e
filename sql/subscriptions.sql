-- Subscriptions (docs/reference/functions.md, docs/reference/bad-input.md and
-- docs/guide/security.md): create_subscription, alter_subscription and drop_subscription. Every
-- bad input gets a clear ERROR with a SQLSTATE and a hint and leaves no partial state; only
-- members of a subscription's owner role may change it; the tables are written only through the
-- API. Needs no broker: nothing here waits for a message.
--
-- The default verbosity shows the message, DETAIL and HINT. The SQLSTATE is printed by
-- :after_error below rather than with VERBOSITY verbose, whose LOCATION lines carry source line
-- numbers of PostgreSQL (pl_exec.c) and of the extension and would make this file break on
-- unrelated changes.
\set SHOW_CONTEXT never
\set after_error 'SELECT :''LAST_ERROR_SQLSTATE'' AS sqlstate, (SELECT count(*) FROM eventbox.subscriptions) AS subscriptions;'
\set show_sqlstate 'SELECT :''LAST_ERROR_SQLSTATE'' AS sqlstate;'

-- Every column but created_at; the owner shown as current_user when it is the role running this.
CREATE TEMP VIEW subs AS
SELECT name, topics,
       CASE WHEN owner = current_user::text::regrole THEN 'current_user' ELSE owner::text END AS owner,
       start_from, ordering, max_attempts, backoff, backoff_max, message_id_field, unhandled,
       batch_size, group_id, enabled
  FROM eventbox.subscriptions;

-- ---- create_subscription: happy paths ------------------------------------------------------

-- Defaults.
SELECT eventbox.create_subscription('billing', ARRAY['orders']);
SELECT * FROM subs;
SELECT created_at <= now() AND created_at > now() - interval '1 hour' AS created_at_is_set
  FROM eventbox.subscriptions WHERE name = 'billing';

-- Topics are deduplicated and sorted.
SELECT eventbox.create_subscription('dedup',
    ARRAY['payments', 'orders.v2', 'audit', 'orders.v2', 'payments', 'orders.v1', 'audit']);
SELECT name, topics FROM subs WHERE name = 'dedup';

-- Every option, by name.
SELECT eventbox.create_subscription('everything', topics => ARRAY['refunds', 'payments'],
    start_from => 'latest', ordering => 'key', max_attempts => 3, backoff => '250 milliseconds',
    backoff_max => '1 hour', message_id_field => 'event_id', unhandled => 'keep',
    batch_size => 100000, group_id => 'billing-group');
-- ... and positionally, at the lower bounds.
SELECT eventbox.create_subscription('lower.bounds', ARRAY['t_1'], 'earliest', 'none', 1,
    '1 microsecond', '1 microsecond', 'id', 'ignore', 1, 'g');
-- Names: 1 to 63 of letters, digits, '_', '.' and '-'.
SELECT eventbox.create_subscription(repeat('n', 63), ARRAY['t']);
SELECT eventbox.create_subscription('A-z_0.9', ARRAY['t']);
SELECT eventbox.create_subscription('x', ARRAY['t']);
SELECT * FROM subs ORDER BY name;

-- ---- create_subscription: bad input --------------------------------------------------------

-- Names.
SELECT eventbox.create_subscription(NULL, ARRAY['orders']);
:after_error
SELECT eventbox.create_subscription('', ARRAY['orders']);
:after_error
SELECT eventbox.create_subscription('has space', ARRAY['orders']);
:after_error
SELECT eventbox.create_subscription(repeat('n', 64), ARRAY['orders']);
:after_error
SELECT eventbox.create_subscription('a/b', ARRAY['orders']);
:after_error
SELECT eventbox.create_subscription('café', ARRAY['orders']);
:after_error

-- Topics: required, no NULL element, each a valid Kafka topic name (the rule send() applies).
SELECT eventbox.create_subscription('s', NULL);
:after_error
SELECT eventbox.create_subscription('s', '{}');
:after_error
SELECT eventbox.create_subscription('s', ARRAY[NULL]::text[]);
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders', NULL]);
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders', 'bad topic']);
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders/created']);
:after_error
SELECT eventbox.create_subscription('s', ARRAY['']);
:after_error
SELECT eventbox.create_subscription('s', ARRAY['..']);
:after_error
SELECT eventbox.create_subscription('s', ARRAY[repeat('t', 250)]);
:after_error
SELECT eventbox.create_subscription('s', ARRAY[E'orders\n']);
:after_error

-- Enumerated options: exact, case-sensitive values.
SELECT eventbox.create_subscription('s', ARRAY['orders'], start_from => 'middle');
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], start_from => 'EARLIEST');
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], start_from => NULL);
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], ordering => 'random');
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], ordering => NULL);
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], unhandled => 'drop');
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], unhandled => NULL);
:after_error

-- Numbers and intervals.
SELECT eventbox.create_subscription('s', ARRAY['orders'], max_attempts => 0);
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], max_attempts => -1);
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], max_attempts => NULL);
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], backoff => '0');
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], backoff => '-1 second');
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], backoff => NULL);
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], backoff => '1 minute',
                                    backoff_max => '59 seconds');
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], backoff => '1 hour');
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], backoff_max => NULL);
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], batch_size => 0);
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], batch_size => 100001);
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], batch_size => NULL);
:after_error

-- Optional texts: NULL for none, never ''.
SELECT eventbox.create_subscription('s', ARRAY['orders'], group_id => '');
:after_error
SELECT eventbox.create_subscription('s', ARRAY['orders'], message_id_field => '');
:after_error

-- A name that is taken, whatever the options.
SELECT eventbox.create_subscription('billing', ARRAY['orders']);
:after_error
SELECT eventbox.create_subscription('billing', ARRAY['other'], start_from => 'latest');
:after_error

-- Every refusal has a SQLSTATE and a hint (docs/reference/bad-input.md), and its message shows
-- control characters escaped, never raw.
CREATE FUNCTION pg_temp.refusal(stmt text, OUT state text, OUT has_hint boolean,
                                OUT printable_message boolean) LANGUAGE plpgsql AS $$
DECLARE
    message text;
    hint text;
BEGIN
    EXECUTE stmt;
    state := 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
                            hint = PG_EXCEPTION_HINT;
    has_hint := hint <> '';
    printable_message := message !~ '[[:cntrl:]]';
END $$;
SELECT call, r.state AS sqlstate, r.has_hint, r.printable_message
  FROM (VALUES
    ($$create_subscription(NULL, ARRAY['t'])$$),
    ($$create_subscription('a b', ARRAY['t'])$$),
    ($$create_subscription(E'billing\n', ARRAY['t'])$$),
    ($$create_subscription(E'\t', ARRAY['t'])$$),
    ($$create_subscription('s', NULL)$$),
    ($$create_subscription('s', ARRAY[NULL]::text[])$$),
    ($$create_subscription('s', ARRAY['a b'])$$),
    ($$create_subscription('s', ARRAY[E'a\rb'])$$),
    ($$create_subscription('s', ARRAY['t'], start_from => 'middle')$$),
    ($$create_subscription('s', ARRAY['t'], start_from => E'x\ny')$$),
    ($$create_subscription('s', ARRAY['t'], ordering => 'random')$$),
    ($$create_subscription('s', ARRAY['t'], unhandled => 'drop')$$),
    ($$create_subscription('s', ARRAY['t'], max_attempts => 0)$$),
    ($$create_subscription('s', ARRAY['t'], max_attempts => NULL)$$),
    ($$create_subscription('s', ARRAY['t'], backoff => '0')$$),
    ($$create_subscription('s', ARRAY['t'], backoff_max => '0.5 seconds')$$),
    ($$create_subscription('s', ARRAY['t'], batch_size => 0)$$),
    ($$create_subscription('s', ARRAY['t'], batch_size => 100001)$$),
    ($$create_subscription('s', ARRAY['t'], batch_size => NULL)$$),
    ($$create_subscription('s', ARRAY['t'], group_id => '')$$),
    ($$create_subscription('s', ARRAY['t'], message_id_field => '')$$),
    ($$create_subscription('billing', ARRAY['t'])$$),
    ($$alter_subscription('nope')$$),
    ($$alter_subscription(E'no\npe')$$),
    ($$alter_subscription('billing', topics => '{}')$$),
    ($$alter_subscription('billing', max_attempts => 0)$$),
    ($$alter_subscription('billing', backoff_max => '0.5 seconds')$$),
    ($$alter_subscription('billing', batch_size => 0)$$),
    ($$drop_subscription('nope')$$),
    ($$drop_subscription(NULL)$$)) AS c(call),
       LATERAL pg_temp.refusal('SELECT eventbox.' || call) AS r;

-- Nothing of the above was stored.
SELECT name FROM subs ORDER BY name;
SELECT * FROM subs WHERE name = 'billing';

-- ---- alter_subscription --------------------------------------------------------------------

-- NULL keeps every option.
SELECT eventbox.alter_subscription('everything');
SELECT * FROM subs WHERE name = 'everything';
SELECT eventbox.alter_subscription('everything', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                   NULL, NULL, NULL);
SELECT * FROM subs WHERE name = 'everything';

-- Each option changes alone; topics are deduplicated and sorted again.
SELECT eventbox.alter_subscription('billing', topics => ARRAY['returns', 'orders', 'returns']);
SELECT eventbox.alter_subscription('billing', start_from => 'latest');
SELECT eventbox.alter_subscription('billing', ordering => 'none');
SELECT eventbox.alter_subscription('billing', max_attempts => 5);
SELECT eventbox.alter_subscription('billing', backoff => '2 seconds');
SELECT eventbox.alter_subscription('billing', backoff_max => '2 seconds');
SELECT eventbox.alter_subscription('billing', message_id_field => 'id');
SELECT eventbox.alter_subscription('billing', unhandled => 'keep');
SELECT eventbox.alter_subscription('billing', batch_size => 50);
SELECT eventbox.alter_subscription('billing', group_id => 'billing-v2');
SELECT * FROM subs WHERE name = 'billing';

-- '' clears message_id_field and group_id.
SELECT eventbox.alter_subscription('billing', message_id_field => '');
SELECT name, message_id_field, group_id FROM subs WHERE name = 'billing';
SELECT eventbox.alter_subscription('billing', group_id => '');
SELECT name, message_id_field, group_id FROM subs WHERE name = 'billing';

-- enabled toggles, and NULL keeps it.
SELECT eventbox.alter_subscription('billing', enabled => false);
SELECT name, enabled FROM subs WHERE name = 'billing';
SELECT eventbox.alter_subscription('billing', max_attempts => 6);
SELECT name, max_attempts, enabled FROM subs WHERE name = 'billing';
SELECT eventbox.alter_subscription('billing', enabled => true);
SELECT name, enabled FROM subs WHERE name = 'billing';

-- Unknown subscriptions.
SELECT eventbox.alter_subscription('nope', enabled => false);
:after_error
SELECT eventbox.alter_subscription(NULL, enabled => false);
:after_error

-- Invalid new values are refused and the row is unchanged.
SELECT * FROM subs WHERE name = 'billing';
SELECT eventbox.alter_subscription('billing', topics => '{}');
:after_error
SELECT eventbox.alter_subscription('billing', topics => ARRAY['orders', NULL]);
:after_error
SELECT eventbox.alter_subscription('billing', topics => ARRAY['orders', 'bad topic']);
:after_error
SELECT eventbox.alter_subscription('billing', start_from => 'middle');
:after_error
SELECT eventbox.alter_subscription('billing', ordering => 'random');
:after_error
SELECT eventbox.alter_subscription('billing', unhandled => 'drop');
:after_error
SELECT eventbox.alter_subscription('billing', max_attempts => 0);
:after_error
SELECT eventbox.alter_subscription('billing', backoff => '0');
:after_error
-- backoff_max is 2 seconds: a longer backoff alone, or a shorter backoff_max alone, is refused.
SELECT eventbox.alter_subscription('billing', backoff => '3 seconds');
:after_error
SELECT eventbox.alter_subscription('billing', backoff_max => '1 second');
:after_error
SELECT eventbox.alter_subscription('billing', batch_size => 0);
:after_error
SELECT eventbox.alter_subscription('billing', batch_size => 100001);
:after_error
-- One bad value among good ones changes nothing.
SELECT eventbox.alter_subscription('billing', topics => ARRAY['changed'], max_attempts => 99,
                                   enabled => false, batch_size => 0);
:after_error
SELECT * FROM subs WHERE name = 'billing';
-- Both bounds at once are checked together.
SELECT eventbox.alter_subscription('billing', backoff => '3 seconds', backoff_max => '1 minute');
SELECT name, backoff, backoff_max FROM subs WHERE name = 'billing';

-- ---- drop_subscription ---------------------------------------------------------------------

-- Rows of the subscription being dropped and of another one.
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", payload,
                            raw_payload, status)
VALUES ('x', 'm-1', 'orders', 0, 0, '{"n": 1}', NULL, 'processed'),
       ('x', 'orders/0/1', 'orders', 0, 1, NULL, '\xff', 'unparsable'),
       ('x', 'm-3', 'orders', 1, 0, '{"n": 3}', NULL, 'received'),
       ('billing', 'm-1', 'orders', 0, 0, '{"n": 1}', NULL, 'received');
INSERT INTO eventbox.offsets (subscription, topic, "partition", next_offset, high_watermark)
VALUES ('x', 'orders', 0, 2, 5),
       ('x', 'orders', 1, 1, NULL),
       ('billing', 'orders', 0, 1, 1);
-- A message is stored at most once per subscription.
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset")
VALUES ('x', 'm-1', 'orders', 3, 99);
:show_sqlstate
SELECT subscription, status, messages FROM eventbox.inbox_stats ORDER BY 1, 2;
SELECT subscription, topic, "partition", next_offset, high_watermark, lag
  FROM eventbox.lag ORDER BY 1, 2, 3;

SELECT eventbox.drop_subscription('x');
SELECT name FROM subs ORDER BY name;
SELECT subscription, count(*) FROM eventbox.inbox GROUP BY 1 ORDER BY 1;
SELECT subscription, count(*) FROM eventbox.offsets GROUP BY 1 ORDER BY 1;

-- Unknown subscriptions, including the one just dropped.
SELECT eventbox.drop_subscription('x');
:after_error
SELECT eventbox.drop_subscription('nope');
:after_error
SELECT eventbox.drop_subscription(NULL);
:after_error

-- The name is free again.
SELECT eventbox.create_subscription('x', ARRAY['t']);
SELECT eventbox.drop_subscription('x');

-- ---- authority -----------------------------------------------------------------------------

-- Two admin roles with the grants an admin needs (schema usage, EXECUTE on the API) and no right
-- on any table; a member of admin1, one that does not inherit, and a role without EXECUTE.
CREATE ROLE regress_eventbox_admin1;
CREATE ROLE regress_eventbox_admin2;
CREATE ROLE regress_eventbox_member1 IN ROLE regress_eventbox_admin1;
CREATE ROLE regress_eventbox_noinherit1 NOINHERIT IN ROLE regress_eventbox_admin1;
CREATE ROLE regress_eventbox_noexec;
GRANT USAGE ON SCHEMA eventbox TO regress_eventbox_admin1, regress_eventbox_admin2,
                                  regress_eventbox_noexec;
GRANT EXECUTE ON FUNCTION
    eventbox.create_subscription,
    eventbox.alter_subscription,
    eventbox.drop_subscription(text)
  TO regress_eventbox_admin1, regress_eventbox_admin2;

-- Runs a statement as the current role; 'ok' or the SQLSTATE and message of its error.
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- Statements that go around the API.
CREATE TEMP TABLE bypass (n int, stmt text);
GRANT SELECT ON bypass TO PUBLIC;
INSERT INTO bypass VALUES
 (1, $$INSERT INTO eventbox.subscriptions (name, topics, owner) VALUES ('forged', '{t}', 'regress_eventbox_admin1')$$),
 (2, $$UPDATE eventbox.subscriptions SET owner = 'regress_eventbox_admin2'$$),
 (3, $$DELETE FROM eventbox.subscriptions$$),
 (4, $$TRUNCATE eventbox.subscriptions$$),
 (5, $$SELECT count(*) FROM eventbox.subscriptions$$),
 (6, $$INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset") VALUES ('a1', 'm', 't', 0, 0)$$),
 (7, $$UPDATE eventbox.inbox SET status = 'processed'$$),
 (8, $$DELETE FROM eventbox.inbox$$),
 (9, $$TRUNCATE eventbox.inbox$$),
 (10, $$INSERT INTO eventbox.offsets (subscription, topic, "partition", next_offset) VALUES ('a1', 't', 0, 1000)$$),
 (11, $$UPDATE eventbox.offsets SET next_offset = 0$$),
 (12, $$DELETE FROM eventbox.offsets$$),
 (13, $$TRUNCATE eventbox.offsets$$),
 (14, $$SELECT eventbox._create_subscription('regress_eventbox_admin1'::regrole::oid, 'forged', ARRAY['t'], 'earliest', 'partition', 10, '1 second', '10 minutes', NULL, 'ignore', 1000, NULL, '{}', 'continue', NULL, 'default', false, 'kafka', false, 'json', 'json', 'direct')$$),
 (15, $$SELECT eventbox._alter_subscription('regress_eventbox_admin1'::regrole::oid, 'a1', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)$$),
 (16, $$SELECT eventbox._drop_subscription('regress_eventbox_admin1'::regrole::oid, 'a1')$$),
 (17, $$SELECT eventbox._managed_subscription('regress_eventbox_admin1'::regrole::oid, 'a1')$$),
 (18, $$SELECT eventbox._check_subscription_options(ARRAY['t'], 'earliest', 'partition', 1, '1 second', '1 second', 'ignore', 1)$$),
 (19, $$SELECT eventbox._check_topic('t')$$),
 (20, $$SELECT eventbox._notify_ingest()$$);

-- admin1 creates a subscription and owns it; it needs no right on the table.
SET ROLE regress_eventbox_admin1;
SELECT eventbox.create_subscription('a1', ARRAY['orders'], max_attempts => 4);
RESET ROLE;
SELECT * FROM subs WHERE name = 'a1';

-- admin2 may neither change nor drop it; the hint names the owner.
SET ROLE regress_eventbox_admin2;
SELECT eventbox.alter_subscription('a1', enabled => false);
:show_sqlstate
SELECT eventbox.alter_subscription('a1');
:show_sqlstate
SELECT eventbox.drop_subscription('a1');
:show_sqlstate
-- An unknown name is still reported as unknown.
SELECT eventbox.drop_subscription('nope');
:show_sqlstate
-- The name is taken.
SELECT eventbox.create_subscription('a1', ARRAY['orders']);
:show_sqlstate
-- admin2's own subscription.
SELECT eventbox.create_subscription('a2', ARRAY['orders']);
RESET ROLE;
SELECT name, owner, max_attempts, enabled FROM subs WHERE name IN ('a1', 'a2') ORDER BY name;

-- Neither admin can write (or read) the tables or call the internal functions.
SET ROLE regress_eventbox_admin1;
SELECT n, pg_temp.try(stmt) AS admin1 FROM bypass ORDER BY n;
SET ROLE regress_eventbox_admin2;
SELECT n, pg_temp.try(stmt) AS admin2 FROM bypass ORDER BY n;
RESET ROLE;
SELECT name, owner, max_attempts, enabled FROM subs WHERE name IN ('a1', 'a2') ORDER BY name;
SELECT count(*) AS inbox_rows FROM eventbox.inbox WHERE subscription = 'a1';
SELECT count(*) AS offset_rows FROM eventbox.offsets WHERE subscription = 'a1';

-- admin1 may not touch admin2's subscription either.
SET ROLE regress_eventbox_admin1;
SELECT eventbox.alter_subscription('a2', enabled => false);
:show_sqlstate
SELECT eventbox.drop_subscription('a2');
:show_sqlstate
RESET ROLE;

-- A member of admin1 may change it; the owner stays admin1.
SET ROLE regress_eventbox_member1;
SELECT eventbox.alter_subscription('a1', enabled => false, max_attempts => 5);
RESET ROLE;
SELECT name, owner, max_attempts, enabled FROM subs WHERE name = 'a1';
-- A member that does not inherit admin1's rights has none of its grants ...
SET ROLE regress_eventbox_noinherit1;
SELECT eventbox.alter_subscription('a1', enabled => true);
:show_sqlstate
RESET ROLE;
-- ... and with EXECUTE of its own still must SET ROLE to act as admin1.
GRANT USAGE ON SCHEMA eventbox TO regress_eventbox_noinherit1;
GRANT EXECUTE ON FUNCTION
    eventbox.alter_subscription
  TO regress_eventbox_noinherit1;
SET ROLE regress_eventbox_noinherit1;
SELECT eventbox.alter_subscription('a1', enabled => true);
:show_sqlstate
RESET ROLE;
SELECT name, owner, max_attempts, enabled FROM subs WHERE name = 'a1';

-- A role without EXECUTE can call none of the API.
SET ROLE regress_eventbox_noexec;
SELECT eventbox.create_subscription('noexec', ARRAY['orders']);
:show_sqlstate
SELECT eventbox.alter_subscription('a1', enabled => true);
:show_sqlstate
SELECT eventbox.drop_subscription('a1');
:show_sqlstate
RESET ROLE;

-- The member drops admin1's subscription, with its inbox and offsets rows.
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset")
VALUES ('a1', 'm-1', 'orders', 0, 0);
INSERT INTO eventbox.offsets (subscription, topic, "partition", next_offset)
VALUES ('a1', 'orders', 0, 1);
SET ROLE regress_eventbox_member1;
SELECT eventbox.drop_subscription('a1');
RESET ROLE;
SELECT name, owner FROM subs WHERE name IN ('a1', 'a2') ORDER BY name;
SELECT count(*) AS inbox_rows FROM eventbox.inbox WHERE subscription = 'a1';
SELECT count(*) AS offset_rows FROM eventbox.offsets WHERE subscription = 'a1';

-- admin2 drops its own.
SET ROLE regress_eventbox_admin2;
SELECT eventbox.drop_subscription('a2');
RESET ROLE;

-- ---- value_format, key_format and membership as options -------------------------------------

SELECT eventbox.create_subscription('f1', ARRAY['avro-orders'], value_format => 'registry',
                                    key_format => 'registry', membership => 'group');
SELECT name, value_format, key_format, membership FROM eventbox.subscriptions WHERE name = 'f1';
-- NULL keeps each; set_subscription_format() and alter_subscription() set the same columns.
SELECT eventbox.alter_subscription('f1', key_format => 'json');
SELECT eventbox.alter_subscription('f1', membership => 'direct');
SELECT eventbox.set_subscription_format('f1', 'json');
SELECT name, value_format, key_format, membership FROM eventbox.subscriptions WHERE name = 'f1';
-- Bad values: 22023 with a hint, nothing changed or created.
SELECT eventbox.create_subscription('f2', ARRAY['x'], value_format => 'avro');
SELECT eventbox.create_subscription('f2', ARRAY['x'], key_format => NULL);
SELECT eventbox.create_subscription('f2', ARRAY['x'], membership => 'cooperative');
SELECT eventbox.alter_subscription('f1', membership => '');
SELECT eventbox.set_subscription_format('f1', 'protobuf');
SELECT count(*) AS f2_created FROM eventbox.subscriptions WHERE name = 'f2';
SELECT name, value_format, key_format, membership FROM eventbox.subscriptions WHERE name = 'f1';
SELECT eventbox.drop_subscription('f1');

-- ---- clean up ------------------------------------------------------------------------------

SELECT eventbox.drop_subscription(name) FROM eventbox.subscriptions ORDER BY name;
SELECT count(*) AS subscriptions FROM eventbox.subscriptions;
SELECT count(*) AS inbox_rows FROM eventbox.inbox;
SELECT count(*) AS offset_rows FROM eventbox.offsets;
REVOKE ALL ON FUNCTION
    eventbox.create_subscription,
    eventbox.alter_subscription,
    eventbox.drop_subscription(text)
  FROM regress_eventbox_admin1, regress_eventbox_admin2, regress_eventbox_noinherit1;
REVOKE ALL ON SCHEMA eventbox FROM regress_eventbox_admin1, regress_eventbox_admin2,
                                   regress_eventbox_noinherit1, regress_eventbox_noexec;
DROP ROLE regress_eventbox_member1, regress_eventbox_noinherit1, regress_eventbox_noexec,
          regress_eventbox_admin1, regress_eventbox_admin2;
