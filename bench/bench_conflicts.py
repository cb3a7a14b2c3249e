#!/usr/bin/python3
"""Ingest cost of conflict detection (issue 17): this build against a baseline build (e.g. main),
side by side in one invocation, on two clusters of their own (each with its own dev broker)
holding the same records.

Per run and side, on a fresh subscription (unhandled => 'keep', no handler):
  fresh      N records (200 B JSON, headers message_id and event_type, 16 partitions) from its
             enabling to eventbox.offsets summing to N: no record is a duplicate.
  duplicates the same N records republished to a second topic (same message ids, other
             transport identity), added with alter_subscription(topics => ...): every record is
             a duplicate, so this build compares every one with its stored row (the worst case
             of conflict detection); clock to the offsets summing to 2N.
Runs alternate sides; the best of BENCH_REPEAT runs is kept; ratios are this build / baseline.
Also the ingest worker's CPU time per record (utime + stime from /proc, less sensitive than the
rate to other load on the machine), lowest of the runs; its ratio is baseline / this build, so
that above 1 means cheaper here too.

Usage: bench/bench_conflicts.py BASELINE_PGBIN CANDIDATE_PGBIN
Knobs: BENCH_CONFLICT_MESSAGES (default 200000), BENCH_REPEAT (default 3),
       BENCH_PORT (baseline; the candidate uses the next port; default 54351).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

from lib.cluster import Env, q1
from lib.common import REPO, BenchError, log
from lib.eventbox import create_disabled_subscription, offsets_sum, set_enabled
from lib.kafka import produce
from lib.proc import TICKS, proc_cpu

PARTITIONS = 16
N = int(os.environ.get("BENCH_CONFLICT_MESSAGES", "200000"))
REPEAT = int(os.environ.get("BENCH_REPEAT", "3"))
PORT = int(os.environ.get("BENCH_PORT", "54351"))
CLUSTER_SH = os.path.join(REPO, "tools", "cluster.sh")


class Side:
    """One build: a cluster of its own with its dev broker (tools/cluster.sh), the extension
    created, the two topics filled."""

    def __init__(self, label, pgbin, port):
        self.label = label
        self.dir = tempfile.mkdtemp(prefix="eventbox-bench-conflicts-%s." % label)
        os.chmod(self.dir, 0o755)
        subprocess.run([CLUSTER_SH, "start", self.dir, "--port", str(port),
                        "--conf", "eventbox.handler_workers=0"],
                       check=True, env=dict(os.environ, EVENTBOX_PGBIN=pgbin, EVENTBOX_NO_RABBITMQ="1"),
                       stdout=subprocess.DEVNULL)
        self.env = Env(self.dir)
        self.conn = self.env.connect()
        self.cur = self.conn.cursor()
        self.cur.execute("CREATE EXTENSION pg_eventbox")

    def ingest_cpu_s(self):
        pid = q1(self.cur, "SELECT pid FROM pg_stat_activity "
                           "WHERE backend_type = 'eventbox ingest'")
        return proc_cpu(pid) / TICKS

    def wait_offsets(self, sub, n, t0, timeout=600):
        while True:
            if offsets_sum(self.cur, sub) >= n:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise BenchError("%s: offsets of %s did not reach %d" % (self.label, sub, n))
            time.sleep(0.02)

    def stop(self):
        try:
            self.conn.close()
        finally:
            subprocess.run([CLUSTER_SH, "stop", self.dir], stdout=subprocess.DEVNULL)


def produce_records(side, topic, records):
    produce(side.env, topic, PARTITIONS,
            ((payload, mid, part, [("event_type", b"BenchEvent"), ("message_id", mid)])
             for mid, part, payload in records))


def run(side, r):
    sub = "conflicts_%d" % r
    cur = side.cur
    create_disabled_subscription(cur, sub, "bench-1")
    cpu0 = side.ingest_cpu_s()
    t0 = time.monotonic()
    set_enabled(cur, sub, True)
    fresh = side.wait_offsets(sub, N, t0)
    cpu1 = side.ingest_cpu_s()
    t0 = time.monotonic()
    cur.execute("SELECT eventbox.alter_subscription(%s, topics => ARRAY['bench-1', 'bench-2'])",
                (sub,))
    dups = side.wait_offsets(sub, 2 * N, t0)
    cpu2 = side.ingest_cpu_s()
    rows = q1(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s", (sub,))
    if rows != N:
        raise BenchError("%s: %d inbox rows, expected %d" % (side.label, rows, N))
    cur.execute("SELECT eventbox.drop_subscription(%s)", (sub,))
    cur.execute("VACUUM eventbox.inbox")
    return N / fresh, N / dups, (cpu1 - cpu0) / N * 1e6, (cpu2 - cpu1) / N * 1e6


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    records = []
    for i in range(N):
        mid = ("bench-%08d" % i).encode()
        payload = json.dumps({"id": i, "customer": "c%05d" % (i % 9973), "total": i * 0.25,
                              "pad": "x" * 120}, separators=(",", ":")).encode()
        records.append((mid, i % PARTITIONS, payload))
    sides = []
    try:
        for label, pgbin, port in (("baseline", sys.argv[1], PORT),
                                   ("candidate", sys.argv[2], PORT + 1)):
            log("starting %s (%s)" % (label, pgbin))
            side = Side(label, pgbin, port)
            sides.append(side)
            produce_records(side, "bench-1", records)
            produce_records(side, "bench-2", records)
        inf = float("inf")
        best = {s.label: [0.0, 0.0, inf, inf] for s in sides}
        for r in range(REPEAT):
            for side in (sides if r % 2 == 0 else sides[::-1]):
                fresh, dups, cpu_fresh, cpu_dups = run(side, r)
                log("run %d %-9s fresh %8.0f msg/s %5.1f us cpu   all duplicates %8.0f msg/s "
                    "%5.1f us cpu" % (r + 1, side.label, fresh, cpu_fresh, dups, cpu_dups))
                b = best[side.label]
                best[side.label] = [max(b[0], fresh), max(b[1], dups), min(b[2], cpu_fresh),
                                    min(b[3], cpu_dups)]
        b, c = best["baseline"], best["candidate"]
        print()
        print("ingest, %d records of ~200 B, best of %d runs" % (N, REPEAT))
        print("%-36s %12s %12s %8s" % ("figure", "baseline", "this build", "ratio"))
        print("%-36s %12.0f %12.0f %7.2fx" % ("fresh (msg/s)", b[0], c[0], c[0] / b[0]))
        print("%-36s %12.0f %12.0f %7.2fx" % ("all duplicates (msg/s)", b[1], c[1], c[1] / b[1]))
        print("%-36s %12.1f %12.1f %7.2fx" % ("fresh, ingest CPU (us/record)", b[2], c[2],
                                               b[2] / c[2]))
        print("%-36s %12.1f %12.1f %7.2fx" % ("all duplicates, ingest CPU (us/record)", b[3],
                                               c[3], b[3] / c[3]))
    finally:
        for s in sides:
            s.stop()


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        print("bench: FAILED: %s" % e, file=sys.stderr)
        sys.exit(1)
