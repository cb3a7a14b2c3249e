"""Section ops: running pg_eventbox for months. Every figure is a ratio against a baseline
measured in the same invocation; nothing is asserted on time.

  metrics  relay and ingest throughput with GET /metrics scraped every second vs not scraped,
           interleaved runs, best of BENCH_OPS_REPEAT each (target >= 0.98x);
  purge    ingest + handlers at full rate (BENCH_OPS_PURGE_MESSAGES produced beforehand) while
           BENCH_OPS_PURGE_ROWS aged processed rows are purged, vs the same run without a purge
           (target >= 0.9x); lock waits over 100 ms logged meanwhile (log_lock_waits,
           deadlock_timeout = 100ms; target 0 lines);
  cycles   BENCH_OPS_CYCLES cycles of ingest BENCH_OPS_CYCLE_ROWS -> process -> age past
           retention -> purge -> autovacuum; inbox heap + index size after the last cycle vs after
           the first (target <= 1.5x).

The dev broker keeps at most ~5 MiB or 100k message sets per partition and drops the oldest
beyond that (an earlier version of this bench produced 100000 records of ~300 B on the wire
through the relay into an auto-created topic of 4 partitions: the broker dropped the first ~10k
of two partitions and the ingest never reached 100000). Topics here are created with enough
partitions for their size, and every produce is checked: low watermarks 0, high watermarks
adding up to the count."""

import os
import re
import threading
import time
import urllib.request

from lib.cluster import q1
from lib.common import BenchError, log
from lib.eventbox import (create_disabled_subscription, ingest_counters, relay_info, set_conf,
                          set_enabled, setup_handler_objects, wait_offsets, worker_pids)
from lib.kafka import check_topic, produce
from lib.messages import DISTINCT_KEYS, Messages
from lib.proc import CpuMeter
from lib.table import ROW, mib, ok, per_msg_us

HANDLER = "public.bench_on_msg(eventbox.inbox)"
# Bytes on the wire per record are ~330 at 200 B payloads (key, headers message_id and
# event_type, batch overhead): a partition holds 5 MiB / 330 B ~ 15k of them. Keep each under
# 10k.
PER_PARTITION = 10000
AGED_SUB = "ops_aged"
HANDLED = "SELECT coalesce(sum(messages), 0)::int8 FROM eventbox.workers WHERE role = 'handler'"

# Appended to topic names: a cluster kept from an earlier run (BENCH_KEEP) has the old ones.
RUN = "%x" % int(time.time())


def stat(cur, column):
    """A column of pg_stat_user_tables for eventbox.inbox, as the statistics system has it now."""
    cur.execute("SELECT pg_stat_clear_snapshot()")
    return q1(cur, "SELECT %s FROM pg_stat_user_tables WHERE relid = 'eventbox.inbox'::regclass"
              % column)


def deleted_mark(cur):
    """n_tup_del of eventbox.inbox after this session's own counts were flushed. During a run
    nothing but the retention purge deletes inbox rows, so its progress is the growth of
    n_tup_del (the supervisor flushes it at most once a second). Polling the purge counter of
    eventbox.metrics instead would run the gauge queries (a count of every pending row) each
    time, in the middle of the figure."""
    cur.execute("SELECT pg_stat_force_next_flush()")
    cur.execute("SELECT 1")
    return stat(cur, "n_tup_del")


def supervisor_pids(cur):
    """The supervisor's pid, as a list (empty while none runs): it serves /metrics."""
    return [r for r in [q1(cur, "SELECT pid FROM pg_stat_activity "
                                "WHERE backend_type = 'eventbox supervisor'")] if r]


def partitions_for(n):
    return max(8, -(-n // PER_PARTITION))


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
    cur.execute("VACUUM eventbox.outbox")
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


def lock_wait_lines(path, start, pids):
    """The server log's lock-wait reports (log_lock_waits: "process N still waiting for ...")
    written after byte `start`, as (lines of the processes `pids`, lines of any other)."""
    with open(path, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    mine, other = [], []
    for line in text.splitlines():
        m = re.search(r"process (\d+) still waiting for", line)
        if m:
            (mine if int(m.group(1)) in pids else other).append(line)
    return mine, other


def handled_run(env, cur, topic, sub, n, pg_groups, watch=None, before_clock=None):
    """Kafka -> inbox -> trivial INSERT handler: a disabled subscription with the handler on the
    pre-produced topic; clock from enabling it until the handler workers' counter grew by n.
    before_clock() is called just before the clock starts, watch(elapsed) about every 0.5 s
    while it runs. The result has the ingest and handler workers' lock waits logged while the
    clock ran ("lock_waits") and the other processes' ("other_waits")."""
    logfile = os.path.join(env.dir, "postgres.log")
    cur.execute("TRUNCATE public.bench_sink")
    create_disabled_subscription(cur, sub, topic, handler=HANDLER)
    cur.execute("CHECKPOINT")
    time.sleep(0.3)
    if before_clock:
        before_clock()
    pids = set(worker_pids(cur, "ingest", "handler"))
    mark = os.path.getsize(logfile)
    base = int(q1(cur, HANDLED))
    meter = CpuMeter(pg_groups)
    meter.start()
    t0 = time.monotonic()
    set_enabled(cur, sub, True)
    deadline = t0 + max(300, n / 100)
    next_watch = t0
    while True:
        time.sleep(0.02)
        now = time.monotonic()
        if int(q1(cur, HANDLED)) - base >= n:
            break
        if watch and now >= next_watch:
            watch(now - t0)
            next_watch = now + 0.5
        if now > deadline:
            raise BenchError("%s: %d of %d handled after %.0fs"
                             % (sub, int(q1(cur, HANDLED)) - base, n, now - t0))
    elapsed = time.monotonic() - t0
    cpu = meter.stop()
    waits, other = lock_wait_lines(logfile, mark, pids | set(worker_pids(cur, "ingest", "handler")))
    set_enabled(cur, sub, False)
    cur.execute("SELECT status, count(*) FROM eventbox.inbox WHERE subscription = %s "
                "GROUP BY status", (sub,))
    statuses = dict(cur.fetchall())
    sunk = q1(cur, "SELECT count(*) FROM public.bench_sink")
    if statuses != {"processed": n} or sunk != n:
        raise BenchError("%s: statuses %r, bench_sink %d rows, expected %d processed"
                         % (sub, statuses, sunk, n))
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "cpu": cpu, "lock_waits": waits,
            "other_waits": other, "log_mark": mark, "pids": pids}


def insert_aged(cur, rows):
    """`rows` processed inbox rows of the disabled subscription AGED_SUB, processed 30 days ago
    (1 ms apart), shaped like the messages (~200 B payload, headers, key), inserted directly."""
    t0 = time.monotonic()
    cur.execute(
        "INSERT INTO eventbox.inbox (subscription, message_id, topic, \"partition\", \"offset\", "
        "key, headers, payload, event_type, status, attempts, received_at, processed_at) "
        "SELECT %s, format('aged-%%s', g), 'ops_aged_none', g %% 32, g / 32, "
        "convert_to('customer-' || (g %% 1000)::text, 'UTF8'), "
        "jsonb_build_object('event_type', 'OrderCreated', 'message_id', format('aged-%%s', g)), "
        "jsonb_build_object('id', g, 'pad', repeat('x', 110), 'sku', 'SKU-00001', "
        "'type', 'OrderCreated', 'amount', g, 'currency', 'EUR', "
        "'customer', 'customer-' || (g %% 1000)::text), 'OrderCreated', 'processed', 1, "
        "now() - interval '30 days', now() - interval '30 days' + g * interval '1 ms' "
        "FROM generate_series(1, %s) g", (AGED_SUB, rows))
    took = time.monotonic() - t0
    cur.execute("VACUUM eventbox.inbox")
    cur.execute("CHECKPOINT")
    return took


def purge_run(env, cur, topic, sub, n, rows, groups):
    """One ingest + handlers run while the `rows` aged rows present are purged (retention set to
    1 day: they are 30 days old); the clock starts once the supervisor's first batch is counted.
    Afterwards waits until the purge is through."""
    seen = {}

    def start_purge():
        seen["mark"] = deleted_mark(cur)
        set_conf(cur, "eventbox.inbox_retention", "1d")
        deadline = time.monotonic() + 30
        while stat(cur, "n_tup_del") == seen["mark"]:
            if time.monotonic() > deadline:
                raise BenchError("the retention purge did not start within 30 s")
            time.sleep(0.02)
        seen["at_start"] = stat(cur, "n_tup_del") - seen["mark"]

    def watch(elapsed):
        if "done_s" not in seen and stat(cur, "n_tup_del") - seen["mark"] >= rows:
            seen["done_s"] = elapsed

    x = handled_run(env, cur, topic, sub, n, groups, watch=watch, before_clock=start_purge)
    at_end = stat(cur, "n_tup_del") - seen["mark"]
    x["purged_before"], x["purged_in_run"] = seen["at_start"], at_end - seen["at_start"]
    x["purge_done_s"] = seen.get("done_s")
    t0 = time.monotonic()
    while stat(cur, "n_tup_del") - seen["mark"] < rows:
        if time.monotonic() - t0 > 600:
            raise BenchError("the purge of %d aged rows did not finish" % rows)
        time.sleep(0.2)
    x["purge_total_s"] = x["purge_done_s"] or x["elapsed"] + (time.monotonic() - t0)
    x["lock_waits_after"] = lock_wait_lines(os.path.join(env.dir, "postgres.log"),
                                            x["log_mark"], x["pids"])[0]
    set_conf(cur, "eventbox.inbox_retention", "0")
    left = q1(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s", (AGED_SUB,))
    if left != 0:
        raise BenchError("%d aged rows left after the purge" % left)
    return x


def section_purge(env, cur, args, pg_groups, out):
    n, rows = args.ops_purge_messages, args.ops_purge_rows
    parts = partitions_for(n)
    topic = "ops_purge_" + RUN
    out["purge"] = p = {"n": n, "rows": rows, "partitions": parts, "runs": []}

    groups = dict(pg_groups, supervisor=lambda: supervisor_pids(cur))
    set_conf(cur, "eventbox.inbox_retention", "0")
    log("ops: producing %d messages to %s (%d partitions)" % (n, topic, parts))
    msgs = Messages(n, 200, seed=0x9e)
    produce(env, topic, parts, msgs.records(parts))
    del msgs
    create_disabled_subscription(cur, AGED_SUB, "ops_aged_none_" + RUN)
    k = 0
    for pair in range(args.ops_purge_repeat):
        # Pairs alternate which run goes first. Every run starts from the same table: the aged
        # rows present (inserted again after a purge), the previous run's rows dropped and
        # VACUUMed away.
        for purge in ((False, True) if pair % 2 == 0 else (True, False)):
            k += 1
            if not q1(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s",
                      (AGED_SUB,)):
                log("ops: inserting %d aged processed rows" % rows)
                p["insert_s"] = insert_aged(cur, rows)
                p["inbox_mib"] = mib(q1(cur, "SELECT pg_total_relation_size('eventbox.inbox')"))
            sub = "ops_h_%d" % k
            if purge:
                log("ops: ingest + handlers, %d messages, while %d aged rows are purged"
                    % (n, rows))
                x = purge_run(env, cur, topic, sub, n, rows, groups)
                log("ops:   %.0f msg/s in %.1fs; purged %d rows before the clock, %d during the "
                    "run%s; lock waits logged: %d" % (
                        x["rate"], x["elapsed"], x["purged_before"], x["purged_in_run"],
                        ", purge finished at %.1fs" % x["purge_done_s"]
                        if x["purge_done_s"] is not None else "", len(x["lock_waits"])))
            else:
                log("ops: ingest + handlers, %d messages, no purge" % n)
                x = handled_run(env, cur, topic, sub, n, groups)
                log("ops:   %.0f msg/s in %.1fs" % (x["rate"], x["elapsed"]))
            x["purge"] = purge
            p["runs"].append(x)
            cur.execute("SELECT eventbox.drop_subscription(%s)", (sub,))
            cur.execute("VACUUM eventbox.inbox")
            cur.execute("CHECKPOINT")
    cur.execute("SELECT eventbox.drop_subscription(%s)", (AGED_SUB,))


def sizes(cur):
    cur.execute("SELECT pg_relation_size('eventbox.inbox'), pg_table_size('eventbox.inbox'), "
                "pg_indexes_size('eventbox.inbox')")
    heap, table, indexes = cur.fetchone()
    return {"heap": heap, "table": table, "indexes": indexes, "total": table + indexes}


def section_cycles(env, cur, args, pg_groups, out):
    n, cycles = args.ops_cycle_rows, args.ops_cycles
    parts = partitions_for(n)
    out["cycles"] = c = {"n": n, "cycles": cycles, "partitions": parts, "runs": []}
    # A fresh inbox: what the earlier figures left must not pad the first cycle's size.
    cur.execute("TRUNCATE eventbox.inbox")
    # Retention on but longer than a cycle (the supervisor keeps its purge rounds, and flushes
    # its statistics, once a second); set to 1 s to age a cycle's rows past it.
    set_conf(cur, "eventbox.inbox_retention", "1d")
    # Autovacuum is what gives the purged space back; look for work every second, not minute.
    set_conf(cur, "autovacuum_naptime", "1s")
    log("ops: producing %d messages to ops_cycle_%s (%d partitions)" % (n, RUN, parts))
    msgs = Messages(n, 200, seed=0xc1)
    produce(env, "ops_cycle_" + RUN, parts, msgs.records(parts))
    del msgs
    try:
        for k in range(1, cycles + 1):
            sub = "ops_cycle_%d" % k
            run = handled_run(env, cur, "ops_cycle_" + RUN, sub, n, pg_groups)
            peak = sizes(cur)
            # Age past retention: retention 1 s, once the newest row is older than that.
            time.sleep(1.2)
            deleted0 = deleted_mark(cur)
            av0 = stat(cur, "autovacuum_count")
            t0 = time.monotonic()
            set_conf(cur, "eventbox.inbox_retention", "1s")
            while stat(cur, "n_tup_del") - deleted0 < n:
                if time.monotonic() - t0 > 600:
                    raise BenchError("cycle %d: the purge's deletes did not reach the "
                                     "statistics within 600 s" % k)
                time.sleep(0.1)
            purge_s = time.monotonic() - t0
            set_conf(cur, "eventbox.inbox_retention", "1d")
            left = q1(cur, "SELECT count(*) FROM eventbox.inbox")
            if left != 0:
                raise BenchError("cycle %d: %d rows left after the purge" % (k, left))
            # An autovacuum pass since the purge began that left fewer dead rows than trigger
            # the next one (autovacuum_vacuum_threshold, 50, on the emptied table): with every
            # delete in the statistics by now, that is the last one a user gets. (Requiring 0
            # waited forever when a pass ran while the purge's last deletes were in flight and
            # left those few as recently dead: n_dead_tup 18 in one run.)
            t0 = time.monotonic()
            while True:
                count, dead = stat(cur, "autovacuum_count"), stat(cur, "n_dead_tup")
                if count > av0 and dead < 50:
                    break
                if time.monotonic() - t0 > 300:
                    raise BenchError("cycle %d: no autovacuum of eventbox.inbox within 300 s "
                                     "(n_dead_tup %d)" % (k, dead))
                time.sleep(0.5)
            vacuum_s = time.monotonic() - t0
            after = sizes(cur)
            cur.execute("SELECT eventbox.drop_subscription(%s)", (sub,))
            c["runs"].append({"rate": run["rate"], "peak": peak, "after": after,
                              "purge_s": purge_s, "vacuum_s": vacuum_s})
            log("ops: cycle %d: %.0f msg/s; inbox heap+indexes %.1f MiB processed, %.1f MiB after "
                "purge (%.1fs) and autovacuum (%.1fs)"
                % (k, run["rate"], mib(peak["total"]), mib(after["total"]), purge_s,
                   vacuum_s))
    finally:
        set_conf(cur, "autovacuum_naptime", None)
        set_conf(cur, "eventbox.inbox_retention", None)


def run(ctx):
    env, cur, args, pg_groups, res = ctx.env, ctx.cur, ctx.args, ctx.pg_groups, ctx.res
    address = q1(cur, "SHOW eventbox.metrics_address")
    if not address:
        raise BenchError("section ops needs eventbox.metrics_address (bench/run.sh sets it)")
    for name, want in (("log_lock_waits", "on"), ("deadlock_timeout", "100ms")):
        if q1(cur, "SHOW %s" % name) != want:
            raise BenchError("section ops needs %s = %s (bench/run.sh sets it)" % (name, want))
    setup_handler_objects(cur)
    cur.execute("TRUNCATE eventbox.inbox")
    out = res["ops"] = {"address": address,
                        "handler_workers": int(q1(cur, "SHOW eventbox.handler_workers"))}
    part = args.ops_part
    for name, fn in (("metrics", section_metrics), ("purge", section_purge),
                     ("cycles", section_cycles)):
        if part == "all" or part.split("_")[0] == name:
            t0 = time.monotonic()
            fn(env, cur, args, pg_groups, out)
            out[name + "_s"] = time.monotonic() - t0


def postgres_us(runs):
    """CPU of all PostgreSQL processes (workers, supervisor, the bench's session, autovacuum)
    per message over `runs`, in microseconds: what the other users of the box move least."""
    return per_msg_us(runs, "postgres_s")


def table_rows(res):
    o = res.get("ops")
    if not o:
        return []
    rows = []
    m = o.get("metrics", {"relay": {False: []}, "ingest": {False: []}})
    for what in [w for w in ("relay", "ingest") if m[w][False]]:
        b = max(x["rate"] for x in m[what][False])
        w = max(x["rate"] for x in m[what][True])
        rows.append(ROW % ("%s, /metrics every 1 s (msg/s)" % what, "%.0f" % w,
                           "not scraped %.0f" % b, "%.3f" % (w / b),
                           ">= 0.98 " + ok(w / b >= 0.98)))
        cb, cw = postgres_us(m[what][False]), postgres_us(m[what][True])
        rows.append(ROW % ("  postgres CPU/msg, all runs (us)", "%.2f" % cw,
                           "not scraped %.2f" % cb, "%.3f" % (cw / cb), "info (less load-bound)"))
    if "purge" in o:
        rows.extend(purge_rows(o["purge"]))
    if "cycles" in o:
        rows.extend(cycles_rows(o["cycles"]))
    return rows


def purge_rows(p):
    rows = []
    base = max(x["rate"] for x in p["runs"] if not x["purge"])
    purging = max(x["rate"] for x in p["runs"] if x["purge"])
    r = purging / base
    rows.append(ROW % ("ingest+handlers, purging (msg/s)", "%.0f" % purging,
                       "no purge %.0f" % base, "%.3f" % r, ">= 0.9 " + ok(r >= 0.9)))
    cb = postgres_us([x for x in p["runs"] if not x["purge"]])
    cw = postgres_us([x for x in p["runs"] if x["purge"]])
    rows.append(ROW % ("  postgres CPU/msg, all runs (us)", "%.2f" % cw, "no purge %.2f" % cb,
                       "%.3f" % (cw / cb), "info (incl. the purge)"))
    waits = sum(len(x["lock_waits"]) for x in p["runs"] if x["purge"])
    rows.append(ROW % ("  ingest/handler lock waits > 100 ms", "%d" % waits,
                       "no purge %d" % sum(len(x["lock_waits"]) for x in p["runs"]
                                           if not x["purge"]), "-",
                       "0 " + ok(waits == 0, bad="ABOVE")))
    rows.append(ROW % ("  aged rows purged during the runs", "/".join(
        "%d" % x["purged_in_run"] for x in p["runs"] if x["purge"]), "of %d" % p["rows"], "-",
        "info"))
    return rows


def cycles_rows(c):
    rows = []
    first, last = c["runs"][0], c["runs"][-1]
    r = last["after"]["total"] / first["after"]["total"]
    rows.append(ROW % ("inbox heap+idx after cycle %d (MiB)" % len(c["runs"]),
                       "%.1f" % mib(last["after"]["total"]),
                       "cycle 1 %.1f" % mib(first["after"]["total"]), "%.2f" % r,
                       "<= 1.5 " + ok(r <= 1.5, bad="ABOVE")))
    r = last["peak"]["total"] / first["peak"]["total"]
    rows.append(ROW % ("  same, processed, before purge",
                       "%.1f" % mib(last["peak"]["total"]),
                       "cycle 1 %.1f" % mib(first["peak"]["total"]), "%.2f" % r,
                       "<= 1.5 " + ok(r <= 1.5, bad="ABOVE")))
    return rows


def notes(res, args):
    o = res.get("ops")
    if not o:
        return []
    parts = [k for k in ("metrics", "purge", "cycles") if k in o]
    out = ["ops: %.0f s in all (%s); payloads ~%.0f B JSON, %d keys; "
           "eventbox.handler_workers = %d"
           % (sum(o[k + "_s"] for k in parts),
              ", ".join("%s %.0f s" % (k, o[k + "_s"]) for k in parts),
              o.get("metrics", {}).get("avg_payload", 200), DISTINCT_KEYS,
              o["handler_workers"])]
    if "metrics" in o:
        out.extend(metrics_notes(o, o["metrics"]))
    if "purge" in o:
        out.extend(purge_notes(o["purge"]))
    if "cycles" in o:
        out.extend(cycles_notes(o["cycles"]))
    return out


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


def purge_notes(p):
    out = []
    out.append("ops purge: %d messages produced beforehand (%d partitions), trivial INSERT "
               "handler (bench_on_msg, run_as bench_handler); clock from enabling the "
               "subscription to the handler workers' counter grown by N (ingest and handlers "
               "running together). %d aged rows inserted directly as 'processed' with "
               "processed_at 30 days ago (INSERT ... SELECT, %.1f s; inbox %.0f MiB then), "
               "VACUUMed. Without: eventbox.inbox_retention = 0. With: retention set to 1d and "
               "the clock started once the purge's first deletes reached the statistics "
               "(n_tup_del: flushed by the supervisor at most once a second; the purge's "
               "progress is read there, not from eventbox.metrics, whose gauge queries would "
               "count every pending row on each poll). %d pairs, "
               "alternating which goes first; after each run its rows dropped and VACUUMed, "
               "the aged rows inserted again after a purge; best run per side kept"
               % (p["n"], p["partitions"], p["rows"], p["insert_s"], p["inbox_mib"],
                  len(p["runs"]) // 2))
    for x in p["runs"]:
        line = "ops purge run %s: %.0f msg/s, %.1f s, box %.0f%% busy, postgres CPU %.1f s" % (
            "with" if x["purge"] else "without", x["rate"], x["elapsed"],
            100.0 * x["cpu"]["box_s"] / max(x["cpu"]["box_total_s"], 1e-9),
            x["cpu"]["postgres_s"])
        if x["purge"]:
            line += ("; purged %d rows before the clock, %d during the run (%s); whole purge "
                     "%.1f s; supervisor CPU in the run %.1f s"
                     % (x["purged_before"], x["purged_in_run"],
                        "finished %.1f s into it" % x["purge_done_s"]
                        if x["purge_done_s"] is not None else "still running at its end",
                        x["purge_total_s"], x["cpu"].get("supervisor_s", 0)))
        line += "; lock waits > 100 ms logged: ingest/handler workers %d%s, others %d%s" % (
            len(x["lock_waits"]),
            (" (" + x["lock_waits"][0][:300] + ")") if x["lock_waits"] else "",
            len(x["other_waits"]), (" (" + x["other_waits"][0][:300] + ")")
            if x["other_waits"] else "")
        if x["purge"] and len(x["lock_waits_after"]) > len(x["lock_waits"]):
            line += " (%d more until the purge ended)" % (len(x["lock_waits_after"]) -
                                                          len(x["lock_waits"]))
        out.append(line)
    return out


def cycles_notes(c):
    out = []
    out.append("ops cycles: %d cycles of %d messages (one topic of %d partitions, a new "
               "subscription with the handler per cycle, dropped once empty), inbox TRUNCATEd "
               "first; aged by setting eventbox.inbox_retention = 1s once processed, back to 1d "
               "(nothing that old) when purged; autovacuum_naptime = 1s during the cycles; "
               "size measured after "
               "the first autovacuum that leaves n_dead_tup = 0"
               % (c["cycles"], c["n"], c["partitions"]))
    for k, r in enumerate(c["runs"], 1):
        out.append("ops cycle %d: %.0f msg/s; processed: heap %.1f + indexes %.1f MiB (table "
                   "with fsm/vm/toast %.1f); after purge (%.1f s) + autovacuum (%.1f s): heap "
                   "%.1f + indexes %.1f MiB (table %.1f)"
                   % (k, r["rate"], mib(r["peak"]["heap"]), mib(r["peak"]["indexes"]),
                      mib(r["peak"]["table"]), r["purge_s"], r["vacuum_s"],
                      mib(r["after"]["heap"]), mib(r["after"]["indexes"]),
                      mib(r["after"]["table"])))
    return out
