"""Late commits of prepared transactions (issue 31): a transaction that sent and was PREPAREd
commits later, from another session, after its backend has moved on to other outbox writes, or
after a restart of the server. Its row must be published promptly, by the relay's late-commit
rechecks (the gap of its id is kept while the prepared transaction runs), not by the periodic
sweep, which these clusters push out to an hour.

Each test starts a cluster of its own (max_prepared_transactions is a server setting) with a dev
broker of its own."""

import json

import pytest

from clusters import Cluster, Kafka, query, query_one, report, wait_until

SWEEP = "1h"


@pytest.fixture
def served(tmp_path):
    kafka = Kafka(str(tmp_path))
    cluster = Cluster("prepared")
    try:
        cluster.start(db="app", brokers=kafka.bootstrap,
                      conf=["max_prepared_transactions = 4",
                            "eventbox.relay_sweep_interval = '%s'" % SWEEP])
        c = cluster.connect()
        query(c, "CREATE EXTENSION pg_eventbox")
        c.close()
        yield kafka, cluster
    finally:
        cluster.stop()
        kafka.close()


def send(conn, topic, who, key):
    return str(query_one(conn, "SELECT eventbox.send(%s, jsonb_build_object('who', %s::text), "
                               "key => %s)", (topic, who, key)))


def traffic(conn, topic, n=40, key="other"):
    """`n` committed messages of `key` (each its own transaction): the relay's cursor moves
    past every id drawn before them."""
    return [send(conn, topic, "after-%d" % i, key) for i in range(n)]


def prepare_one(cluster, topic, gid):
    """A transaction that sends one message of key 'late' and is prepared; its backend then
    sends and commits more (its writer slot now names another transaction). Returns the late
    message id and that backend's connection."""
    c = cluster.connect()   # autocommit: BEGIN and PREPARE are statements of the test's own
    query(c, "BEGIN")
    late = send(c, topic, "prepared", "late")
    query(c, "PREPARE TRANSACTION '%s'" % gid)
    assert query_one(c, "SELECT count(*) FROM pg_prepared_xacts WHERE gid = %s", (gid,)) == 1
    return late, c


def keys_of(recs, key):
    return [json.loads(r.value)["who"] for r in recs if r.key == key]


def test_prepared_late_commit_published_without_sweep(served):
    kafka, cluster = served
    topic = kafka.topic("prepared")
    conn = cluster.connect()
    probe = send(conn, topic, "probe", "probe")
    kafka.wait_ids(topic, [probe], timeout=60)

    # A prepared transaction that never wrote to the outbox: not an outbox writer.
    other = cluster.connect()
    query(other, "BEGIN")
    query(other, "SELECT pg_current_xact_id()")
    query(other, "PREPARE TRANSACTION 'eb_unrelated'")
    other.close()
    late, backend = prepare_one(cluster, topic, "eb_late_1")
    # The prepared transaction's backend moves on: its next transaction's xid replaces the
    # prepared one in its writer slot.
    after = traffic(backend, topic)
    after += traffic(conn, topic)
    recs = kafka.wait_ids(topic, after, timeout=60)
    assert late not in {r.message_id for r in recs}
    # Passes that start while the prepared transaction runs keep its gap.
    more = traffic(conn, topic, n=5, key="more")
    kafka.wait_ids(topic, more, timeout=60)
    backend.close()

    query(conn, "COMMIT PREPARED 'eb_late_1'")
    recs = kafka.wait_ids(topic, [late], timeout=20)   # far below the 1 h sweep
    ids = [r.message_id for r in recs]
    assert ids.count(late) == 1
    assert len(ids) == len(set(ids)) == 1 + len(after) + len(more) + 1
    assert keys_of(recs, b"late") == ["prepared"]
    wait_until(lambda: query_one(conn, "SELECT count(*) FROM eventbox.outbox") == 0, 30,
               what="outbox drained")
    report("prepared_late_commit", published=len(ids))
    query(conn, "ROLLBACK PREPARED 'eb_unrelated'")
    conn.close()


def test_prepared_late_commit_after_restart(served):
    """The prepared transaction outlives a restart of the server: the new relay reads every
    pending row from the start, and the recovered prepared transaction keeps the gap of its
    id."""
    kafka, cluster = served
    topic = kafka.topic("prepared_restart")
    conn = cluster.connect()
    probe = send(conn, topic, "probe", "probe")
    kafka.wait_ids(topic, [probe], timeout=60)

    late, backend = prepare_one(cluster, topic, "eb_late_2")
    backend.close()
    conn.close()
    cluster.pg_ctl_stop()
    cluster.pg_ctl_start()
    conn = cluster.connect()
    assert query_one(conn, "SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'eb_late_2'") == 1
    after = traffic(conn, topic)
    recs = kafka.wait_ids(topic, after, timeout=60)
    assert late not in {r.message_id for r in recs}

    query(conn, "COMMIT PREPARED 'eb_late_2'")
    recs = kafka.wait_ids(topic, [late], timeout=20)   # far below the 1 h sweep
    ids = [r.message_id for r in recs]
    assert ids.count(late) == 1
    assert keys_of(recs, b"late") == ["prepared"]
    wait_until(lambda: query_one(conn, "SELECT count(*) FROM eventbox.outbox") == 0, 30,
               what="outbox drained")
    conn.close()
