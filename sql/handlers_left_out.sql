-- Handlers, left-out messages (docs/design/handlers.md, "Left out"): a read leaves out messages
-- that cannot run now (behind a waiting or blocked key, waiting for a retry with ordering
-- 'none', kept without a handler), and a lane's position passes them with the messages handled
-- after them, so that later reads do not walk those again. Each is read again when it can run:
-- a due retry from its own offset, a released block or a handler registered from the position
-- they lower. Needs no broker: inbox rows are inserted directly, eventbox.process() runs passes.

\getenv abs_srcdir PG_ABS_SRCDIR
\set handlers_setup :abs_srcdir '/sql/include/handlers_setup.sql'
\set handlers_cleanup :abs_srcdir '/sql/include/handlers_cleanup.sql'
\i :handlers_setup

CREATE TEMP VIEW live_positions AS
SELECT subscription, position FROM eventbox.inbox_positions WHERE NOT replay;
CREATE FUNCTION pg_temp.pass(sub text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    SET LOCAL ROLE regress_eventbox_owner;
    n := eventbox.process(sub, 100);
    RETURN n;
END $$;

SET ROLE regress_eventbox_owner;
SELECT eventbox.create_subscription('lo_key', ARRAY['orders'], ordering => 'key',
                                    backoff => '1 hour', backoff_max => '1 hour');
SELECT eventbox.create_subscription('lo_block', ARRAY['orders'], ordering => 'key',
                                    max_attempts => 1, on_dead => 'block_key');
SELECT eventbox.create_subscription('lo_none', ARRAY['orders'], ordering => 'none',
                                    backoff => '1 hour', backoff_max => '1 hour');
SELECT eventbox.create_subscription('lo_keep', ARRAY['orders'], unhandled => 'keep');
SELECT eventbox.register_handler(s, 'regress_eventbox_fn.record(eventbox.inbox)',
                                 run_as => 'regress_eventbox_runner')
  FROM unnest(ARRAY['lo_key', 'lo_block', 'lo_none']) AS s;
SELECT eventbox.register_handler('lo_keep', 'regress_eventbox_fn.record(eventbox.inbox)', 'A',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;

-- Ordering 'key': k1's first message fails and waits an hour; k1's second waits behind it, and
-- k2's run.
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/0/0', 'record');
SELECT pg_temp.put('lo_key', 'orders', 0, o, key => k)
  FROM (VALUES (0, 'k1'), (1, 'k1'), (2, 'k2'), (3, 'k2')) AS r(o, k);
SELECT pg_temp.pass('lo_key');
SELECT * FROM live_positions WHERE subscription = 'lo_key';
-- More of k2, handled past the two left out: the position passes them.
SELECT pg_temp.put('lo_key', 'orders', 0, o, key => 'k2') FROM generate_series(4, 6) AS o;
SELECT pg_temp.pass('lo_key');
SELECT * FROM live_positions WHERE subscription = 'lo_key';
SELECT message_id, status FROM msgs WHERE sub = 'lo_key' ORDER BY 1;
-- A pass now reads nothing below the position: one probe of the retries, no walk.
SELECT pg_temp.pass('lo_key');
-- The retry comes due and succeeds: the read starts at it, k1's second message runs after it.
TRUNCATE regress_eventbox_fn.failing;
SELECT pg_temp.due('lo_key');
SELECT pg_temp.pass('lo_key');
SELECT message_id, status, attempts FROM msgs WHERE sub = 'lo_key' ORDER BY 1;
SELECT message_id, handler FROM regress_eventbox_fn.effects
 WHERE message_id IN ('orders/0/0', 'orders/0/1') ORDER BY n;

-- on_dead 'block_key': b1's first message dies and holds b1 back; b2's run past it.
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/1/0', 'record');
SELECT pg_temp.put('lo_block', 'orders', 1, o, key => k)
  FROM (VALUES (0, 'b1'), (1, 'b1'), (2, 'b2')) AS r(o, k);
SELECT pg_temp.pass('lo_block');
SELECT pg_temp.put('lo_block', 'orders', 1, o, key => 'b2') FROM generate_series(3, 4) AS o;
SELECT pg_temp.pass('lo_block');
SELECT * FROM live_positions WHERE subscription = 'lo_block';
-- Skipping the dead message releases the key (its block goes at the next pass): its held
-- message runs, read from the lowered position.
SET ROLE regress_eventbox_owner;
SELECT eventbox.skip('lo_block', 'orders/1/0');
RESET ROLE;
SELECT pg_temp.pass('lo_block');
SELECT message_id, status FROM msgs WHERE sub = 'lo_block' ORDER BY 1;
SELECT count(*) AS blocks FROM eventbox.key_blocks WHERE subscription = 'lo_block';

-- Ordering 'none': a message waiting for its retry is passed, and read again once due.
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/2/0', 'record');
SELECT pg_temp.put('lo_none', 'orders', 2, o) FROM generate_series(0, 2) AS o;
SELECT pg_temp.pass('lo_none');
SELECT pg_temp.put('lo_none', 'orders', 2, o) FROM generate_series(3, 4) AS o;
SELECT pg_temp.pass('lo_none');
SELECT * FROM live_positions WHERE subscription = 'lo_none';
TRUNCATE regress_eventbox_fn.failing;
SELECT pg_temp.due('lo_none');
SELECT pg_temp.pass('lo_none');
SELECT message_id, status, attempts FROM msgs WHERE sub = 'lo_none' ORDER BY 1;

-- unhandled 'keep': a type without a handler is kept and passed; registering a handler for it
-- sends the positions back to the lanes' first rows, and the kept messages run.
SELECT pg_temp.put('lo_keep', 'orders', 3, o, event_type => t)
  FROM (VALUES (0, 'B'), (1, 'A'), (2, 'A')) AS r(o, t);
SELECT pg_temp.pass('lo_keep');
SELECT pg_temp.put('lo_keep', 'orders', 3, 3, event_type => 'A');
SELECT pg_temp.pass('lo_keep');
SELECT * FROM live_positions WHERE subscription = 'lo_keep';
SET ROLE regress_eventbox_owner;
SELECT eventbox.register_handler('lo_keep', 'regress_eventbox_fn.record(eventbox.inbox)', 'B',
                                 run_as => 'regress_eventbox_runner');
RESET ROLE;
SELECT * FROM live_positions WHERE subscription = 'lo_keep';
SELECT pg_temp.pass('lo_keep');
SELECT message_id, status FROM msgs WHERE sub = 'lo_keep' ORDER BY 1;

-- A message waiting for a retry, deleted by hand: what its key held back is read again.
INSERT INTO regress_eventbox_fn.failing VALUES ('orders/4/0', 'record');
SELECT pg_temp.put('lo_key', 'orders', 4, o, key => k)
  FROM (VALUES (0, 'k1'), (1, 'k1'), (2, 'k2')) AS r(o, k);
SELECT pg_temp.pass('lo_key');
SELECT pg_temp.put('lo_key', 'orders', 4, 3, key => 'k2');
SELECT pg_temp.pass('lo_key');
DELETE FROM eventbox.inbox WHERE subscription = 'lo_key' AND message_id = 'orders/4/0';
SELECT pg_temp.pass('lo_key');
SELECT message_id, status FROM msgs WHERE sub = 'lo_key' AND message_id LIKE 'orders/4/%'
 ORDER BY 1;

-- A role granted the right to write the inbox writes it: the triggers' conditions read
-- eventbox.worker_role with current_setting(), which any role may call (a function of the
-- extension there gave it 42501). The setting is empty here, and nobody can set it.
SHOW eventbox.worker_role;
SELECT pg_temp.try('SET eventbox.worker_role = ''ingest''');
CREATE ROLE regress_eventbox_writer;
GRANT USAGE ON SCHEMA eventbox TO regress_eventbox_writer;
GRANT SELECT, INSERT, UPDATE, DELETE ON eventbox.inbox TO regress_eventbox_writer;
SET ROLE regress_eventbox_writer;
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset")
VALUES ('lo_key', 'by-writer', 'orders', 5, 0);
UPDATE eventbox.inbox SET status = 'retry', next_attempt_at = now() + interval '1 hour'
 WHERE subscription = 'lo_key' AND message_id = 'by-writer';
UPDATE eventbox.inbox SET status = 'ignored', next_attempt_at = NULL
 WHERE subscription = 'lo_key' AND message_id = 'by-writer';
DELETE FROM eventbox.inbox WHERE subscription = 'lo_key' AND message_id = 'by-writer';
RESET ROLE;
SELECT "partition", position FROM eventbox.inbox_positions
 WHERE subscription = 'lo_key' AND "partition" = 5;
REVOKE ALL ON eventbox.inbox FROM regress_eventbox_writer;
REVOKE USAGE ON SCHEMA eventbox FROM regress_eventbox_writer;
DROP ROLE regress_eventbox_writer;

\i :handlers_cleanup
