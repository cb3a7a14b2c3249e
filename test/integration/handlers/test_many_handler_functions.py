"""Hundreds of handler functions: how a worker calls each one is kept once per function, however
many there are.

Before, the table of calls had room for 256 functions; past it, every call built its FmgrInfo
(and, for a SQL function, its compiled body) again in memory that was freed only at the next
pg_proc change: a worker serving 300 functions grew by megabytes per few thousand messages, for
as long as it ran. Here 300 LANGUAGE sql handlers (one per event type) each run 10 times per
round (in both partitions); after two rounds the most memory a handler worker holds
(pg_log_backend_memory_contexts, "Grand total") must not grow over the next one. (A worker holds
the most once it has called every function; it may take a worker more rounds to meet them all.)"""

import re

from eventbox_fixtures import LogWatcher, connect, query
from eventbox_handler_lib import Msg, handler_pids, produce, wait_settled

FUNCTIONS = 300
CALLS_PER_ROUND = 10
# Per round, the old code leaked (FUNCTIONS - 256) * CALLS_PER_ROUND SQL-function caches of a few
# KiB each (2-3 MiB); a worker that keeps one per function allocates nothing more once warm.
MAX_GROWTH_BYTES = 512 * 1024

GRAND_TOTAL = re.compile(r"\[(\d+)\] eventbox handler LOG:\s+Grand total: (\d+) bytes")


def handler_memory():
    """{pid: Grand total bytes} of every handler worker, from the server log."""
    c = connect()
    try:
        pids = handler_pids(c)
        log = LogWatcher()
        for pid in pids:
            query(c, "SELECT pg_log_backend_memory_contexts(%s)", (pid,))
        lines = log.wait_for(r"eventbox handler LOG:\s+Grand total:", timeout=30,
                             count=len(pids))
    finally:
        c.close()
    totals = {}
    for ln in lines:
        m = GRAND_TOTAL.search(ln)
        if m:
            totals[int(m.group(1))] = int(m.group(2))
    return totals


def test_a_worker_keeps_one_call_per_handler_function(case):
    hc = case(partitions=2)
    functions = "\n".join(
        "CREATE FUNCTION {s}.h_%d(m eventbox.inbox) RETURNS void LANGUAGE sql AS "
        "$$ INSERT INTO {s}.ledger VALUES (%d, m.message_id) $$;" % (i, i)
        for i in range(FUNCTIONS))
    hc.setup("CREATE TABLE {s}.ledger (fn int NOT NULL, message_id text NOT NULL);\n"
             + functions, handler="{s}.h_0(eventbox.inbox)", event_type="T0", register=False)
    c = connect(autocommit=False)
    try:
        with c.cursor() as cur:
            for i in range(FUNCTIONS):
                cur.execute("SELECT eventbox.register_handler(%s, %s::regprocedure, "
                            "event_type => %s, run_as => %s)",
                            (hc.sub, hc.q("{s}.h_%d(eventbox.inbox)" % i), "T%d" % i,
                             hc.q("{role}")))
        c.commit()
    finally:
        c.close()

    per_round = FUNCTIONS * CALLS_PER_ROUND
    totals = []
    for r in range(3):
        produce(hc.topic, [Msg("r%d-%d" % (r, i), i % 2, "k%d" % i, {"n": i},
                               "T%d" % (i // 2 % FUNCTIONS)) for i in range(per_round)])
        wait_settled(hc.sub, per_round * (r + 1), timeout=300)
        totals.append(handler_memory())

    c = connect()
    try:
        ran = query(c, hc.q("SELECT count(*), count(DISTINCT fn) FROM {s}.ledger"))[0]
    finally:
        c.close()
    assert ran == (3 * per_round, FUNCTIONS), ran
    warm, last = totals[1], totals[2]
    print("handler workers' memory after rounds 2 and 3: %r -> %r" % (warm, last))
    assert max(last.values()) - max(warm.values()) <= MAX_GROWTH_BYTES, (
        "the handler workers' memory grew from %r to %r bytes over %d more calls of the same %d "
        "functions" % (warm, last, per_round, FUNCTIONS))
