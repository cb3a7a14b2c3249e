"""Section topics: N subscriptions on N topics of their own (BENCH_TOPICS_SIZES, default 1, 100,
1,000 and 5,000) beside one live subscription. For each N: how long until the live topic's first
record is stored after the subscriptions were created, then the delay of records produced every
2 s, the ingest worker's fds, memory and CPU while idle, the handler workers' CPU while idle,
and how long the ingest worker takes to exit on SIGTERM (what a fast shutdown sends it).
Baseline: the same run with the first size. The subscriptions of a size are dropped before the
next one."""

import os
import signal
import time
import uuid

from confluent_kafka import Producer

from lib.cluster import q1
from lib.common import BenchError, log
from lib.eventbox import worker_pids
from lib.proc import TICKS, proc_cpu, proc_status
from lib.table import ROW

LIVE_RECORDS = 12    # records produced to the live topic after the first, 2 s apart: the
#                     topics are refreshed every 10 s, and a refresh must fall among them
IDLE_SECONDS = 10    # the window over which idle CPU is measured


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError("topics: timed out after %d s waiting for %s" % (timeout, what))
        time.sleep(0.05)


def stored_within(cur, producer, live, key, timeout=600):
    """Produces one record to `live` and returns the seconds until its inbox row exists."""
    t0 = time.monotonic()
    producer.produce(live, b'{"n": 1}', key=key.encode(), headers=[("message_id", key)])
    producer.flush(30)
    wait_for(lambda: q1(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s "
                             "AND message_id = %s", (live, key)), timeout,
             "record %s of %s" % (key, live))
    return time.monotonic() - t0


def cpu_while_idle(pids):
    """CPU of `pids` over IDLE_SECONDS, in percent of one core."""
    before = [proc_cpu(p) or 0 for p in pids]
    time.sleep(IDLE_SECONDS)
    after = [proc_cpu(p) or 0 for p in pids]
    return 100.0 * (sum(after) - sum(before)) / TICKS / IDLE_SECONDS


def exit_on_sigterm(cur, pid):
    """Seconds the ingest worker takes to exit on SIGTERM; waits for its replacement."""
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not os.path.exists("/proc/%d" % pid), 120, "ingest worker %d to exit" % pid)
    took = time.monotonic() - t0
    wait_for(lambda: [p for p in worker_pids(cur, "ingest") if p != pid], 120,
             "a new ingest worker")
    return took


def measure(ctx, producer, n, run_id):
    env, cur = ctx.env, ctx.conn.cursor()
    names = ["tp%s_%d_%05d" % (run_id, n, i) for i in range(n)]
    live = "tp%s_%d_live" % (run_id, n)
    t0 = time.monotonic()
    for name in names + [live]:
        env.broker.create_topic(name, 1)
    log("topics %d: %d topics created in %.1f s" % (n, n + 1, time.monotonic() - t0))
    cur.execute("SELECT count(eventbox.create_subscription(t, ARRAY[t])) "
                "FROM unnest(%s::text[]) AS t", (names + [live],))
    first = stored_within(cur, producer, live, "%s-first" % live)
    later = []
    for i in range(LIVE_RECORDS):
        time.sleep(2)
        later.append(stored_within(cur, producer, live, "%s-%d" % (live, i)))
    ingest = worker_pids(cur, "ingest")
    if len(ingest) != 1:
        raise BenchError("topics: expected one ingest worker, found %s" % ingest)
    pid = ingest[0]
    fds = len(os.listdir("/proc/%d/fd" % pid))
    status = proc_status(pid) or {}
    idle_cpu = cpu_while_idle([pid])
    handler_cpu = cpu_while_idle(worker_pids(cur, "handler"))
    exit_s = exit_on_sigterm(cur, pid)
    cur.execute("SELECT count(eventbox.drop_subscription(t)) FROM unnest(%s::text[]) AS t",
                (names + [live],))
    res = {"n": n, "first_s": first, "later_s": later, "fds": fds,
           "rss_kb": status.get("VmRSS"), "anon_kb": status.get("RssAnon"),
           "idle_cpu_pct": idle_cpu, "handler_idle_cpu_pct": handler_cpu, "exit_s": exit_s}
    log("topics %d: %s" % (n, res))
    return res


def run(ctx):
    producer = Producer({"bootstrap.servers": ctx.env.bootstrap, "linger.ms": 0})
    run_id = uuid.uuid4().hex[:4]
    ctx.res["topics"] = [measure(ctx, producer, n, run_id) for n in ctx.args.topics_sizes]


def table_rows(res):
    runs = res.get("topics")
    if not runs:
        return []
    base = runs[0]
    rows = []
    for r in runs:
        slowest = max([r["first_s"]] + r["later_s"])
        rows.append(ROW % ("topics %d: record stored after" % r["n"],
                           "%.2f s (first %.2f)" % (max(r["later_s"]), r["first_s"]),
                           "%.2f s (%d topic%s)" % (max(base["later_s"]), base["n"],
                                                    "" if base["n"] == 1 else "s"),
                           "%.2f" % (slowest / max(max([base["first_s"]] + base["later_s"]),
                                                   0.01)),
                           "info"))
        rows.append(ROW % ("  ingest fds / idle CPU",
                           "%d / %.1f%%" % (r["fds"], r["idle_cpu_pct"]),
                           "%d / %.1f%%" % (base["fds"], base["idle_cpu_pct"]),
                           "%.2f" % (r["fds"] / max(base["fds"], 1)),
                           "fds independent of N"))
        rows.append(ROW % ("  exit on SIGTERM", "%.2f s" % r["exit_s"],
                           "%.2f s" % base["exit_s"], "-", "< 1 s"))
    return rows


def notes(res, args):
    runs = res.get("topics")
    if not runs:
        return []
    out = ["topics: N subscriptions on N one-partition topics plus one live subscription, "
           "created in one statement; 'first' = the live topic's first record, produced right "
           "after, until its inbox row exists; then %d records 2 s apart (the row shows the "
           "slowest). Idle figures over %d s after them; SIGTERM is what a fast shutdown sends "
           "each worker." % (LIVE_RECORDS, IDLE_SECONDS)]
    for r in runs:
        out.append("topics %d: first %.2f s, later %s s, fds %d, RSS %s kB (anon %s kB), idle "
                   "CPU ingest %.1f%% handlers %.1f%%, exit %.2f s"
                   % (r["n"], r["first_s"], ", ".join("%.2f" % x for x in r["later_s"]),
                      r["fds"], r["rss_kb"], r["anon_kb"], r["idle_cpu_pct"],
                      r["handler_idle_cpu_pct"], r["exit_s"]))
    return out
