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
import pathlib
import subprocess
import sys
import tempfile
import time

import psycopg2
from confluent_kafka import Producer

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "test" / "lib"))
from devbroker import DevBroker  # noqa: E402

PARTITIONS = 16
N = int(os.environ.get("BENCH_CONFLICT_MESSAGES", "200000"))
REPEAT = int(os.environ.get("BENCH_REPEAT", "3"))
PORT = int(os.environ.get("BENCH_PORT", "54351"))


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


class Side:
    def __init__(self, label, pgbin, port):
        self.label, self.pgbin, self.port = label, pgbin, port
        self.dir = tempfile.mkdtemp(prefix="eventbox-bench-conflicts-%s." % label)
        os.chmod(self.dir, 0o755)
        subprocess.run([str(REPO / "tools" / "cluster.sh"), "start", self.dir, "--port",
                        str(port), "--conf", "eventbox.handler_workers=0"],
                       check=True, env=dict(os.environ, EVENTBOX_PGBIN=pgbin),
                       stdout=subprocess.DEVNULL)
        env = {}
        for line in open(os.path.join(self.dir, "env")):
            line = line.strip()
            if line.startswith("export "):
                line = line[len("export "):]
            if "=" in line:
                k, v = line.split("=", 1)
                env[k] = v.strip("'\"")
        self.env = env
        self.conn = psycopg2.connect(host=env["PGHOST"], port=env["PGPORT"], user=env["PGUSER"],
                                     dbname=env["PGDATABASE"])
        self.conn.autocommit = True
        self.q("CREATE EXTENSION pg_eventbox")
        self.broker = DevBroker(env["EVENTBOX_CONTROL_HOST"] or "127.0.0.1",
                                int(env["EVENTBOX_CONTROL_PORT"]))

    def q(self, sql, args=None):
        with self.conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else None

    def offsets_sum(self, sub):
        return self.q("SELECT coalesce(sum(next_offset), 0) FROM eventbox.offsets "
                      "WHERE subscription = %s", (sub,))[0][0]

    def ingest_cpu_s(self):
        pid = self.q("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventbox ingest'")[0][0]
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wait_offsets(self, sub, n, t0, timeout=600):
        while True:
            if self.offsets_sum(sub) >= n:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise RuntimeError("%s: offsets of %s did not reach %d" % (self.label, sub, n))
            time.sleep(0.02)

    def stop(self):
        try:
            self.conn.close()
        finally:
            subprocess.run([str(REPO / "tools" / "cluster.sh"), "stop", self.dir],
                           stdout=subprocess.DEVNULL)


def produce(side, topic, records):
    side.broker.create_topic(topic, PARTITIONS)
    p = Producer({"bootstrap.servers": side.env["EVENTBOX_BOOTSTRAP"], "linger.ms": 20,
                  "batch.num.messages": 10000, "queue.buffering.max.messages": 1000000})
    for mid, part, payload in records:
        while True:
            try:
                p.produce(topic, payload, key=mid, partition=part,
                          headers=[("event_type", b"BenchEvent"), ("message_id", mid)])
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    if p.flush(120) != 0:
        raise RuntimeError("producing to %s failed" % topic)


def run(side, r):
    sub = "conflicts_%d" % r
    side.q("BEGIN; SELECT eventbox.create_subscription(%s, ARRAY['bench-1'], "
           "unhandled => 'keep'); SELECT eventbox.alter_subscription(%s, enabled => false); "
           "COMMIT", (sub, sub))
    cpu0 = side.ingest_cpu_s()
    t0 = time.monotonic()
    side.q("SELECT eventbox.alter_subscription(%s, enabled => true)", (sub,))
    fresh = side.wait_offsets(sub, N, t0)
    cpu1 = side.ingest_cpu_s()
    t0 = time.monotonic()
    side.q("SELECT eventbox.alter_subscription(%s, topics => ARRAY['bench-1', 'bench-2'])", (sub,))
    dups = side.wait_offsets(sub, 2 * N, t0)
    cpu2 = side.ingest_cpu_s()
    rows = side.q("SELECT count(*) FROM eventbox.inbox WHERE subscription = %s", (sub,))[0][0]
    if rows != N:
        raise RuntimeError("%s: %d inbox rows, expected %d" % (side.label, rows, N))
    side.q("SELECT eventbox.drop_subscription(%s)", (sub,))
    side.q("VACUUM eventbox.inbox")
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
            produce(side, "bench-1", records)
            produce(side, "bench-2", records)
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
    main()
