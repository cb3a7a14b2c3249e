#!/usr/bin/python3
"""Membership 'group' measured (docs/guide/scaling.md, "Several servers"): one subscription over
8 partitions consumed by 1, 2 and 3 PostgreSQL servers (clusters on this machine, one dev
broker, one Kafka consumer group). The figures are about rebalance time and correctness, not
throughput: the servers share this machine's cores.

For each number of servers N:
  join    N clusters take the subscription (membership 'group') at once; a wave of records
          (100 per partition) is produced; seconds until every record is stored by one of
          them, and how the 8 partitions were shared;
  stop    (N > 1) the last server is stopped immediately (no shutdown) while a wave is
          consumed, another wave is produced: seconds until the others store all of it;
and, over both: records lost (stored nowhere) and records stored by two servers (the window:
at most one batch per move, docs/guide/scaling.md).

The dev broker is librdkafka's mock cluster: each join waits about the session timeout (10 s)
and it ignores group.instance.id; real Kafka completes a join once the known members rejoin.

Usage: EVENTBOX_PGBIN=... bench/bench_group.py
Knobs: BENCH_PORT (default 54353; the clusters take BENCH_PORT+1..+3), BENCH_GROUP_SERVERS
(default "1,2,3").
"""
import os
import pathlib
import sys
import tempfile
import time
import uuid

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "test" / "lib"))

import clusters as clusters_lib  # noqa: E402
from clusters import Cluster, Kafka, query  # noqa: E402

PORT = int(os.environ.get("BENCH_PORT", "54353"))
SERVERS = [int(n) for n in os.environ.get("BENCH_GROUP_SERVERS", "1,2,3").split(",")]
PARTITIONS = 8
BATCH = 100
PER_PARTITION = 100
TIMEOUT = 180


def stored(cluster):
    c = cluster.connect()
    try:
        return dict(query(c, "SELECT message_id, \"partition\" FROM eventbox.inbox "
                             "WHERE subscription = 'orders'"))
    finally:
        c.close()


def wave(kafka, topic):
    ids = [str(uuid.uuid4()) for _ in range(PARTITIONS * PER_PARTITION)]
    kafka.produce(topic, [(m, i % PARTITIONS, "k%d" % i, {"n": i}, "OrderCreated")
                          for i, m in enumerate(ids)])
    return ids


def wait_stored(clusters, ids):
    """Seconds until every id is stored by one of `clusters`; their rows then."""
    t0 = time.monotonic()
    want = set(ids)
    while True:
        seen = [stored(c) for c in clusters]
        if want <= set().union(*(s.keys() for s in seen)):
            return time.monotonic() - t0, seen
        if time.monotonic() - t0 > TIMEOUT:
            raise RuntimeError("records not stored after %d s" % TIMEOUT)
        time.sleep(0.2)


def twice(seen, ids):
    want = set(ids)
    count = {}
    for s in seen:
        for i in want & s.keys():
            count[i] = count.get(i, 0) + 1
    return sum(1 for n in count.values() if n > 1)


def run(n):
    logdir = tempfile.mkdtemp(prefix="eventbox-bench-group.")
    kafka = Kafka(logdir)
    clusters = [Cluster("bgroup%d" % k, port=PORT + 1 + k) for k in range(n)]
    row = {"servers": n}
    try:
        topic = kafka.topic("group_in", partitions=PARTITIONS)
        for c in clusters:
            c.start(brokers=kafka.bootstrap)
            c.sql("CREATE EXTENSION pg_eventbox")
        for c in clusters:
            c.sql("SELECT eventbox.create_subscription('orders', ARRAY[%s], "
                  "group_id => 'bench-group', membership => 'group', batch_size => %s)",
                  (topic, BATCH))
        ids = wave(kafka, topic)
        row["join_s"], seen = wait_stored(clusters, ids)
        row["shares"] = "/".join(
            str(len({p for i, p in s.items() if i in set(ids)})) for s in seen)
        all_ids = list(ids)
        if n > 1:
            busy = wave(kafka, topic)
            clusters[-1].pg_ctl_stop("immediate")
            after = wave(kafka, topic)
            row["move_s"], _ = wait_stored(clusters[:-1], after)
            clusters[-1].pg_ctl_start()
            all_ids += busy + after
        _, seen = wait_stored(clusters, all_ids)
        row["lost"] = len(set(all_ids) - set().union(*(s.keys() for s in seen)))
        row["twice"] = twice(seen, all_ids)
        row["records"] = len(all_ids)
    finally:
        for c in clusters:
            c.stop()
        kafka.close()
    return row


def main():
    rows = [run(n) for n in SERVERS]
    clusters_lib.remove_stopped_data()  # every run finished: the logs stay, the data goes
    print()
    print("one subscription over %d partitions, membership 'group', batch_size %d, dev broker"
          % (PARTITIONS, BATCH))
    print("%-8s %-14s %-10s %-22s %8s %6s %14s" % (
        "servers", "partitions", "join (s)", "move after stop (s)", "records", "lost",
        "stored twice"))
    for r in rows:
        print("%-8d %-14s %-10.1f %-22s %8d %6d %14d" % (
            r["servers"], r["shares"], r["join_s"],
            "%.1f" % r["move_s"] if "move_s" in r else "-", r["records"], r["lost"],
            r["twice"]))


if __name__ == "__main__":
    main()
