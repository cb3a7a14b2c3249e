"""Several databases served by one cluster (issue 33, part 1): eventbox.database lists two of
them, each gets its own supervisor, relay, ingest and handler workers, its own subscriptions,
outbox and metrics; a handler that fails in one never holds up the other; a third database with
the extension but not in the list keeps send() working and is told at CREATE EXTENSION that
nothing relays it."""

import socket
import time
import urllib.request
import uuid

import pytest

from clusters import (HANDLER_DDL, Cluster, Kafka, query, query_one, report, wait_settled,
                      wait_until)

SUB = "orders"  # the same subscription name in both databases: their state must not mix
N = 300


def free_port_pair():
    """A port P with P and P + 1 free on 127.0.0.1 (the two supervisors' metrics endpoints)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p >= 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    pytest.fail("no two consecutive free ports")


@pytest.fixture
def served(tmp_path):
    """(kafka, cluster, metrics port): eventbox.database = 'db_a, db_b'; db_c exists too."""
    kafka = Kafka(str(tmp_path))
    cluster = Cluster("dbs")
    port = free_port_pair()
    try:
        cluster.start(db="db_a", brokers=kafka.bootstrap,
                      conf=["eventbox.database = 'db_a, db_b'",
                            "eventbox.metrics_address = '127.0.0.1:%d'" % port])
        cluster.sql("CREATE DATABASE db_b", dbname="postgres")
        cluster.sql("CREATE DATABASE db_c", dbname="postgres")
        cluster.sql("CREATE ROLE app_handler NOLOGIN", dbname="postgres")
        yield kafka, cluster, port
    finally:
        cluster.stop()
        kafka.close()


FAILING = """
CREATE OR REPLACE FUNCTION shop.on_order(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(0.05);
    RAISE EXCEPTION 'this database''s handler always fails';
END $$;
"""


def setup_db(cluster, kafka, db, failing):
    c = cluster.connect(db)
    query(c, "CREATE EXTENSION pg_eventbox")
    in_topic, out_topic = kafka.topic(db + "_in"), kafka.topic(db + "_out")
    query(c, HANDLER_DDL.replace("{out}", out_topic).replace("{role}", "app_handler"))
    if failing:
        query(c, FAILING)
    query(c, "SELECT eventbox.create_subscription(%s, ARRAY[%s], max_attempts => 1000, "
             "backoff => '10 ms', backoff_max => '20 ms')", (SUB, in_topic))
    query(c, "SELECT eventbox.register_handler(%s, 'shop.on_order(eventbox.inbox)'::regprocedure,"
             " event_type => 'OrderCreated', run_as => 'app_handler')", (SUB,))
    c.close()
    wait_db_workers(cluster, db)
    return in_topic, out_topic


def wait_db_workers(cluster, db, timeout=60):
    """Waits until `db` has its supervisor, relay, ingest and two handler workers, attached to
    its eventbox.workers (clusters.wait_workers counts the whole cluster's)."""
    want = ["handler", "handler", "ingest", "relay", "supervisor"]

    def probe():
        c = cluster.connect(db)
        try:
            return sorted(r for (r,) in query(
                c, "SELECT w.role FROM eventbox.workers w JOIN pg_stat_activity a USING (pid) "
                   "WHERE a.datname = current_database()")) == want
        finally:
            c.close()

    wait_until(probe, timeout, what="the workers of %s" % db)


def orders(n):
    ids = [str(uuid.uuid4()) for _ in range(n)]
    return ids, [(m, i % 4, "k%d" % i, {"n": i}, "OrderCreated") for i, m in enumerate(ids)]


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        return r.read().decode()


def test_two_databases_are_served_apart_and_a_third_is_told(served):
    kafka, cluster, port = served
    a_in, a_out = setup_db(cluster, kafka, "db_a", failing=False)
    b_in, b_out = setup_db(cluster, kafka, "db_b", failing=True)

    # Each database's workers are its own: eventbox.workers shows them, connected to it.
    for db in ("db_a", "db_b"):
        c = cluster.connect(db)
        rows = query(c, "SELECT w.role, a.datname FROM eventbox.workers w "
                        "JOIN pg_stat_activity a USING (pid) ORDER BY 1")
        assert sorted(r[0] for r in rows) == ["handler", "handler", "ingest", "relay",
                                              "supervisor"], rows
        assert {r[1] for r in rows} == {db}, rows
        c.close()

    # db_b's handler fails on every message while db_a's handles its own.
    b_ids, b_records = orders(N)
    kafka.produce(b_in, b_records)
    cb = cluster.connect("db_b")
    b_attempts_sql = "SELECT coalesce(sum(attempts), 0) FROM eventbox.inbox WHERE subscription = %s"
    # Ordered by partition: each of the 4 lanes retries its first message over and over.
    wait_until(lambda: query_one(cb, b_attempts_sql, (SUB,)) >= 50, 60,
               what="db_b's failing handler at work")
    b_attempts_before = query_one(cb, b_attempts_sql, (SUB,))
    a_ids, a_records = orders(N)
    started = time.monotonic()
    kafka.produce(a_in, a_records)
    ca = cluster.connect("db_a")
    settled = wait_settled(ca, SUB, N, timeout=90)
    took = time.monotonic() - started
    assert settled == {"processed": N}, settled
    out_ids = {i for (i,) in query(ca, "SELECT out_id::text FROM shop.handled")}
    kafka.wait_ids(a_out, out_ids, timeout=30)
    handled_ids = {m for (m,) in query(ca, "SELECT message_id FROM shop.handled")}
    assert handled_ids == set(a_ids)
    # ... and db_b kept failing meanwhile, none of its messages handled.
    b_attempts = query_one(cb, b_attempts_sql, (SUB,)) - b_attempts_before
    assert query_one(cb, "SELECT count(*) FROM eventbox.inbox WHERE status = 'processed'") == 0
    assert b_attempts > 0, b_attempts
    assert kafka.read(b_out) == []

    # The outboxes are apart: what each database sends leaves through its own relay.
    sent = {}
    for db, c in (("db_a", ca), ("db_b", cb)):
        topic = kafka.topic(db + "_sent")
        sent[db] = (topic, [query_one(c, "SELECT eventbox.send(%s, '{}'::jsonb)::text", (topic,))
                            for _ in range(20)])
    for db, (topic, ids) in sent.items():
        kafka.wait_ids(topic, ids, timeout=30)

    # Metrics: each database its own counters, labelled with it, on its own port.
    text_a = query_one(ca, "SELECT eventbox.metrics()")
    assert 'eventbox_handler_processed_total{database="db_a",subscription="orders"} %d' % N \
        in text_a, text_a[:2000]
    text_b = query_one(cb, "SELECT eventbox.metrics()")
    assert 'eventbox_handler_processed_total{database="db_b",subscription="orders"} 0' in text_b \
        or 'eventbox_handler_processed_total{database="db_b"' not in text_b, text_b[:2000]
    assert 'database="db_a"' not in text_b
    assert 'eventbox_handler_retries_total{database="db_b",subscription="orders"}' in text_b
    wait_until(lambda: 'database="db_a"' in scrape(port), 30, what="db_a's endpoint")
    wait_until(lambda: 'database="db_b"' in scrape(port + 1), 30, what="db_b's endpoint")
    assert 'database="db_b"' not in scrape(port)

    # db_c: not listed. CREATE EXTENSION says so; send() works; nothing relays it.
    cc = cluster.connect("db_c")
    query(cc, "CREATE EXTENSION pg_eventbox")
    warned = [n for n in cc.notices if "not in eventbox.database" in n]
    assert warned and "WARNING" in warned[0], cc.notices
    c_topic = kafka.topic("db_c_sent")
    query_one(cc, "SELECT eventbox.send(%s, '{}'::jsonb)", (c_topic,))
    assert query_one(cc, "SELECT count(*) FROM eventbox.workers") == 0
    assert query_one(cluster.connect("postgres"),
                     "SELECT count(*) FROM pg_stat_activity WHERE datname = 'db_c' "
                     "AND backend_type LIKE 'eventbox%%'") == 0
    time.sleep(3)
    assert query_one(cc, "SELECT count(*) FROM eventbox.outbox") == 1
    assert kafka.read(c_topic) == []
    report("databases", db_a_handled=N, db_a_seconds="%.1f" % took, db_b_attempts=b_attempts)
    for c in (ca, cb, cc):
        c.close()
    assert not cluster.crash_lines()
