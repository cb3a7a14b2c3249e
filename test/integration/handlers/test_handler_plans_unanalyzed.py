"""The handler path's statements cost what their batch costs, whatever the
inbox's statistics say: never analyzed, analyzed when every row was processed
(stale), or with a backlog that arrived after the last ANALYZE.

eventbox.process() runs the workers' code path with the same kept statements
and the same planner settings (workers/common.cpp, exec_kept), so
auto_explain (log_analyze, log_buffers, nested statements, sent to the client
as NOTICEs) shows exactly what a worker's pass runs. The inbox holds a backlog
of BACKLOG received messages in one subscription; each pass of 64 messages
must touch a number of buffers bounded by the batch, not by the backlog. The
defect this guards against: the fetch by ctid (a statement then, read without
one now) ran as an index scan over the subscription's whole todo backlog with a
ctid filter (tens of thousands of buffers per 64-message transaction, growing
with the backlog).

It runs in a database of its own, which the background workers do not serve.
"""

import pytest

from eventbox_fixtures import query, query_one
from eventbox_handler_lib import ScratchDatabase, explained_process, plan_scans

BACKLOG = 200000
PARTITIONS = 8
BATCH = 64
# A pass of 64 messages reads lanes, fetches and marks 64 rows: a few hundred
# buffers at most. The whole backlog spans thousands of heap pages and
# hundreds of thousands of index entries.
MAX_BUFFERS_PER_NODE = 1500
DB = "eventbox_plans"


@pytest.fixture(scope="module")
def plans_db(extension):
    db = ScratchDatabase(DB, "eb_plans_role", """
        CREATE SCHEMA plans;
        GRANT USAGE ON SCHEMA plans TO eb_plans_role;
        CREATE TABLE plans.sink (id text PRIMARY KEY, v int);
        GRANT INSERT ON plans.sink TO eb_plans_role;
        CREATE FUNCTION plans.on_msg(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $f$
        BEGIN
            INSERT INTO plans.sink VALUES (msg.message_id, (msg.payload->>'n')::int);
        END $f$;
        SELECT eventbox.create_subscription('plans', ARRAY['plans']);
        SELECT eventbox.register_handler('plans', 'plans.on_msg(eventbox.inbox)'::regprocedure,
                                         run_as => 'eb_plans_role');
    """)
    c = db.connect()
    yield c
    c.close()
    db.drop()


def add_backlog(c, first, n):
    """n received messages, offsets first.. in PARTITIONS lanes, ~200 B payloads."""
    query(c, """
        INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset",
                                    headers, payload, status)
        SELECT 'plans', 'm' || lpad(g::text, 9, '0'), 'plans', g %% %s, g / %s,
               '{}', jsonb_build_object('n', g, 'pad', repeat('x', 160)), 'received'
          FROM generate_series(%s, %s) g
    """, (PARTITIONS, PARTITIONS, first, first + n - 1))


def processed_by_hand(c, where=""):
    """Marks the subscription's rows processed (those of `where`) as passes would have, and
    raises the lanes' live positions past them as those passes' last outcomes would have: a
    position moves only with a pass's outcomes (docs/design/handlers.md, "Lane positions"), and
    rows marked by hand below it would be walked once by the next pass."""
    query(c, "UPDATE eventbox.inbox SET status = 'processed' WHERE subscription = 'plans' " + where)
    query(c, """
        UPDATE eventbox.inbox_positions p
           SET position = (SELECT max(i."offset") + 1 FROM eventbox.inbox i
                            WHERE i.subscription = p.subscription AND i.topic = p.topic
                              AND i."partition" = p."partition" AND i.mode <> 'replay')
         WHERE p.subscription = 'plans' AND NOT p.replay""")


def check_pass(c, state):
    handled, plans = explained_process(c, 'plans', BATCH)
    assert handled == BATCH, "%s: process() handled %s of %s" % (state, handled, BATCH)
    scans = plan_scans(plans, ("inbox",))
    assert scans, "%s: auto_explain showed no statement on eventbox.inbox" % state
    worst = max(scans, key=lambda s: s[3])
    assert worst[3] <= MAX_BUFFERS_PER_NODE, (
        "%s: a %s%s touched %d buffers (backlog of %d): %s" % (
            state, worst[1], " using " + worst[2] if worst[2] else "", worst[3], BACKLOG,
            worst[0][:300]))
    # The rows to run are read by their ctid without a statement (handlers/run.cpp,
    # fetch_rows); the processed mark finds them the same way, with a TID scan.
    mark = [s for s in scans if "status = 'processed'" in s[0] and "ctid" in s[0]]
    assert mark and all(s[1] == "Tid Scan" for s in mark), "%s: mark plans %s" % (state, mark)
    return worst[3]


def test_handler_pass_cost_is_bounded_by_its_batch_whatever_the_statistics(plans_db):
    c = plans_db
    # 1. Never analyzed (autovacuum may analyze meanwhile: the bound holds either way).
    add_backlog(c, 0, BACKLOG)
    never = check_pass(c, "never analyzed")
    # 2. Statistics taken when every message was processed (a drained inbox, vacuumed and
    #    analyzed by autovacuum), then a new backlog arrives: the statistics say no message
    #    waits.
    processed_by_hand(c)
    query(c, "VACUUM ANALYZE eventbox.inbox")
    add_backlog(c, BACKLOG, BACKLOG)
    stale = check_pass(c, "stale statistics, new backlog")
    # 3. After TRUNCATE (statistics survive it) and a fresh backlog.
    query(c, "TRUNCATE eventbox.inbox")
    add_backlog(c, 2 * BACKLOG, BACKLOG)
    truncated = check_pass(c, "after TRUNCATE")
    # 4. eventbox.reprocess() queued the whole (handled, vacuumed) backlog again as replays,
    #    and live messages arrive: the lanes' live reads skip no replay (an index range of their
    #    own) ...
    processed_by_hand(c)
    query(c, "VACUUM eventbox.inbox")
    assert query_one(c, "SELECT eventbox.reprocess('plans')") == BACKLOG
    add_backlog(c, 3 * BACKLOG, 1000)
    replays_live = check_pass(c, "replays queued, live backlog")
    # 5. ... and with no live message left, the replays are read as cheaply.
    processed_by_hand(c, "AND mode <> 'replay'")
    replays_only = check_pass(c, "replays queued, no live message")
    print("worst inbox node buffers per 64-message pass: never analyzed %d, stale %d, "
          "after TRUNCATE %d, replays and live %d, replays only %d (backlog %d)" % (
              never, stale, truncated, replays_live, replays_only, BACKLOG))
