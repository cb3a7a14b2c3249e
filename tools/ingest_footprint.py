#!/usr/bin/python3
"""Prints the ingest worker's fds, threads and memory with N subscriptions (docs/design/ingest.md).

Usage (against an environment of tools/cluster.sh, as root or the server's user):
    set -a; . DIR/env; set +a
    /usr/bin/python3 tools/ingest_footprint.py [N ...]        (default: 1 100 500)

For each N: N subscriptions over 5 topics of 4 partitions (subscription i reads topic i % 5),
100 records produced to each topic, waits until every subscription stored them all, then reads
/proc of the ingest worker; the subscriptions are dropped again. rss is VmRSS (it includes the
shared buffers the worker touched), anon its private memory (RssAnon)."""
import pathlib
import sys
import time
import uuid

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "test" / "integration" /
                       "inbox"))

from inbox_support import (Db, caught_up, connect, create_subscriptions, devbroker,  # noqa: E402
                           end_offsets, footprint, json_value, new_producer)

TOPICS = 5
PARTITIONS = 4
RECORDS = 100


def measure(db, broker, producer, n):
    run = uuid.uuid4().hex[:6]
    topics = ["fp_%s_%d" % (run, t) for t in range(TOPICS)]
    for t in topics:
        broker.create_topic(t, PARTITIONS)
    subs = [("fp_%s_%04d" % (run, i), [topics[i % TOPICS]]) for i in range(n)]
    conn = connect()
    try:
        t0 = time.monotonic()
        create_subscriptions(conn, subs)
        for t in topics:
            for i in range(RECORDS):
                producer.send(t, value=json_value({"i": i}),
                              headers=[("message_id", ("%s-%d" % (t, i)).encode())])
        producer.flush(timeout=60)
        ends = {t: end_offsets(t) for t in topics}
        while caught_up(db, ends, subs):
            if time.monotonic() - t0 > 600:
                raise SystemExit("not caught up after 600 s")
            time.sleep(0.5)
        took = time.monotonic() - t0
        pid = db.ingest_worker()[0]
        fp = footprint(pid)
        rows = db.value("SELECT count(*) FROM eventbox.inbox WHERE subscription LIKE %s",
                        ("fp_%s_%%" % run,))
        return dict(fp, subscriptions=n, rows=rows, seconds=took)
    finally:
        db.rows("SELECT eventbox.drop_subscription(name) FROM eventbox.subscriptions "
                "WHERE name LIKE %s", ("fp_%s_%%" % run,))
        conn.close()


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [1, 100, 500]
    db = Db()
    db.rows("CREATE EXTENSION IF NOT EXISTS pg_eventbox")
    broker = devbroker()
    producer = new_producer()
    print("%13s %6s %8s %9s %9s %8s %10s" % ("subscriptions", "fds", "threads", "rss_kb",
                                              "anon_kb", "rows", "caught_up"))
    for n in sizes:
        r = measure(db, broker, producer, n)
        print("%13d %6d %8d %9d %9d %8d %9.1fs" % (r["subscriptions"], r["fds"], r["threads"],
                                                    r["rss_kb"], r["anon_kb"], r["rows"],
                                                    r["seconds"]), flush=True)
    producer.close(timeout=10)


if __name__ == "__main__":
    main()
