#!/usr/bin/python3
"""The per-server ceiling (docs/guide/scaling.md): what one message costs one PostgreSQL server,
in WAL and in CPU time per worker role, on a cluster of its own (tools/cluster.sh, its own dev
broker; one ingest and one handler worker).

  outbox  N send() calls, 100 per transaction (one session), then the relay publishes them:
          WAL of the whole cycle (pg_current_wal_lsn() before and after, every process), CPU of
          the sending backend and of the relay.
  inbox   N records (~200 B JSON, 8 partitions) consumed by a subscription whose handler does
          one INSERT: WAL of ingest + handling, CPU of the ingest and the handler worker, from
          enabling it to N messages processed.

CPU is utime + stime from /proc (all threads, librdkafka's included). The figures are costs,
not rates: the rate a server reaches is about its cores divided by the CPU per message of the
busiest role, as long as its disk takes the WAL.

Usage: EVENTBOX_PGBIN=... bench/bench_ceiling.py
Knobs: BENCH_CEILING_MESSAGES (default 50000), BENCH_PORT (default 54353).
"""
import json
import os
import subprocess
import tempfile
import time

from lib.cluster import Env, q1
from lib.common import REPO, BenchError, log
from lib.eventbox import create_disabled_subscription, set_enabled, setup_handler_objects
from lib.kafka import produce
from lib.proc import TICKS, proc_cpu

N = int(os.environ.get("BENCH_CEILING_MESSAGES", "50000"))
PORT = int(os.environ.get("BENCH_PORT", "54353"))
PARTITIONS = 8
CLUSTER_SH = os.path.join(REPO, "tools", "cluster.sh")


def pid_of(cur, backend_type):
    return q1(cur, "SELECT pid FROM pg_stat_activity WHERE backend_type = %s", (backend_type,))


def cpu_s(pid):
    return proc_cpu(pid) / TICKS


def lsn(cur):
    return int(q1(cur, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


def wait_for(cur, sql, args, n, what, timeout=600):
    deadline = time.monotonic() + timeout
    while q1(cur, sql, args) < n:
        if time.monotonic() > deadline:
            raise BenchError("%s: not %d after %ds" % (what, n, timeout))
        time.sleep(0.05)


def published(cur):
    return int(q1(cur, "SELECT coalesce(sum(value), 0) FROM eventbox.metrics "
                       "WHERE name = 'eventbox_relay_published_total'"))


def outbox(cur):
    relay = pid_of(cur, "eventbox relay")
    base = published(cur)
    cur.execute("CHECKPOINT")
    w0, c0, r0, t0 = lsn(cur), cpu_s(q1(cur, "SELECT pg_backend_pid()")), cpu_s(relay), \
        time.monotonic()
    for _ in range(N // 100):
        cur.execute("SELECT count(eventbox.send('ceiling-out', jsonb_build_object('i', g, "
                    "'pad', repeat('x', 150)))) FROM generate_series(1, 100) g")
    c1 = cpu_s(q1(cur, "SELECT pg_backend_pid()"))
    deadline = time.monotonic() + 600
    while published(cur) - base < N:
        if time.monotonic() > deadline:
            raise BenchError("relay: %d of %d published" % (published(cur) - base, N))
        time.sleep(0.05)
    took = time.monotonic() - t0
    return {"wal_b": (lsn(cur) - w0) / N, "send_us": (c1 - c0) / N * 1e6,
            "relay_us": (cpu_s(relay) - r0) / N * 1e6, "rate": N / took}


def inbox(env, cur):
    records = ((json.dumps({"id": i, "customer": "c%05d" % (i % 9973), "pad": "x" * 150},
                           separators=(",", ":")).encode(), ("m%08d" % i).encode(),
                i % PARTITIONS, [("event_type", b"BenchEvent"), ("message_id",
                                                                  ("m%08d" % i).encode())])
               for i in range(N))
    produce(env, "ceiling-in", PARTITIONS, records)
    create_disabled_subscription(cur, "ceiling", "ceiling-in", unhandled=None,
                                 handler="public.bench_on_msg(eventbox.inbox)")
    ingest, handler = pid_of(cur, "eventbox ingest"), pid_of(cur, "eventbox handler")
    cur.execute("CHECKPOINT")
    w0, i0, h0, t0 = lsn(cur), cpu_s(ingest), cpu_s(handler), time.monotonic()
    set_enabled(cur, "ceiling", True)
    wait_for(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s "
                  "AND status = 'processed'", ("ceiling",), N, "inbox processed")
    took = time.monotonic() - t0
    return {"wal_b": (lsn(cur) - w0) / N, "ingest_us": (cpu_s(ingest) - i0) / N * 1e6,
            "handler_us": (cpu_s(handler) - h0) / N * 1e6, "rate": N / took}


def main():
    d = tempfile.mkdtemp(prefix="eventbox-bench-ceiling.")
    os.chmod(d, 0o755)
    subprocess.run([CLUSTER_SH, "start", d, "--port", str(PORT),
                    "--conf", "eventbox.handler_workers=1"], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        env = Env(d)
        conn = env.connect()
        cur = conn.cursor()
        cur.execute("CREATE EXTENSION pg_eventbox")
        setup_handler_objects(cur)
        deadline = time.monotonic() + 60
        while not all(pid_of(cur, t) for t in ("eventbox relay", "eventbox ingest",
                                               "eventbox handler")):
            if time.monotonic() > deadline:
                raise BenchError("the workers did not start")
            time.sleep(0.1)
        log("outbox: %d messages" % N)
        o = outbox(cur)
        log("inbox: %d records" % N)
        i = inbox(env, cur)
        print()
        print("per message, %d messages of ~200 B, %d CPUs" % (N, os.cpu_count()))
        print("%-44s %10s" % ("figure", "value"))
        print("%-44s %10.0f" % ("outbox: WAL (bytes), send + relay", o["wal_b"]))
        print("%-44s %10.1f" % ("outbox: sending backend CPU (us)", o["send_us"]))
        print("%-44s %10.1f" % ("outbox: relay CPU (us)", o["relay_us"]))
        print("%-44s %10.0f" % ("outbox: msg/s, send to published", o["rate"]))
        print("%-44s %10.0f" % ("inbox: WAL (bytes), ingest + handler", i["wal_b"]))
        print("%-44s %10.1f" % ("inbox: ingest worker CPU (us)", i["ingest_us"]))
        print("%-44s %10.1f" % ("inbox: handler worker CPU (us)", i["handler_us"]))
        print("%-44s %10.0f" % ("inbox: msg/s, enabled to processed", i["rate"]))
    finally:
        subprocess.run([CLUSTER_SH, "stop", d], stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
