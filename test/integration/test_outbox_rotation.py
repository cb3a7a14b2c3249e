"""Rotation and truncation of the outbox's tables (issue 31, docs/design/outbox-rotation.md,
"Writing: which table" and "Truncating"): the relay opens the next of eventbox.outbox_rows_0, _1
and _2 when the open one is older than eventbox.outbox_rotation_interval (1 s here), and
truncates a closed one once every row in it is settled and no transaction that could still
write into it runs. What must hold:

- a truncate never removes an unsettled row: a writer that read the open table just before a
  rotation and inserts into it after (held on the view's INSERT trigger's lock, between reading
  the open table and writing its row), a transaction whose sends span a rotation (it reads the
  open table once), and a writer prepared across the rotation, keep their table from being
  finalized until they end; their rows are delivered once;
- eventbox.truncate_outbox() does not settle the row of a writer that drew its id before it
  and writes after it: that row is delivered; a transaction that truncates between two sends
  writes its second row into the table open after the truncate;
- rows keep per-key order across rotations;
- with eventbox.outbox_retention = 0 the rotated tables and their ack tables go back to empty
  (pg_relation_size 0) after several rotations, with no VACUUM and no row deleted one by one;
- the open table is also rotated once it reaches eventbox.outbox_rotation_size;
- the relay stores its settled position W at most every 100 ms, and comes back for one it
  skipped within that, whatever its poll interval (the rotation waits for W).

The tests share one cluster of their own (max_prepared_transactions is a server setting) and a
dev broker of their own. Every wait has a deadline; nothing asserts on a bare sleep."""

import contextlib
import json
import threading
import time
import types
import uuid

import psycopg2
import psycopg2.errors
import pytest

from clusters import Cluster, Kafka, Settings, query, query_one, report, settled_below, wait_until


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    kafka = Kafka(str(tmp_path_factory.mktemp("rotation")))
    cluster = Cluster("rotation")
    try:
        cluster.start(db="app", brokers=kafka.bootstrap,
                      conf=["max_prepared_transactions = 4",
                            "eventbox.outbox_rotation_interval = '1s'",
                            "eventbox.relay_sweep_interval = '1h'"])
        c = cluster.connect()
        query(c, "CREATE EXTENSION pg_eventbox")
        c.close()
        yield kafka, cluster
    finally:
        cluster.stop()
        kafka.close()


def send(conn, topic, key, seq):
    return str(query_one(conn, "SELECT eventbox.send(%s, jsonb_build_object('seq', %s::int), "
                               "key => %s)", (topic, seq, key)))


def states(conn):
    """{n: (state, switched_xid, max_id, settled_at)} of the rotated tables."""
    return {r[0]: r[1:] for r in query(
        conn, "SELECT n, state, switched_xid::text, max_id, settled_at "
              "FROM eventbox.outbox_state WHERE n >= 0")}


def open_table(conn):
    s = states(conn)
    opened = [n for n, v in s.items() if v[0] == "open"]
    return opened[0] if opened else 0


def rows_size(conn, n):
    return query_one(conn, "SELECT pg_relation_size('eventbox.outbox_rows_%d') + "
                           "pg_relation_size('eventbox.outbox_acks_%d')" % (n, n))


def closed_and_stamped(conn, n):
    v = states(conn).get(n)
    return v is not None and v[0] == "closed" and v[1] is not None


def traffic_until_closed(conn, kafka, topic, n):
    """Writes a row every 0.3 s until table n is closed with its switched_xid recorded, then for
    3 s more (the relay's rotation steps run once a second: it gets three chances to go wrong),
    and waits for their delivery. Returns the ids written."""
    sent = []
    for i in range(200):
        sent.append(send(conn, topic, "traffic", i))
        if closed_and_stamped(conn, n):
            break
        time.sleep(0.3)
    assert closed_and_stamped(conn, n), "table %d not closed: %r" % (n, states(conn))
    for i in range(10):
        sent.append(send(conn, topic, "traffic", 1000 + i))
        time.sleep(0.3)
    kafka.wait_ids(topic, sent, timeout=60)
    return sent


def truncated(conn, n):
    """Whether closed table n was truncated: it is empty, or already open again (the relay
    opens an empty table in the call that emptied it when the open one is due)."""
    return states(conn)[n][0] in ("empty", "open")


def key_seqs(recs, key):
    return [json.loads(r.value)["seq"] for r in recs if r.key == key.encode()]


class HeldWriter:
    """A writer of one row stopped after it drew its id and read the open table, before it
    wrote its row: the steps of the view's INSERT trigger, one statement each, so that the test
    runs between them (the writer then holds no lock on the rotated tables). release() writes
    the row into the table it read and looks for its message_id in the others, as the trigger
    does (its transaction stays open until commit()); outcome["table"] is the rotated table its
    row went to."""

    def __init__(self, cluster, conn, topic):
        self.late = str(uuid.uuid4())
        self.topic = topic
        self.outcome = {}
        self.writer = cluster.connect(autocommit=False)
        self.pid = query_one(self.writer, "SELECT pg_backend_pid()")
        self.id = query_one(self.writer, "SELECT eventbox.next_outbox_id()")
        self.table = query_one(self.writer, "SELECT eventbox._outbox_open_table()")

    def release(self):
        self.write()
        self.check()

    def write(self):
        query(self.writer, "INSERT INTO eventbox.outbox_rows_%d (id, message_id, topic, key, "
                           "payload, headers, created_at) VALUES (%%s, %%s, %%s, 'late', "
                           "convert_to('{\"seq\": 0}', 'UTF8'), '{}', now())" % self.table,
              (self.id, self.late, self.topic))

    def check(self):
        query(self.writer, "SELECT eventbox._outbox_unique_message_id(%s, %s::int2)",
              (self.late, self.table))
        # Not read back through eventbox._outbox_rows: that would lock every rotated table to the
        # end of the transaction, and no closed table could be truncated meanwhile.
        self.outcome["table"] = self.table

    def commit(self):
        self.writer.commit()

    def close(self):
        self.writer.rollback()
        self.writer.close()


def test_writer_that_read_the_open_table_before_a_rotation(served):
    """A writer stopped between reading the open table and writing into it (HeldWriter), with
    no lock on the table. Its table is closed meanwhile; it must not be finalized (max_id) nor truncated while
    the writer runs, and the row it then writes into the closed table is delivered."""
    kafka, cluster = served
    topic = kafka.topic("rotation_late")
    conn = cluster.connect()
    kafka.wait_ids(topic, [send(conn, topic, "probe", 0)], timeout=60)
    wait_until(lambda: len(states(conn)) == 3, 30, what="the rotated tables' state rows")

    held = HeldWriter(cluster, conn, topic)
    late = held.late
    try:
        writer_xid = int(query_one(conn, "SELECT backend_xid::text FROM pg_stat_activity "
                                         "WHERE pid = %s", (held.pid,)))
        # The writer read this table or, when a rotation came in between, the one before it:
        # both are closed once this one is.
        current = open_table(conn)
        sent = traffic_until_closed(conn, kafka, topic, current)
        # Every table closed after the writer had its xid may still get the writer's row.
        later = {n: v for n, v in states(conn).items()
                 if v[0] != "open" and v[1] is not None and int(v[1]) > writer_xid}
        assert current in later
        assert all(v[0] == "closed" and v[2] is None for v in later.values()), \
            "a table finalized while a writer that read it runs: %r" % later

        held.release()
        first = int(held.outcome["table"])
        assert first in later   # written into a table closed while it waited
        held.commit()
        recs = kafka.wait_ids(topic, [late] + sent, timeout=60)
        ids = [r.message_id for r in recs]
        assert ids.count(late) == 1 and len(ids) == len(set(ids))
        assert key_seqs(recs, "traffic") == sorted(key_seqs(recs, "traffic"))
        # Then its table goes: finalized, settled, truncated.
        wait_until(lambda: truncated(conn, first), 60,
                   what="table %d truncated after the late row was delivered" % first)
        assert rows_size(conn, first) == 0
        assert [r.message_id for r in kafka.read(topic)].count(late) == 1
        report("rotation_late_writer", published=len(ids))
    finally:
        held.close()
        conn.close()


@contextlib.contextmanager
def writer_past_a_rotation(served, topic_name):
    """A transaction (`writer`, not committed) that sent a row (key "writer", seq 1), then
    traffic from `conn` until the table it wrote into is closed. Yields a namespace with kafka,
    topic, conn, writer, first (its message_id), table and sent (the traffic's ids); the writer
    is rolled back if the test did not commit it."""
    kafka, cluster = served
    w = types.SimpleNamespace(kafka=kafka, topic=kafka.topic(topic_name), conn=cluster.connect(),
                              writer=cluster.connect(autocommit=False))
    try:
        kafka.wait_ids(w.topic, [send(w.conn, w.topic, "probe", 0)], timeout=60)
        wait_until(lambda: len(states(w.conn)) == 3, 30, what="the rotated tables' state rows")
        w.first = send(w.writer, w.topic, "writer", 1)
        w.table = query_one(w.writer, "SELECT eventbox._outbox_open_table()")
        w.sent = traffic_until_closed(w.conn, kafka, w.topic, w.table)
        yield w
    finally:
        w.writer.rollback()
        w.writer.close()
        w.conn.close()


def test_transaction_sending_across_a_rotation(served):
    """A transaction reads the open table once, at its first send() (outbox_insert.cpp,
    open_table()): its later sends go into that table even when the relay closed it meanwhile,
    since the relay waits for the whole writer before it finalizes the table. Its two rows are
    in the table closed while it ran, that table is not finalized before it commits, and both
    rows are delivered once."""
    with writer_past_a_rotation(served, "rotation_one_read") as w:
        assert open_table(w.conn) != w.table
        assert states(w.conn)[w.table][2] is None, "finalized while its writer runs"
        second = send(w.writer, w.topic, "writer", 2)
        # Read in the writer's transaction, which already holds the table it wrote into.
        mine = query_one(w.writer, "SELECT count(*) FROM eventbox.outbox_rows_%d "
                                   "WHERE message_id IN (%%s, %%s)" % w.table, (w.first, second))
        assert mine == 2, "the second send() went to another table"
        w.writer.commit()
        recs = w.kafka.wait_ids(w.topic, [w.first, second] + w.sent, timeout=60)
        ids = [r.message_id for r in recs]
        assert ids.count(w.first) == 1 and ids.count(second) == 1 and len(ids) == len(set(ids))
        assert key_seqs(recs, "writer") == [1, 2]
        wait_until(lambda: truncated(w.conn, w.table), 60,
                   what="table %d truncated after the writer's rows were delivered" % w.table)
        report("rotation_one_read", table=w.table, published=len(ids))


def test_transaction_truncating_the_outbox_between_its_sends(served):
    """A transaction that sent, then emptied the outbox with truncate_outbox() after the table
    it had read was closed (the truncate marks closed tables empty), sends its next row into the
    table open then, not into the emptied one: the number it read is forgotten with the
    truncate. That row is delivered; the one sent before the truncate is not."""
    with writer_past_a_rotation(served, "rotation_truncate_between") as w:
        query(w.writer, "SELECT eventbox.truncate_outbox()")
        second = send(w.writer, w.topic, "writer", 2)
        now_open = query_one(w.writer,
                             "SELECT n FROM eventbox.outbox_state WHERE state = 'open'")
        assert now_open != w.table
        mine = query_one(w.writer, "SELECT count(*) FROM eventbox.outbox_rows_%d "
                                   "WHERE message_id = %%s" % now_open, (second,))
        assert mine == 1, "the row sent after the truncate is not in the open table"
        w.writer.commit()
        recs = w.kafka.wait_ids(w.topic, [second], timeout=60)
        ids = [r.message_id for r in recs]
        assert ids.count(second) == 1 and w.first not in ids
        report("rotation_truncate_between", table=w.table, open=now_open, traffic=len(w.sent))


# More given message ids in one transaction than the lock table has room for (64 locks per
# connection by default): a lock per id failed with "out of shared memory" at about 6,000.
MANY_IDS = 30000


def test_many_given_message_ids_in_one_transaction(served):
    """send() with the caller's message_id and INSERT into the view take no lock per id: one
    transaction writes MANY_IDS of each, and they are all delivered, once each. (A duplicate
    across tables: test_one_message_id_from_two_writers_in_two_tables.)"""
    kafka, cluster = served
    topic = kafka.topic("rotation_many_ids")
    conn = cluster.connect(autocommit=False)
    try:
        query(conn, "SELECT count(eventbox.send(%s, jsonb_build_object('i', g), "
                    "message_id => gen_random_uuid())) FROM generate_series(1, %s) g",
              (topic, MANY_IDS))
        query(conn, "INSERT INTO eventbox.outbox (message_id, topic, payload) "
                    "SELECT gen_random_uuid(), %s, convert_to(g::text, 'UTF8') "
                    "FROM generate_series(1, %s) g", (topic, MANY_IDS))
        assert query_one(conn, "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() "
                               "AND locktype = 'advisory'") == 0
        ids = {r[0] for r in query(conn, "SELECT message_id::text FROM eventbox.outbox "
                                         "WHERE topic = %s", (topic,))}
        conn.commit()
        assert len(ids) == 2 * MANY_IDS
        watch = cluster.connect()
        wait_until(lambda: query_one(watch, "SELECT count(*) FROM eventbox.outbox "
                                            "WHERE topic = %s AND status <> 'sent'", (topic,))
                   == 0, 120, what="every row sent")
        got = [r.message_id for r in kafka.read(topic)]
        assert len(got) == len(ids) and set(got) == ids
        watch.close()
        report("rotation_many_ids", rows=2 * MANY_IDS)
    finally:
        conn.rollback()
        conn.close()


@pytest.mark.parametrize("second, first_ends", [("send", "commit"), ("view", "rollback")])
def test_one_message_id_from_two_writers_in_two_tables(served, second, first_ends):
    """A writer wrote message_id X into the open table and has not committed; the table is
    closed, and a second writer writes X into the next one. The second waits for the first:
    when the first commits, the second gets 23505; when it rolls back, the second's row stays."""
    kafka, cluster = served
    topic = kafka.topic("rotation_two_writers_%s" % second)
    conn = cluster.connect()
    first = HeldWriter(cluster, conn, topic)
    other = cluster.connect()
    outcome = {}
    try:
        first.release()
        traffic_until_closed(conn, kafka, topic, first.table)
        assert open_table(conn) != first.table
        pid = query_one(other, "SELECT pg_backend_pid()")
        sql = {"send": "SELECT eventbox.send(%s, '{}'::jsonb, message_id => %s::uuid)",
               "view": "INSERT INTO eventbox.outbox (topic, message_id) VALUES (%s, %s)"}[second]

        def write():
            try:
                query(other, sql, (topic, first.late))
                outcome["ok"] = True
            except psycopg2.Error as e:
                outcome["error"] = e
        thread = threading.Thread(target=write, daemon=True)
        thread.start()
        wait_until(lambda: query_one(conn, "SELECT wait_event FROM pg_stat_activity "
                                           "WHERE pid = %s", (pid,)) == "transactionid", 30,
                   what="the second writer waiting for the first")
        if first_ends == "commit":
            first.commit()
        else:
            first.writer.rollback()
        thread.join(30)
        assert not thread.is_alive()
        rows = query_one(conn, "SELECT count(*) FROM eventbox._outbox_rows WHERE message_id = %s",
                         (first.late,))
        if first_ends == "commit":
            assert isinstance(outcome.get("error"), psycopg2.errors.UniqueViolation), outcome
            assert outcome["error"].diag.message_hint
        else:
            assert outcome == {"ok": True}
        assert rows == 1
        kafka.wait_ids(topic, [first.late], timeout=60)
        report("rotation_two_writers", second=second, first_ends=first_ends)
    finally:
        first.close()
        other.close()
        conn.close()


def test_one_message_id_written_into_two_tables_at_once(served):
    """Two writers of one message_id, each into another table, both write before either looks
    in the other tables: each then waits for the other, the deadlock detector ends one of them
    (40P01), and the other's row is the one kept and delivered."""
    kafka, cluster = served
    topic = kafka.topic("rotation_both_at_once")
    conn = cluster.connect()
    first = HeldWriter(cluster, conn, topic)
    first.write()
    traffic_until_closed(conn, kafka, topic, first.table)
    second = HeldWriter(cluster, conn, topic)
    second.late = first.late
    outcomes = {}

    def check(writer, name):
        try:
            writer.check()
            outcomes[name] = "ok"
        except psycopg2.Error as e:
            outcomes[name] = e.pgcode
            writer.writer.rollback()
    try:
        assert second.table != first.table
        second.write()
        threads = [threading.Thread(target=check, args=(w, n), daemon=True)
                   for w, n in ((first, "first"), (second, "second"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(outcomes.values()) == ["40P01", "ok"], outcomes
        kept = first if outcomes["first"] == "ok" else second
        kept.commit()
        assert query_one(conn, "SELECT count(*) FROM eventbox._outbox_rows WHERE message_id = %s",
                         (first.late,)) == 1
        kafka.wait_ids(topic, [first.late], timeout=60)
        report("rotation_both_at_once", ended=[n for n, v in outcomes.items() if v != "ok"][0])
    finally:
        first.close()
        second.close()
        conn.close()


def test_writer_prepared_across_a_rotation(served):
    """A transaction that sent a row is prepared; its table is closed and the relay moves on.
    The table is not finalized while the prepared transaction runs; its row is delivered when
    it commits, and then the table is truncated."""
    kafka, cluster = served
    topic = kafka.topic("rotation_prepared")
    conn = cluster.connect()
    kafka.wait_ids(topic, [send(conn, topic, "probe", 0)], timeout=60)
    backend = cluster.connect()
    try:
        query(backend, "BEGIN")
        late = send(backend, topic, "late", 0)
        query(backend, "PREPARE TRANSACTION 'eb_rotation'")
        # The prepared transaction keeps its lock on the table its row went into.
        table = query_one(conn, "SELECT relation::regclass::text FROM pg_locks "
                                "WHERE pid IS NULL AND locktype = 'relation' "
                                "AND relation::regclass::text ~ '^eventbox[.]outbox_rows_[0-2]$'")
        first = int(table[-1])
        sent = traffic_until_closed(conn, kafka, topic, first)
        state = states(conn)[first]
        assert state[0] == "closed" and state[2] is None, \
            "table %d finalized while a prepared writer runs: %r" % (first, state)
        assert late not in {r.message_id for r in kafka.read(topic)}

        query(conn, "COMMIT PREPARED 'eb_rotation'")
        recs = kafka.wait_ids(topic, [late] + sent, timeout=60)
        ids = [r.message_id for r in recs]
        assert ids.count(late) == 1 and len(ids) == len(set(ids))
        wait_until(lambda: truncated(conn, first), 60,
                   what="table %d truncated after the prepared row was delivered" % first)
        assert [r.message_id for r in kafka.read(topic)].count(late) == 1
        report("rotation_prepared_writer", published=len(ids))
    finally:
        if query_one(conn, "SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'eb_rotation'"):
            query(conn, "ROLLBACK PREPARED 'eb_rotation'")
        backend.close()
        conn.close()


def test_order_kept_and_tables_emptied_across_rotations(served):
    """Three keys written in many small transactions over at least four rotations (every table
    used, one twice): each key's rows arrive in order, none lost or twice; once all are
    delivered, every table but the open one is empty again (pg_relation_size 0, rows and ack
    rows) with nothing deleted one by one and no VACUUM."""
    kafka, cluster = served
    topic = kafka.topic("rotation_order")
    conn = cluster.connect()
    keys = ("a", "b", "c")
    sent, seq, rotations, biggest = [], 0, 0, 0
    last_open = open_table(conn)
    deadline = time.monotonic() + 120
    for _ in range(5000):
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            for _ in range(10):
                for k in keys:
                    cur.execute("SELECT eventbox.send(%s, jsonb_build_object('seq', %s::int), "
                                "key => %s)", (topic, seq, k))
                    sent.append(str(cur.fetchone()[0]))
                seq += 1
            cur.execute("COMMIT")
        biggest = max(biggest, max(rows_size(conn, n) for n in range(3)))
        now_open = open_table(conn)
        if now_open != last_open:
            rotations += 1
            last_open = now_open
        if rotations >= 4 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert rotations >= 4, "only %d rotations: %r" % (rotations, states(conn))
    recs = kafka.wait_ids(topic, sent, timeout=120)
    ids = [r.message_id for r in recs]
    assert len(ids) == len(set(ids)) == len(sent)
    for k in keys:
        assert key_seqs(recs, k) == list(range(seq)), "key %s out of order" % k
    assert biggest > 0

    def emptied():
        s = states(conn)
        closed = [n for n, v in s.items() if v[0] != "open"]
        return all(s[n][0] == "empty" and rows_size(conn, n) == 0 for n in closed)
    wait_until(emptied, 60, what="every closed table truncated (%r)" % states(conn))
    deleted = query_one(conn, "SELECT coalesce(sum(n_tup_del + n_tup_upd), 0) "
                              "FROM pg_stat_user_tables WHERE schemaname = 'eventbox' "
                              "AND (relname LIKE 'outbox_rows_%%' OR relname LIKE 'outbox_acks_%%')")
    assert deleted == 0
    assert query_one(conn, "SELECT count(*) FROM eventbox.outbox WHERE topic = %s", (topic,)) == 0
    report("rotation_order", published=len(ids), rotations=rotations, biggest_bytes=biggest)
    conn.close()


def test_writer_that_drew_its_id_before_truncate_outbox(served):
    """eventbox.truncate_outbox() empties the tables; a writer that drew its id before it and
    writes its row after it (HeldWriter, holding no lock on the tables) commits a message that must still be sent: the truncate must not move the settled
    position past ids a running writer holds."""
    kafka, cluster = served
    topic = kafka.topic("rotation_truncate")
    conn = cluster.connect()
    kafka.wait_ids(topic, [send(conn, topic, "probe", 0)], timeout=60)

    held = HeldWriter(cluster, conn, topic)
    late = held.late
    try:
        query(conn, "SELECT eventbox.truncate_outbox()")
        held.release()
        held.commit()
        assert query_one(conn, "SELECT status FROM eventbox.outbox WHERE message_id = %s",
                         (late,)) in ("pending", "sent")
        after = send(conn, topic, "late", 1)
        recs = kafka.wait_ids(topic, [late, after], timeout=60)
        ids = [r.message_id for r in recs]
        assert ids.count(late) == 1 and ids.count(after) == 1
        report("rotation_truncate_late_writer", published=len(ids))
    finally:
        held.close()
        conn.close()


def test_open_table_rotated_by_size(served):
    """With a rotation period of an hour, the open table is closed once it reaches
    eventbox.outbox_rotation_size (1MB here): a truncate then never has more than about that to
    remove, whatever the rate, and the relay's pass, which waits for its commit, stays short."""
    kafka, cluster = served
    topic = kafka.topic("rotation_size")
    conn = cluster.connect()
    settings = Settings(cluster.connect)
    settings.set("eventbox.outbox_rotation_interval", "1h")
    settings.set("eventbox.outbox_rotation_size", "1MB")
    try:
        # Every other table empty (the rotation needs the next one empty), then a few rows in
        # the open table: it stays open for 3 s, which the 1 s period of the other tests would
        # not have let it (the relay runs with the hour).
        wait_until(lambda: all(v[0] in ("open", "empty") for v in states(conn).values()), 60,
                   what="the closed tables truncated: %r" % states(conn))
        first = open_table(conn)
        sent = [send(conn, topic, "size", -3 + i) for i in range(3)]
        time.sleep(3)
        assert open_table(conn) == first, states(conn)
        sent += [str(r[0]) for r in query(
            conn, "SELECT eventbox.send(%s, jsonb_build_object('seq', g, 'pad', "
                  "repeat('x', 200)), key => 'size') FROM generate_series(0, 5999) g", (topic,))]
        size = rows_size(conn, first)
        assert size >= 1024 * 1024, "6,000 rows of 250 bytes took only %d bytes" % size
        wait_until(lambda: open_table(conn) != first, 30,
                   what="table %d (%d bytes) closed by its size: %r" % (first, size,
                                                                      states(conn)))
        recs = kafka.wait_ids(topic, sent, timeout=60)
        assert key_seqs(recs, "size") == list(range(-3, 6000))
        wait_until(lambda: truncated(conn, first), 60,
                   what="table %d truncated: %r" % (first, states(conn)))
        report("rotation_by_size", rows=len(sent), table_bytes=size)
    finally:
        settings.restore()
        conn.close()


def why_w_stays(conn, cluster, sent):
    """What a W that did not move leaves to read: the relay's row of outbox_state (W and the gaps
    kept), the outbox's status of the rows just sent (pending: their acknowledgements were not
    written), the relay's wait, the open transactions and the relay's last log lines."""
    lines = ["relay row (settled_below, gaps): %r" % query(
                 conn, "SELECT settled_below, gaps::text FROM eventbox.outbox_state WHERE n = -1"),
             "rotated tables: %r" % states(conn),
             "sent rows by status: %r" % query(
                 conn, "SELECT status, count(*) FROM eventbox.outbox "
                       "WHERE message_id = ANY (%s::uuid[]) GROUP BY status", (sent,)),
             "open transactions: %r" % query(
                 conn, "SELECT pid, backend_type, state, wait_event, backend_xid::text, "
                       "backend_xmin::text, now() - xact_start, left(query, 60) "
                       "FROM pg_stat_activity WHERE (xact_start IS NOT NULL "
                       "OR backend_type = 'eventbox relay') AND pid <> pg_backend_pid()")]
    lines += cluster.log_lines(r"eventbox relay")[-10:]
    return "\n".join(lines)


def test_settled_position_catches_up_with_a_long_poll_interval(served):
    """W is computed at most every 100 ms: the ack pass of a short burst skips it, and the relay,
    idle after it, must still come back for it within that, not after its poll interval. (In
    this module's cluster nothing else writes to the outbox: another writer's open transaction
    would hold W, by design.)"""
    kafka, cluster = served
    topic = kafka.topic("position_catch_up")
    conn = cluster.connect()
    settings = Settings(cluster.connect)
    settings.set("eventbox.relay_poll_interval", "1h")
    try:
        for round_ in range(3):
            sent = [send(conn, topic, "k", round_ * 5 + i) for i in range(5)]
            kafka.wait_ids(topic, sent, timeout=60)
            top = query_one(conn, "SELECT max(id) FROM eventbox._outbox_rows")
            start = time.monotonic()
            wait_until(lambda: settled_below(conn) > top, 10,
                       what="W past id %d with a poll interval of an hour" % top,
                       explain=lambda: why_w_stays(conn, cluster, sent))
            report("relay_position_catch_up", sent=len(sent),
                   seconds="%.2f" % (time.monotonic() - start))
    finally:
        settings.restore()
        conn.close()
