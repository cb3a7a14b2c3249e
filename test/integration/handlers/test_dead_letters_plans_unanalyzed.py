"""The failure workflow's statements (dead_letters.cpp: the blocked keys of a
lane, the dead letters and key blocks written with the dead marks) cost what
their batch costs, whatever the inbox's statistics say, like the rest of the
handler pass (see test_handler_plans_unanalyzed.py, whose method this
follows: auto_explain of eventbox.process(), which runs the workers' kept
statements with their planner settings).

The subscription has on_dead 'block_key' and a dead-letter topic; its inbox
holds a backlog of BACKLOG received messages plus DEAD dead ones (old dead
letters that are no longer anyone's block) in the same lanes, and a pass
sends some messages to dead (a 22P02, not retried). Each pass's scans of
eventbox.inbox stay bounded by the batch, never by the backlog or by the
number of dead rows. It runs in a database of its own, which the background
workers do not serve."""

import pytest

from eventbox_fixtures import query, query_one
from eventbox_handler_lib import ScratchDatabase, explained_process, plan_scans

BACKLOG = 100000
DEAD = 50000
PARTITIONS = 8
BATCH = 64
MAX_BUFFERS_PER_NODE = 1500
DB = "eventbox_dl_plans"


@pytest.fixture(scope="module")
def dl_plans_db(extension):
    db = ScratchDatabase(DB, "eb_dl_plans_role", """
        CREATE SCHEMA plans;
        GRANT USAGE ON SCHEMA plans TO eb_dl_plans_role;
        CREATE TABLE plans.sink (id text PRIMARY KEY, v int);
        GRANT INSERT ON plans.sink TO eb_dl_plans_role;
        CREATE FUNCTION plans.on_msg(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $f$
        BEGIN
            INSERT INTO plans.sink VALUES (msg.message_id, (msg.payload->>'n')::int);
            IF (msg.payload->>'n')::int % 17 = 0 THEN
                PERFORM (msg.payload->>'pad')::int;     -- 22P02: dead at once
            END IF;
        END $f$;
        SELECT eventbox.create_subscription('dlplans', ARRAY['plans'], on_dead => 'block_key',
                                            dead_letter_topic => 'plans.dlt');
        SELECT eventbox.register_handler('dlplans', 'plans.on_msg(eventbox.inbox)'::regprocedure,
                                         run_as => 'eb_dl_plans_role');
    """)
    c = db.connect()
    yield c
    c.close()
    db.drop()


def add_rows(c, first, n, status):
    """n messages with offsets first.. in PARTITIONS lanes and 1000 keys, ~200 B payloads."""
    query(c, """
        INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset",
                                    key, headers, payload, status, last_error)
        SELECT 'dlplans', 'm' || lpad(g::text, 9, '0'), 'plans', g %% %s, g / %s,
               convert_to('k' || (g %% 1000), 'UTF8'), '{"event_type": "E"}',
               jsonb_build_object('n', g, 'pad', repeat('x', 160)), %s,
               CASE WHEN %s = 'dead' THEN '22P02: old' END
          FROM generate_series(%s, %s) g
    """, (PARTITIONS, PARTITIONS, status, status, first, first + n - 1))


def check_pass(c, state):
    handled, plans = explained_process(c, 'dlplans', BATCH)
    assert handled >= 1, "%s: process() handled nothing" % state
    ours = [(t, p) for t, p in plans if "key_blocks" in t or "dead_letter_topic" in t]
    assert any("WITH released AS" in t for t, _ in ours), "%s: no blocked-keys read" % state
    assert any("INSERT INTO eventbox.outbox" in t for t, _ in ours), "%s: no dead letter" % state
    text, node, _, buffers = max(plan_scans(plans, ("inbox", "key_blocks")),
                                 key=lambda s: s[3], default=(None, None, None, 0))
    assert buffers <= MAX_BUFFERS_PER_NODE, (
        "%s: a %s touched %d buffers (backlog %d, dead %d): %s" % (
            state, node, buffers, BACKLOG, DEAD, text[:300]))
    return buffers, handled


def test_dead_letter_statements_are_bounded_by_the_batch_whatever_the_statistics(dl_plans_db):
    c = dl_plans_db
    # Dead rows first (lower offsets), then the backlog behind them; never analyzed.
    add_rows(c, 0, DEAD, "dead")
    add_rows(c, DEAD, BACKLOG, "received")
    never, h1 = check_pass(c, "never analyzed")
    # Stale statistics: everything looked processed when they were taken.
    query(c, "UPDATE eventbox.inbox SET status = 'processed' WHERE status = 'received'")
    # As passes would have left them: nothing waits, the lanes' live positions past their rows
    # (a position moves only with a pass's outcomes: docs/design/handlers.md, "Lane positions").
    query(c, """
        UPDATE eventbox.inbox_positions p
           SET position = (SELECT max(i."offset") + 1 FROM eventbox.inbox i
                            WHERE i.subscription = p.subscription AND i.topic = p.topic
                              AND i."partition" = p."partition")
         WHERE p.subscription = 'dlplans' AND NOT p.replay""")
    query(c, "VACUUM ANALYZE eventbox.inbox")
    query(c, "VACUUM ANALYZE eventbox.key_blocks")
    add_rows(c, DEAD + BACKLOG, BACKLOG, "received")
    stale, h2 = check_pass(c, "stale statistics, new backlog")
    blocks = query_one(c, "SELECT count(*) FROM eventbox.key_blocks")
    letters = query_one(c, "SELECT count(*) FROM eventbox.outbox WHERE topic = 'plans.dlt'")
    print("worst inbox/key_blocks node buffers per pass: never analyzed %d, stale %d "
          "(backlog %d, dead %d; %d blocks, %d dead letters)"
          % (never, stale, BACKLOG, DEAD, blocks, letters))
    assert blocks > 0 and letters > 0
