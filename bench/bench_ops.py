#!/usr/bin/python3
"""bench/bench_ops.py — figures of running for months: metrics and retention (DESIGN.md section 7).

Starts its own cluster (tools/cluster.sh, PostgreSQL port 54541, metrics on 127.0.0.1:54542,
log_lock_waits with deadlock_timeout = 100ms, autovacuum_naptime = 1s) and prints:

  1. relay and ingest throughput with GET /metrics scraped every second vs not (target >= 0.98x);
  2. ingest + handlers at full rate while PURGE_ROWS aged processed rows are purged, vs the same
     without purging (target >= 0.9x), and the lock waits > 100 ms logged meanwhile;
  3. bounded size: CYCLES cycles of ingest CYCLE_ROWS -> process -> age past retention -> purge
     (and autovacuum); inbox heap + index size after the last vs after the first (<= 1.5x).

Sizes are knobs (environment): BENCH_OPS_MESSAGES (default 20000: the ingest topic, 4 partitions
of ~200 B records, must fit the dev broker's ~5 MiB per partition), BENCH_OPS_REPEAT (2),
BENCH_OPS_PURGE_ROWS (1000000), BENCH_OPS_CYCLES (5), BENCH_OPS_CYCLE_ROWS (200000),
EVENTBOX_PGBIN. Every figure is a ratio of runs in the same invocation.
"""

import os
import pathlib
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import psycopg2

REPO = pathlib.Path(__file__).resolve().parents[1]
N = int(os.environ.get("BENCH_OPS_MESSAGES", 20000))
REPEAT = int(os.environ.get("BENCH_OPS_REPEAT", 2))
PURGE_ROWS = int(os.environ.get("BENCH_OPS_PURGE_ROWS", 1000000))
CYCLES = int(os.environ.get("BENCH_OPS_CYCLES", 5))
CYCLE_ROWS = int(os.environ.get("BENCH_OPS_CYCLE_ROWS", 200000))
PORT, METRICS = 54541, 54542


def log(msg):
    print("bench_ops: %s" % msg, file=sys.stderr, flush=True)


class Scraper(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.stop_flag = threading.Event()
        self.scrapes = 0

    def run(self):
        while not self.stop_flag.wait(1.0):
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % METRICS, timeout=5) as r:
                r.read()
            self.scrapes += 1


def wait(cur, sql, want, timeout=600):
    deadline = time.monotonic() + timeout
    while True:
        cur.execute(sql)
        v = cur.fetchone()[0]
        if v == want:
            return
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for %s = %r (at %r)" % (sql, want, v))
        time.sleep(0.05)


def with_scraping(scrape, fn):
    s = Scraper() if scrape else None
    if s:
        s.start()
    try:
        return fn()
    finally:
        if s:
            s.stop_flag.set()
            s.join()


def relay_run(cur, topic):
    cur.execute("BEGIN")
    cur.execute("SELECT count(eventbox.send(%s, jsonb_build_object('i', g, 'pad', repeat('x', 150))))"
                " FROM generate_series(1, %s) g", (topic, N))
    t0 = time.monotonic()
    cur.execute("COMMIT")
    wait(cur, "SELECT count(*) FROM eventbox.outbox WHERE status = 'pending'", 0)
    return N / (time.monotonic() - t0)


def ingest_run(cur, topic, tag):
    sub = "ing_%s" % tag
    t0 = time.monotonic()
    cur.execute("SELECT eventbox.create_subscription(%s, ARRAY[%s])", (sub, topic))
    wait(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = '%s'" % sub, N)
    rate = N / (time.monotonic() - t0)
    cur.execute("SELECT eventbox.drop_subscription(%s)", (sub,))
    return rate


def handled_run(cur, topic, tag):
    """Kafka -> inbox -> trivial handler, N messages; messages/s until all processed."""
    sub = "h_%s" % tag
    t0 = time.monotonic()
    cur.execute("BEGIN")
    cur.execute("SELECT eventbox.create_subscription(%s, ARRAY[%s])", (sub, topic))
    cur.execute("SELECT eventbox.register_handler(%s, 'public.h(eventbox.inbox)'::regprocedure, "
                "run_as => 'bench_h')", (sub,))
    cur.execute("COMMIT")
    wait(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = '%s' AND status = "
              "'processed'" % sub, N, timeout=1200)
    return N / (time.monotonic() - t0), sub


def main():
    d = tempfile.mkdtemp(prefix="eb-bench-ops.", dir="/tmp")
    os.rmdir(d)
    env = dict(os.environ)
    subprocess.run([str(REPO / "tools/cluster.sh"), "start", d, "--port", str(PORT),
                    "--conf", "eventbox.metrics_address = '127.0.0.1:%d'" % METRICS,
                    "--conf", "log_lock_waits = on", "--conf", "deadlock_timeout = '100ms'",
                    "--conf", "autovacuum_naptime = '1s'", "--conf", "shared_buffers = '512MB'",
                    "--conf", "eventbox.inbox_retention = '1h'"],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    try:
        c = psycopg2.connect(host=d, port=PORT, dbname="eventbox_test", user="postgres")
        c.autocommit = True
        cur = c.cursor()
        cur.execute("CREATE EXTENSION pg_eventbox")
        cur.execute("CREATE ROLE bench_h; CREATE TABLE public.sink(i int); "
                    "GRANT INSERT ON public.sink TO bench_h; "
                    "CREATE FUNCTION public.h(m eventbox.inbox) RETURNS void LANGUAGE sql AS "
                    "$$ INSERT INTO public.sink VALUES ((m.payload->>'i')::int) $$")
        time.sleep(3)
        res = {}
        # 1. relay and ingest, scraped vs not (alternating, best of REPEAT each).
        for k in range(REPEAT):
            for scrape in (False, True):
                r = with_scraping(scrape, lambda: relay_run(cur, "relay_%d_%d" % (k, scrape)))
                res.setdefault(("relay", scrape), []).append(r)
                log("relay scrape=%s: %.0f msg/s" % (scrape, r))
        relay_run(cur, "ingest_src")  # the topic ingest reads, N records
        for k in range(REPEAT):
            for scrape in (False, True):
                r = with_scraping(scrape, lambda: ingest_run(cur, "ingest_src", "%d_%d" % (k, scrape)))
                res.setdefault(("ingest", scrape), []).append(r)
                log("ingest scrape=%s: %.0f msg/s" % (scrape, r))
        # 2. ingest + handlers while PURGE_ROWS aged rows are purged, vs without.
        cur.execute("ALTER SYSTEM SET eventbox.inbox_retention = 0")
        cur.execute("SELECT pg_reload_conf()")
        time.sleep(1)
        cur.execute("SELECT eventbox.create_subscription('aged', ARRAY['nothing_here'])")
        cur.execute("SELECT eventbox.alter_subscription('aged', enabled => false)")
        cur.execute("INSERT INTO eventbox.inbox (subscription, message_id, topic, \"partition\", "
                    "\"offset\", status, processed_at, payload) SELECT 'aged', g::text, 'x', 0, g, "
                    "'processed', now() - interval '2 hours', '{\"pad\": \"xxxxxxxxxxxxxxxxxxxx\"}' "
                    "FROM generate_series(1, %s) g", (PURGE_ROWS,))
        base, sub = handled_run(cur, "ingest_src", "nopurge")
        log("ingest+handlers without purge: %.0f msg/s" % base)
        cur.execute("SELECT eventbox.drop_subscription(%s)", (sub,))
        logfile = os.path.join(d, "postgres.log")
        mark = os.path.getsize(logfile)
        cur.execute("ALTER SYSTEM SET eventbox.inbox_retention = '1h'")
        cur.execute("SELECT pg_reload_conf()")
        time.sleep(0.5)
        cur.execute("SELECT count(*) FROM eventbox.inbox WHERE subscription = 'aged'")
        before = cur.fetchone()[0]
        with_purge, sub = handled_run(cur, "ingest_src", "purge")
        cur.execute("SELECT count(*) FROM eventbox.inbox WHERE subscription = 'aged'")
        after = cur.fetchone()[0]
        with open(logfile, "rb") as f:
            f.seek(mark)
            waits = len(re.findall(rb"still waiting for", f.read()))
        log("ingest+handlers with purge: %.0f msg/s (aged rows %d -> %d, lock waits > 100 ms: %d)"
            % (with_purge, before, after, waits))
        res["purge"] = (base, with_purge, before - after, waits)
        wait(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = 'aged'", 0, timeout=1200)
        # 3. bounded size over cycles.
        cur.execute("ALTER SYSTEM SET eventbox.inbox_retention = '1h'")
        cur.execute("SELECT pg_reload_conf()")
        sizes = []
        for k in range(CYCLES):
            cur.execute("BEGIN")
            cur.execute("SELECT count(eventbox.send('cyc_%d', jsonb_build_object('i', g))) "
                        "FROM generate_series(1, %s) g" % (k, CYCLE_ROWS))
            cur.execute("COMMIT")
            wait(cur, "SELECT count(*) FROM eventbox.outbox WHERE status = 'pending'", 0)
            cur.execute("BEGIN")
            cur.execute("SELECT eventbox.create_subscription('cyc_%d', ARRAY['cyc_%d'])" % (k, k))
            cur.execute("SELECT eventbox.register_handler('cyc_%d', 'public.h(eventbox.inbox)'"
                        "::regprocedure, run_as => 'bench_h')" % k)
            cur.execute("COMMIT")
            wait(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = 'cyc_%d' AND "
                      "status = 'processed'" % k, CYCLE_ROWS, timeout=1200)
            cur.execute("UPDATE eventbox.inbox SET processed_at = now() - interval '2 hours' "
                        "WHERE subscription = 'cyc_%d'" % k)
            wait(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = 'cyc_%d'" % k, 0,
                 timeout=1200)
            # Autovacuum reclaims what the purge deleted (naptime 1 s): wait for its pass.
            cur.execute("SELECT autovacuum_count FROM pg_stat_user_tables "
                        "WHERE relid = 'eventbox.inbox'::regclass")
            av = cur.fetchone()[0]
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                cur.execute("SELECT autovacuum_count FROM pg_stat_user_tables "
                            "WHERE relid = 'eventbox.inbox'::regclass")
                if cur.fetchone()[0] > av:
                    break
                time.sleep(0.5)
            cur.execute("SELECT pg_total_relation_size('eventbox.inbox')")
            sizes.append(cur.fetchone()[0])
            log("cycle %d: inbox heap+indexes %.1f MiB" % (k + 1, sizes[-1] / 1048576))
        res["sizes"] = sizes
        best = lambda key: max(res[key])  # noqa: E731
        print("| figure | baseline | with | ratio | target |")
        print("| --- | --- | --- | --- | --- |")
        for what in ("relay", "ingest"):
            b, w = best((what, False)), best((what, True))
            print("| %s msg/s, /metrics scraped every 1 s (%d msgs, best of %d) | %.0f | %.0f | %.2fx | >= 0.98x |"
                  % (what, N, REPEAT, b, w, w / b, ))
        b, w, purged, waits = res["purge"]
        print("| ingest+handlers msg/s while purging (%d aged rows; %d purged during the run) | %.0f | %.0f | %.2fx | >= 0.9x |"
              % (PURGE_ROWS, purged, b, w, w / b))
        print("| lock waits > 100 ms during that run | | %d | | 0 |" % waits)
        print("| inbox heap+index size after cycle %d vs 1 (%d rows per cycle) | %.1f MiB | %.1f MiB | %.2fx | <= 1.5x |"
              % (CYCLES, CYCLE_ROWS, sizes[0] / 1048576, sizes[-1] / 1048576, sizes[-1] / sizes[0]))
    finally:
        subprocess.run([str(REPO / "tools/cluster.sh"), "stop", d], env=env,
                       stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
