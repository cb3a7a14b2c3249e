"""Section ops, part metrics: relay and ingest throughput with GET /metrics scraped every second
against not scraped (see ops.py)."""

import re
import threading
import time
import urllib.request

from lib.cluster import q1
from lib.common import BenchError, log
from lib.eventbox import (create_disabled_subscription, ingest_counters, relay_info, set_enabled,
                          vacuum_outbox, wait_offsets)
from lib.kafka import check_topic, produce
from lib.messages import Messages
from lib.proc import CpuMeter
from lib.table import ROW, ok

from sections.ops_common import RUN, partitions_for, postgres_us, supervisor_pids


class Scraper(threading.Thread):
    """GET /metrics once a second until stopped; counts scrapes, bytes, the slowest answer."""

    def __init__(self, address):
        super().__init__(daemon=True)
        self.url = "http://%s/metrics" % address
        self.stop_flag = threading.Event()
        self.scrapes = self.errors = self.bytes = 0
        self.slowest = 0.0
        self.counts = []  # eventbox_metrics_pending_counts_total as each scrape saw it

    def run(self):
        while True:
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    body = r.read()
                    if r.status != 200 or b"eventbox_relay_published_total" not in body:
                        self.errors += 1
                    self.bytes += len(body)
                    m = re.search(rb"^eventbox_metrics_pending_counts_total (\S+)$", body, re.M)
                    if m:
                        self.counts.append(float(m.group(1)))
                    self.scrapes += 1
            except OSError:
                self.errors += 1
            took = time.monotonic() - t0
            self.slowest = max(self.slowest, took)
            if self.stop_flag.wait(max(0.0, 1.0 - took)):
                return


def scraped(address, scrape, fn):
    """fn() with a scraper running (scrape) or not; returns (fn's result, scraper stats)."""
    s = Scraper(address) if scrape else None
    if s:
        s.start()
    try:
        out = fn()
    finally:
        if s:
            s.stop_flag.set()
            s.join()
    stats = {"scrapes": s.scrapes, "errors": s.errors, "bytes": s.bytes,
             "slowest_s": s.slowest,
             "counts": s.counts[-1] - s.counts[0] if len(s.counts) > 1 else 0} if s else None
    return out, stats


def relay_run(env, cur, topic, n, partitions, pg_groups):
    """n rows sent by ONE transaction to a fresh topic, relay running; clock from its COMMIT to
    the relay's acknowledged counter grown by n; then the topic must hold n records."""
    env.broker.create_topic(topic, partitions)
    vacuum_outbox(cur)
    cur.execute("CHECKPOINT")
    base = relay_info(cur)[2]
    cur.execute("BEGIN")
    cur.execute("SELECT count(eventbox.send(%s, jsonb_build_object('id', g, 'pad', "
                "repeat('x', 150)), key => 'customer-' || (g %% 1000)::text)) "
                "FROM generate_series(1, %s) g", (topic, n))
    meter = CpuMeter(pg_groups)
    meter.start()
    t0 = time.monotonic()
    cur.execute("COMMIT")
    deadline = t0 + max(300, n / 200)
    while True:
        time.sleep(0.02)
        done = relay_info(cur)[2] - base
        if done >= n:
            break
        if time.monotonic() > deadline:
            raise BenchError("relay: %d of %d acknowledged after %.0fs; relay: %r"
                             % (done, n, deadline - t0, relay_info(cur)))
    elapsed = time.monotonic() - t0
    cpu = meter.stop()
    check_topic(env, topic, partitions, n)
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "cpu": cpu}


def ingest_run(env, cur, topic, sub, n, pg_groups):
    """A disabled subscription (no handler, unhandled keep) on the pre-produced topic, emptied
    inbox; clock from enabling it to its stored offsets adding up to n."""
    cur.execute("TRUNCATE eventbox.inbox")
    create_disabled_subscription(cur, sub, topic)
    cur.execute("CHECKPOINT")
    base = ingest_counters(cur)[0]
    meter = CpuMeter(pg_groups)
    meter.start()
    t0 = time.monotonic()
    set_enabled(cur, sub, True)
    elapsed, first, _ = wait_offsets(cur, sub, n, t0, base, timeout=max(300, n / 200))
    cpu = meter.stop()
    set_enabled(cur, sub, False)
    stored = q1(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s", (sub,))
    if stored != n:
        raise BenchError("ingest %s: %d rows stored, expected %d" % (sub, stored, n))
    cur.execute("TRUNCATE eventbox.inbox")
    cur.execute("SELECT eventbox.drop_subscription(%s)", (sub,))
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "first_s": first, "cpu": cpu}


def section_metrics(env, cur, args, pg_groups, out):
    n, address = args.ops_messages, out["address"]
    pg_groups = dict(pg_groups, supervisor=lambda: supervisor_pids(cur))
    parts = partitions_for(n)
    out["metrics"] = m = {"n": n, "partitions": parts, "relay": {False: [], True: []},
                          "ingest": {False: [], True: []}, "scrapers": []}
    relay = args.ops_part != "metrics_ingest"
    if relay:
        log("ops: warm-up: relay, %d messages (not counted)" % (n // 10))
        relay_run(env, cur, "ops_relay_warmup_" + RUN, n // 10, parts, pg_groups)
    for k in range(args.ops_repeat if relay else 0):
        # Alternate which side goes first, so that a drift of the box favours neither.
        for scrape in ((False, True) if k % 2 == 0 else (True, False)):
            topic = "ops_relay_%d_%s_%s" % (k, "scraped" if scrape else "plain", RUN)
            x, st = scraped(address, scrape,
                            lambda: relay_run(env, cur, topic, n, parts, pg_groups))
            m["relay"][scrape].append(x)
            if st:
                m["scrapers"].append(st)
            log("ops: relay, scraped=%s: %.0f msg/s%s"
                % (scrape, x["rate"], " (%d scrapes)" % st["scrapes"] if st else ""))
    log("ops: producing %d messages to ops_ingest_%s (%d partitions)" % (n, RUN, parts))
    msgs = Messages(n, 200, seed=0x0b5)
    m["avg_payload"] = msgs.avg_payload
    produce(env, "ops_ingest_" + RUN, parts, msgs.records(parts))
    del msgs
    log("ops: warm-up: ingest (not counted)")
    ingest_run(env, cur, "ops_ingest_" + RUN, "ops_ingest_warmup", n, pg_groups)
    for k in range(args.ops_repeat):
        for scrape in ((False, True) if k % 2 == 0 else (True, False)):
            sub = "ops_ingest_%d_%s" % (k, "scraped" if scrape else "plain")
            x, st = scraped(address, scrape,
                            lambda: ingest_run(env, cur, "ops_ingest_" + RUN, sub, n, pg_groups))
            m["ingest"][scrape].append(x)
            if st:
                m["scrapers"].append(st)
            log("ops: ingest, scraped=%s: %.0f msg/s%s"
                % (scrape, x["rate"], " (%d scrapes)" % st["scrapes"] if st else ""))


def metrics_rows(m):
    rows = []
    for what in [w for w in ("relay", "ingest") if m[w][False]]:
        b = max(x["rate"] for x in m[what][False])
        w = max(x["rate"] for x in m[what][True])
        rows.append(ROW % ("%s, /metrics every 1 s (msg/s)" % what, "%.0f" % w,
                           "not scraped %.0f" % b, "%.3f" % (w / b),
                           ">= 0.98 " + ok(w / b >= 0.98)))
        cb, cw = postgres_us(m[what][False]), postgres_us(m[what][True])
        rows.append(ROW % ("  postgres CPU/msg, all runs (us)", "%.2f" % cw,
                           "not scraped %.2f" % cb, "%.3f" % (cw / cb), "info (less load-bound)"))
    return rows


def metrics_notes(o, m):
    out = []
    out.append("ops metrics: %d messages per run, topics of %d partitions, %d runs per side "
               "(interleaved, alternating which goes first), best kept. relay: one transaction "
               "sends the rows (relay running), clock from its COMMIT to the relay's counter "
               "grown by N, then the topic's watermarks checked; ingest: produced beforehand, "
               "subscription enabled on an emptied inbox, clock to its offsets adding up to N. "
               "Scraper: GET http://%s/metrics every 1 s from a thread of the bench"
               % (m["n"], m["partitions"], len(m["ingest"][False]), o["address"]))
    for what in [w for w in ("relay", "ingest") if m[w][False]]:
        out.append("ops %s runs (msg/s): not scraped %s; scraped %s" % (
            what, " ".join("%.0f" % x["rate"] for x in m[what][False]),
            " ".join("%.0f" % x["rate"] for x in m[what][True])))
    for what in [w for w in ("relay", "ingest") if m[w][False]]:
        out.append("ops %s: supervisor CPU (serves /metrics) per run, ms: not scraped %s; "
                   "scraped %s" % (what, " ".join(
                       "%.0f" % (1000 * x["cpu"].get("supervisor_s", 0)) for x in m[what][False]),
                       " ".join("%.0f" % (1000 * x["cpu"].get("supervisor_s", 0))
                                for x in m[what][True])))
    sc = m["scrapers"]
    out.append("ops: exact counts of the pending rows the endpoint ran between the first and the "
               "last scrape of each scraped run: %s" % " ".join("%d" % s["counts"] for s in sc))
    out.append("ops scrapes: %d answered, %d failed, ~%.0f bytes each, slowest %.0f ms"
               % (sum(s["scrapes"] for s in sc), sum(s["errors"] for s in sc),
                  sum(s["bytes"] for s in sc) / max(1, sum(s["scrapes"] for s in sc)),
                  1000 * max(s["slowest_s"] for s in sc)))
    busy = [100.0 * x["cpu"]["box_s"] / max(x["cpu"]["box_total_s"], 1e-9)
            for w in ("relay", "ingest") for s in (False, True) for x in m[w][s]]
    out.append("ops: the whole box was %.0f-%.0f%% busy during these runs (other users' "
               "processes included)" % (min(busy), max(busy)))
    return out
