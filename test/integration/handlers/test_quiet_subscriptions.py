"""Idle subscriptions beside a busy one (handlers/quiet.hpp; bench/NOTEBOOK.md, 2026-11-25: idle
subscriptions beside a busy one): a handler worker's loop runs a pass over every enabled
subscription, and a pass costs a transaction and a few statements even when it finds nothing. A
subscription whose last pass found nothing is passed over until rows are stored for it, something
makes rows wait again, subscriptions or handlers change, or its recheck time (a second later with
up to 100 quiet ones a worker) came. Before, each of 100 idle subscriptions had a pass at every
loop of each worker, which cost the busy one's messages ~25% more handler-worker CPU. The idle ones
still handle what arrives for them."""

import time
import uuid

from eventbox_fixtures import query, wait_until
from eventbox_handler_lib import Msg, produce, retry_conn
from test_low_water import LEDGER_DDL, ledger, orders

IDLE = 100


def handlers_scans(c):
    """Scans of eventbox.handlers so far: each pass reads its subscription's handlers once."""
    return query(c, "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_all_tables"
                    " WHERE relid = 'eventbox.handlers'::regclass")[0][0]


def test_idle_subscriptions_are_passed_over_until_they_get_work(case, new_topic):
    busy = case(1)
    busy.setup(LEDGER_DDL)
    idle_topic = new_topic(1)
    idle = ["q_idle_%s_%03d" % (uuid.uuid4().hex[:6], i) for i in range(IDLE)]

    def create(c):
        for name in idle:
            query(c, "BEGIN; SELECT eventbox.create_subscription(%s, ARRAY[%s]); "
                     "SELECT eventbox.register_handler(%s, %s::regprocedure, run_as => %s); "
                     "COMMIT", (name, idle_topic, name, busy.q("{s}.handle(eventbox.inbox)"),
                                busy.q("{role}")))
    retry_conn(create)
    try:
        # One message each, handled: every idle subscription's lane known and drained.
        produce(idle_topic, [Msg(str(uuid.uuid4()), 0, "k", {"seq": 1}, "Order")])
        wait_until(lambda: retry_conn(lambda c: len(ledger(busy)) == IDLE or None), 120, 0.2,
                   "the idle subscriptions' first message handled")
        time.sleep(2.5)
        n = 10000  # >= 10 passes of at most 1,024 messages
        before = retry_conn(handlers_scans)
        started = time.monotonic()
        produce(busy.topic, orders(0, n))
        wait_until(lambda: retry_conn(lambda c: len(ledger(busy)) == n + IDLE or None), 180, 0.2,
                   "the busy subscription's %d messages handled" % n)
        time.sleep(1.5)  # the workers' statistics flushed
        scans = retry_conn(handlers_scans) - before
        per_second = scans / (time.monotonic() - started)
        print("scans of eventbox.handlers: %d, %.0f/s" % (scans, per_second))
        # A pass over each idle subscription at each loop of each worker: 2,400/s here (6,161 in
        # ~2.5 s with passes of 256; a loop is a busy pass of at most 1,024 messages plus 100
        # idle ones, the idle ones most of its time). Passed
        # over: once a second per worker and idle subscription (200/s with 2 workers), again
        # after each move of the inbox generation, plus the busy one's passes.
        assert per_second < 1000, (
            "%d scans of eventbox.handlers (%.0f/s) while %d messages were handled"
            % (scans, per_second, n))
        # What is stored for an idle subscription is handled.
        produce(idle_topic, [Msg(str(uuid.uuid4()), 0, "k", {"seq": 7}, "Order")])
        wait_until(lambda: retry_conn(lambda c: query(
            c, "SELECT count(*) FROM eventbox.inbox WHERE subscription = ANY (%s) "
               "AND status = 'processed'", (idle,))[0][0] == 2 * IDLE or None),
            60, 0.1, "the message handled for each idle subscription")
        assert len(ledger(busy)) == n + 2 * IDLE
    finally:
        def drop(c):
            query(c, "SELECT count(eventbox.drop_subscription(name)) FROM eventbox.subscriptions "
                     "WHERE name = ANY (%s)", (idle,))
        retry_conn(drop)
