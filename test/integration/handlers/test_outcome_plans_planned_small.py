"""The statements that record a pass's outcomes by message id (retries, dead marks, ignored
messages, the dead letters and key blocks written with them, the blocked keys of a lane, the
attempts of a crashed pass's claim) cost what their batch costs when their plans were made on a
small inbox and then meet a large one: what a worker meets that planned while traffic was light
and then drains an outage's backlog before autovacuum analyzes the table again.

The defect this guards against: `subscription = $1 AND message_id = ANY ($2)` and the joins on
(subscription, message_id) were planned, on an inbox that looked small, as a walk of the
subscription's rows in key order with the ids as a filter, kept as the generic plan, and each
later batch walked the whole subscription. Plans come from auto_explain of eventbox.process()
(the workers' kept statements and planner settings) in one session: its plans are made in the
first phase and kept into the second. Autovacuum is off for the inbox of this scratch database,
so no ANALYZE replans them in between."""

import pytest

from eventbox_fixtures import query, query_one
from eventbox_handler_lib import ScratchDatabase, explained_process, plan_scans

SMALL = 48
BACKLOG = 100000
PARTITIONS = 4
BATCH = 64
MAX_BUFFERS_PER_NODE = 1500
DB = "eventbox_small_plans"
# Statements that must have run in both phases (so both were measured).
OUTCOMES = {
    "retry or dead mark": "ELSE 'retry' END",
    "ignored mark": "status = 'ignored'",
    "crashed claim": "never finished",
    "blocked keys": "WITH released AS",
    "dead letters": "dead_letter_topic FROM d, s",
}


@pytest.fixture(scope="module")
def small_db(extension):
    db = ScratchDatabase(DB, "eb_small_plans_role", """
        CREATE SCHEMA plans;
        GRANT USAGE ON SCHEMA plans TO eb_small_plans_role;
        CREATE TABLE plans.sink (id text PRIMARY KEY);
        GRANT INSERT ON plans.sink TO eb_small_plans_role;
        CREATE FUNCTION plans.on_msg(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $f$
        BEGIN
            IF (msg.payload->>'n')::int % 17 = 0 THEN
                PERFORM (msg.payload->>'pad')::int;     -- 22P02: dead at once
            END IF;
            IF (msg.payload->>'n')::int % 13 = 0 THEN
                RAISE EXCEPTION 'not yet';              -- retried
            END IF;
            INSERT INTO plans.sink VALUES (msg.message_id);
        END $f$;
        SELECT eventbox.create_subscription('small', ARRAY['small'], ordering => 'key',
                                            on_dead => 'block_key',
                                            dead_letter_topic => 'small.dlt');
        SELECT eventbox.register_handler('small', 'plans.on_msg(eventbox.inbox)'::regprocedure,
                                         event_type => 'E', run_as => 'eb_small_plans_role');
        ALTER TABLE eventbox.inbox SET (autovacuum_enabled = off);
    """)
    c = db.connect()
    yield c
    c.close()
    db.drop()


def add_rows(c, first, n):
    """n received messages with offsets first.. in PARTITIONS lanes and 500 keys, every 11th
    of an event type no handler takes (ignored)."""
    query(c, """
        INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset",
                                    key, headers, payload, event_type, status)
        SELECT 'small', 'm' || lpad(g::text, 9, '0'), 'small', g %% %s, g / %s,
               convert_to('k' || (g %% 500), 'UTF8'), '{}',
               jsonb_build_object('n', g, 'pad', repeat('x', 160)),
               CASE WHEN g %% 11 = 0 THEN 'U' ELSE 'E' END, 'received'
          FROM generate_series(%s, %s) g
    """, (PARTITIONS, PARTITIONS, first, first + n - 1))


def leave_claims(c, first):
    """What passes that crashed while running each lane's messages from offset `first` on
    leave: their claims, the messages with the attempts they had then."""
    query(c, """
        INSERT INTO eventbox.handler_claims (subscription, topic, "partition", message_ids,
                                             attempts)
        SELECT 'small', 'small', "partition", array_agg(message_id ORDER BY "offset"),
               array_agg(attempts ORDER BY "offset")
          FROM eventbox.inbox
         WHERE subscription = 'small' AND "offset" >= %s AND "offset" < %s + 4
           AND status = 'received'
         GROUP BY "partition"
        ON CONFLICT (subscription, topic, "partition") DO UPDATE
           SET message_ids = EXCLUDED.message_ids, attempts = EXCLUDED.attempts
    """, (first, first))


def run_passes(c, state, passes):
    """`passes` explained passes; returns {outcome: worst buffers} and the worst node."""
    seen = {}
    worst = (0, None, None)
    total = 0
    for _ in range(passes):
        handled, plans = explained_process(c, "small", BATCH)
        total += handled
        for text, _ in plans:
            for name, needle in OUTCOMES.items():
                if needle in text:
                    seen.setdefault(name, 0)
        for text, node, index, buffers in plan_scans(plans, ("inbox", "key_blocks")):
            for name, needle in OUTCOMES.items():
                if needle in text:
                    seen[name] = max(seen[name], buffers)
            if buffers > worst[0]:
                worst = (buffers, "%s%s" % (node, " using " + index if index else ""), text)
    assert total >= 1, "%s: process() handled nothing" % state
    missing = sorted(set(OUTCOMES) - set(seen))
    assert not missing, "%s: no %s statement ran in %d passes" % (state, missing, passes)
    assert worst[0] <= MAX_BUFFERS_PER_NODE, "%s: a %s touched %d buffers: %s" % (
        state, worst[1], worst[0], " ".join(worst[2].split())[:400])
    return seen, worst[0]


def test_outcome_statements_planned_on_a_small_inbox_stay_bounded(small_db):
    c = small_db
    # Light traffic: a few dozen rows, analyzed; the session's first passes make the plans.
    add_rows(c, 0, SMALL)
    leave_claims(c, 0)
    query(c, "ANALYZE eventbox.inbox")
    small, _ = run_passes(c, "small inbox", 3)
    assert query_one(c, "SELECT reltuples FROM pg_class WHERE oid = 'eventbox.inbox'::regclass") \
        <= SMALL
    # An outage's backlog arrives; the kept plans meet it (no ANALYZE, no invalidation).
    add_rows(c, SMALL, BACKLOG)
    leave_claims(c, SMALL)
    large, worst = run_passes(c, "backlog after plans made small", 3)
    dead = query_one(c, "SELECT count(*) FROM eventbox.inbox WHERE status = 'dead'")
    ignored = query_one(c, "SELECT count(*) FROM eventbox.inbox WHERE status = 'ignored'")
    letters = query_one(c, "SELECT count(*) FROM eventbox.outbox WHERE topic = 'small.dlt'")
    print("outcome statements' worst inbox/key_blocks node buffers, small inbox %s, backlog of "
          "%d %s; worst %d; dead %d, ignored %d, dead letters %d" % (
              small, BACKLOG, large, worst, dead, ignored, letters))
    assert dead > 0 and ignored > 0 and letters > 0
