"""Outbox -> Kafka delivery: exactly the committed messages, with their
payloads, keys and headers, in per-key order, including late commits.

Kafka is read back with kafka-python (and confluent_kafka as a cross-check),
never with the extension's own client.
"""

import collections
import json
import os
import random
import threading
import time
import uuid

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import pytest

from eventbox_fixtures import (cancel_unsent, connect, count_ids, java_partition, query, query_one,
                               read_topic, report, wait_for_ids, wait_outbox_drained)


def headers_of(rec):
    """User headers of a record as a dict (message_id checked separately)."""
    names = [n for n, _ in rec.headers]
    assert len(names) == len(set(names)), "duplicate header names: %r" % rec.headers
    assert names.count("message_id") == 1, rec.headers
    return {n: v for n, v in rec.headers if n != "message_id"}


# 1 ---------------------------------------------------------------------------

def test_bulk_10k_many_keys_exactly_once(conn, new_topic):
    """10k messages over 500 keys in 4 transactions: each arrives exactly
    once, with its payload, key, headers, and the Java partition of its key."""
    topic = new_topic(8)
    total, n_keys, per_tx = 10000, 500, 2500
    sent = {}  # message_id -> seq
    conn.autocommit = False
    for lo in range(0, total, per_tx):
        rows = query(conn, """
            SELECT g, eventbox.send(%s,
                       jsonb_build_object('seq', g, 'key', 'key-' || g %% %s,
                                          'text', 'grüße #' || g),
                       key => 'key-' || g %% %s,
                       headers => jsonb_build_object('event_type', 'BulkTest',
                                                     'seq', g::text))
              FROM generate_series(%s, %s) AS g""",
                     (topic, n_keys, n_keys, lo, lo + per_tx - 1))
        conn.commit()
        assert len(rows) == per_tx
        for seq, mid in rows:
            sent[mid] = seq
    conn.autocommit = True
    assert len(sent) == total

    wait_outbox_drained(topic, timeout=120)
    recs = read_topic(topic)
    lost, dups, unexpected = count_ids(recs, sent)
    report("bulk_10k", records=len(recs), lost=lost, duplicated=dups, unexpected=unexpected)
    assert (lost, dups, unexpected) == (0, 0, 0)
    assert len(recs) == total

    partition_of_key = {}
    for r in recs:
        seq = sent[r.message_id]
        key = "key-%d" % (seq % n_keys)
        assert json.loads(r.value) == {"seq": seq, "key": key, "text": "grüße #%d" % seq}
        assert r.key == key.encode()
        assert headers_of(r) == {"event_type": b"BulkTest", "seq": str(seq).encode()}
        partition_of_key.setdefault(key, set()).add(r.partition)
        # murmur2, like Kafka's Java client: mixed producers agree on partitions
        assert r.partition == java_partition(r.key, 8), (key, r.partition)
    assert len(partition_of_key) == n_keys
    assert all(len(p) == 1 for p in partition_of_key.values())
    # rows are deleted once acknowledged (outbox_retention = 0)
    assert query_one(conn, "SELECT count(*) FROM eventbox.outbox WHERE topic = %s",
                     (topic,)) == 0


# 2 ---------------------------------------------------------------------------

def test_rolled_back_messages_never_published(conn, new_topic):
    topic = new_topic(4)
    rolled_back, kept = [], []
    c = connect(autocommit=False)
    try:
        # a plain ROLLBACK
        rolled_back += [r[0] for r in query(c, """
            SELECT eventbox.send(%s, jsonb_build_object('rb', g), key => 'k' || g %% 3)
              FROM generate_series(1, 50) AS g""", (topic,))]
        c.rollback()

        # a committed transaction with a rolled back savepoint in the middle
        kept.append(query_one(c, """SELECT eventbox.send(%s, '{"part": "before"}'::jsonb,
                                                         key => 'sp')""", (topic,)))
        query(c, "SAVEPOINT s1")
        rolled_back += [r[0] for r in query(c, """
            SELECT eventbox.send(%s, jsonb_build_object('sp', g), key => 'sp')
              FROM generate_series(1, 20) AS g""", (topic,))]
        query(c, "SAVEPOINT s2")
        rolled_back.append(query_one(c, """SELECT eventbox.send(%s, '\\x00ff'::bytea,
                                                                key => 'sp')""", (topic,)))
        query(c, "ROLLBACK TO SAVEPOINT s1")
        kept.append(query_one(c, """SELECT eventbox.send(%s, '{"part": "after"}'::jsonb,
                                                         key => 'sp')""", (topic,)))
        c.commit()

        # a transaction aborted by an error after send()
        rolled_back.append(query_one(c, """SELECT eventbox.send(%s, '{"x": 1}'::jsonb)""",
                                     (topic,)))
        with pytest.raises(psycopg2.errors.DivisionByZero):
            query(c, "SELECT 1 / 0")
        c.rollback()

        # a released savepoint inside a transaction that then rolls back
        query(c, "SAVEPOINT a")
        rolled_back.append(query_one(c, """SELECT eventbox.send(%s, '{"released": 1}'::jsonb,
                                                                key => 'rel')""", (topic,)))
        query(c, "RELEASE SAVEPOINT a")
        c.rollback()
    finally:
        c.close()

    # a PL/pgSQL exception block (subtransaction) in a committed statement
    sub_rb, sub_kept = str(uuid.uuid4()), str(uuid.uuid4())
    query(conn, """
        DO $$
        BEGIN
          BEGIN
            PERFORM eventbox.send('%s', '{"plpgsql": "rolled back"}'::jsonb,
                                  message_id => '%s');
            RAISE EXCEPTION 'undo';
          EXCEPTION WHEN raise_exception THEN
            NULL;
          END;
          PERFORM eventbox.send('%s', '{"plpgsql": "kept"}'::jsonb, message_id => '%s');
        END $$""" % (topic, sub_rb, topic, sub_kept))
    rolled_back.append(sub_rb)
    kept.append(sub_kept)

    marker = query_one(conn, """SELECT eventbox.send(%s, '{"marker": true}'::jsonb)""",
                       (topic,))
    kept.append(marker)

    wait_outbox_drained(topic)
    recs = wait_for_ids(topic, kept)
    ids = [r.message_id for r in recs]
    leaked = set(ids) & set(rolled_back)
    assert not leaked, "rolled back messages were published: %r" % leaked
    assert sorted(ids) == sorted(kept), "unexpected or duplicated records"
    # before/after of the savepoint transaction keep their order (same key)
    sp = [json.loads(r.value)["part"] for r in recs if r.key == b"sp"]
    assert sp == ["before", "after"]
    # and nothing rolled back is left in the outbox either
    assert query_one(conn, "SELECT count(*) FROM eventbox.outbox WHERE message_id = ANY(%s::uuid[])",
                     (rolled_back,)) == 0


# 3 ---------------------------------------------------------------------------

def test_per_key_order_with_concurrent_writers(extension, new_topic):
    """Several sessions, each owning its keys, send small transactions at the
    same time; within each key, the sequence numbers appear in increasing
    order in its partition."""
    topic = new_topic(8)
    writers, keys_per_writer, txs, per_tx = 4, 25, 80, 6
    errors = []
    expected = collections.Counter()

    def writer(w):
        rng = random.Random(w)
        keys = ["w%d-k%d" % (w, i) for i in range(keys_per_writer)]
        seq = collections.Counter()
        c = connect(autocommit=False)
        try:
            for _ in range(txs):
                ks, ss = [], []
                for _ in range(per_tx):
                    k = rng.choice(keys)
                    ks.append(k)
                    ss.append(seq[k])
                    seq[k] += 1
                # one statement: ids are drawn in row order
                query(c, """SELECT count(eventbox.send(%s, jsonb_build_object('key', u.k, 'seq', u.s),
                                                       key => u.k))
                              FROM unnest(%s::text[], %s::int[]) AS u(k, s)""", (topic, ks, ss))
                c.commit()
            expected.update(seq)
        except Exception as e:  # reported below
            errors.append(e)
        finally:
            c.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    total = sum(expected.values())
    assert total == writers * txs * per_tx

    wait_outbox_drained(topic)
    recs = read_topic(topic)
    assert len(recs) == total
    by_key = collections.defaultdict(list)
    for r in recs:  # (partition, offset) order
        p = json.loads(r.value)
        assert r.key == p["key"].encode()
        by_key[p["key"]].append((r.partition, p["seq"]))
    assert set(by_key) == set(expected)
    for key, items in by_key.items():
        assert len({p for p, _ in items}) == 1, "key %s in several partitions" % key
        seqs = [s for _, s in items]
        assert seqs == list(range(expected[key])), "key %s out of order: %r" % (key, seqs)


def test_per_key_order_across_a_late_commit(conn, new_topic, settings):
    """Deterministic form of the above: key 'k' message 0 commits late (while
    an unrelated writer W is still open and the relay's cursor has passed its
    id); message 1 of the same key commits after it. Message 0 must still come
    first in the partition."""
    settings.set("eventbox.relay_sweep_interval", "1h")
    topic = new_topic(4)
    probe = query_one(conn, """SELECT eventbox.send(%s, '{"probe": 1}'::jsonb)""", (topic,))
    wait_for_ids(topic, [probe])

    w = connect(autocommit=False)
    a = connect(autocommit=False)
    try:
        # W: an unrelated outbox writer that stays open (lowest id)
        query_one(w, """SELECT eventbox.send(%s, '{"w": 1}'::jsonb, key => 'w')""", (topic,))
        # A: key k, seq 0, not committed yet
        seq0 = query_one(a, """SELECT eventbox.send(%s, '{"seq": 0}'::jsonb, key => 'k')""",
                         (topic,))
        # B: commits and is published: the relay's cursor moves past A's id
        b = query_one(conn, """SELECT eventbox.send(%s, '{"b": 1}'::jsonb, key => 'b')""",
                      (topic,))
        wait_for_ids(topic, [b])
        a.commit()
        # key k, seq 1, committed after seq 0
        seq1 = query_one(conn, """SELECT eventbox.send(%s, '{"seq": 1}'::jsonb, key => 'k')""",
                         (topic,))
        # Give the relay time to publish (a correct relay publishes seq 0 first,
        # or holds seq 1 back until it can).
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if seq1 in {r.message_id for r in read_topic(topic)}:
                break
            time.sleep(0.2)
        w.rollback()
    finally:
        w.close()
        a.close()
    recs = wait_for_ids(topic, [seq0, seq1], timeout=30)
    order = [r.message_id for r in recs if r.key == b"k"]
    assert order == [seq0, seq1], (
        "key k published out of order: seq %s" % [0 if m == seq0 else 1 for m in order])


# 4 ---------------------------------------------------------------------------

def test_late_commit_is_published_without_sweep(conn, new_topic, settings):
    """T1 draws a lower outbox id and commits after T2 (and many others) were
    published: the relay's late-commit recheck publishes T1 promptly, with
    the periodic sweep pushed out to an hour."""
    settings.set("eventbox.relay_sweep_interval", "1h")
    topic = new_topic(4)
    # One round trip after the reload: the relay has applied it.
    probe = query_one(conn, """SELECT eventbox.send(%s, '{"probe": 1}'::jsonb)""", (topic,))
    wait_for_ids(topic, [probe])

    t1 = connect(autocommit=False)
    t3 = connect(autocommit=False)
    try:
        late = query_one(t1, """SELECT eventbox.send(%s, '{"who": "T1"}'::jsonb, key => 'late')""",
                         (topic,))
        late_id = query_one(t1, "SELECT id FROM eventbox.outbox WHERE message_id = %s", (late,))
        # T3 draws an id between and rolls back later
        query_one(t3, """SELECT eventbox.send(%s, '{"who": "T3"}'::jsonb, key => 'late')""",
                  (topic,))
        t2 = query_one(conn, """SELECT eventbox.send(%s, '{"who": "T2"}'::jsonb, key => 't2')""",
                       (topic,))
        t2_id = query_one(conn, "SELECT max(id) FROM eventbox.outbox WHERE topic = %s", (topic,))
        assert late_id < t2_id

        recs = wait_for_ids(topic, [t2], timeout=30)
        # T2 was read from Kafka while T1 is still open
        assert t1.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_INTRANS
        assert late not in {r.message_id for r in recs}

        # more traffic while T1 stays open: the relay's cursor moves far past T1's id
        more = []
        for i in range(5):
            more += [r[0] for r in query(conn, """
                SELECT eventbox.send(%s, jsonb_build_object('n', g)) FROM generate_series(1, 40) g""",
                                         (topic,))]
        wait_for_ids(topic, more, timeout=30)
        t3.rollback()
        assert t1.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_INTRANS

        t0 = time.monotonic()
        t1.commit()
        recs = wait_for_ids(topic, [late], timeout=20)  # far below the 1 h sweep
        took = time.monotonic() - t0
        print("late commit published %.2f s after COMMIT" % took)
    finally:
        t1.close()
        t3.close()

    wait_outbox_drained(topic)
    recs = read_topic(topic)
    ids = collections.Counter(r.message_id for r in recs)
    assert ids[late] == 1
    assert all(n == 1 for n in ids.values())
    assert len(recs) == 1 + 1 + len(more) + 1
    assert [json.loads(r.value)["who"] for r in recs if r.key == b"late"] == ["T1"]


# 9 ---------------------------------------------------------------------------

BINARY_CASES = [
    ("nul", b"\x00"),
    ("nuls_and_high", b"\x00\x01\x02\xff\xfe\x00"),
    ("all_bytes", bytes(range(256))),
    ("invalid_utf8", b"\xc3\x28\xa0\xa1\xe2\x28\xa1"),
    ("empty", b""),
    ("large_random", os.urandom(100 * 1024)),
    ("tombstone", None),
]


def test_bytea_tombstone_and_headers_round_trip(conn, new_topic):
    topic = new_topic(4)
    headers = {"event_type": "BinaryTest", "unicode": "ü€😀", "empty": "",
               "spaces": "  a b  ", "quote": "it's \"quoted\""}
    expected = {}  # message_id -> (key bytes|None, value bytes|None, headers)
    for name, payload in BINARY_CASES:
        key = "ключ-" + name
        mid = query_one(conn, "SELECT eventbox.send(%s, %s::bytea, key => %s, headers => %s::jsonb)",
                        (topic, None if payload is None else psycopg2.Binary(payload), key,
                         json.dumps(dict(headers, case=name))))
        expected[mid] = (key.encode(), payload, dict(headers, case=name))
    # no key, no headers
    mid = query_one(conn, "SELECT eventbox.send(%s, '\\xdeadbeef00'::bytea)", (topic,))
    expected[mid] = (None, b"\xde\xad\xbe\xef\x00", {})
    # JSON payload with non-ASCII text: the JSON text bytes, UTF-8
    mid = query_one(conn, """SELECT eventbox.send(%s, '{"text": "grüße €", "n": [1, 2.5]}'::jsonb,
                                                  key => 'json')""", (topic,))
    expected[mid] = (b"json", None, {})
    json_mid = mid

    wait_outbox_drained(topic)
    recs = read_topic(topic)
    assert sorted(r.message_id for r in recs) == sorted(expected)
    for r in recs:
        key, value, hdrs = expected[r.message_id]
        assert r.key == key
        if r.message_id == json_mid:
            assert json.loads(r.value.decode("utf-8")) == {"text": "grüße €", "n": [1, 2.5]}
        else:
            assert r.value == value, "payload of %s changed" % hdrs.get("case")
        assert headers_of(r) == {k: v.encode() for k, v in hdrs.items()}

    # cross-check with an independent client: confluent_kafka sees the same records
    confluent_kafka = pytest.importorskip("confluent_kafka")
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": os.environ["EVENTBOX_BOOTSTRAP"],
        "group.id": "eventbox-tests-%s" % uuid.uuid4().hex, "enable.auto.commit": False,
        "enable.partition.eof": True, "log_level": 3})
    try:
        parts = sorted({r.partition for r in recs} | set(range(4)))
        consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                         for p in parts])
        eof, got = set(), []
        deadline = time.monotonic() + 60
        while len(eof) < len(parts) and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                assert m.error().code() == confluent_kafka.KafkaError._PARTITION_EOF, m.error()
                eof.add(m.partition())
                continue
            got.append((m.partition(), m.offset(), m.key(), m.value(), list(m.headers() or [])))
        assert len(eof) == len(parts), "confluent_kafka did not reach the end of %s" % topic
    finally:
        consumer.close()
    mine = [(r.partition, r.offset, r.key, r.value, r.headers) for r in recs]
    assert sorted(got, key=lambda t: t[:2]) == mine


def test_late_commit_not_held_back_by_unrelated_open_writer(conn, new_topic, settings):
    """T1 commits late while an unrelated transaction W, which wrote to the
    outbox earlier, stays open: T1's committed message is published promptly
    (well under the sweep interval), not only once W ends."""
    settings.set("eventbox.relay_sweep_interval", "1h")
    topic = new_topic(2)
    probe = query_one(conn, """SELECT eventbox.send(%s, '{"probe": 1}'::jsonb)""", (topic,))
    wait_for_ids(topic, [probe])

    w = connect(autocommit=False)
    t1 = connect(autocommit=False)
    try:
        query_one(w, """SELECT eventbox.send(%s, '{"w": 1}'::jsonb)""", (topic,))
        late = query_one(t1, """SELECT eventbox.send(%s, '{"t1": 1}'::jsonb)""", (topic,))
        t2 = query_one(conn, """SELECT eventbox.send(%s, '{"t2": 1}'::jsonb)""", (topic,))
        wait_for_ids(topic, [t2])     # the relay's cursor is past T1's and W's ids
        t0 = time.monotonic()
        t1.commit()
        wait_for_ids(topic, [late], timeout=20)
        print("late commit published %.2f s after COMMIT with W open" % (time.monotonic() - t0))
        assert w.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_INTRANS
    finally:
        w.close()
        t1.close()


def test_message_of_max_message_bytes_is_delivered(conn, new_topic):
    """send() accepts a record of exactly eventbox.max_message_bytes as the
    producer counts it (key + value + headers with their length varints, the
    message_id header: 1 + 10 + 1 + 36 bytes, and 36 bytes of record fields):
    the relay must deliver it, and a later message of the same key must not be
    held behind it."""
    topic = new_topic(1)
    limit = int(query_one(conn, "SELECT setting FROM pg_settings "
                                "WHERE name = 'eventbox.max_message_bytes'"))
    key = "big"
    size = limit - (1 + len("message_id") + 1 + 36) - 36 - len(key)
    payload = os.urandom(size)
    try:
        with pytest.raises(psycopg2.errors.ProgramLimitExceeded):
            query_one(conn, "SELECT eventbox.send(%s, %s::bytea, key => %s)",
                      (topic, psycopg2.Binary(payload + b"x"), key))
        big = query_one(conn, "SELECT eventbox.send(%s, %s::bytea, key => %s)",
                        (topic, psycopg2.Binary(payload), key))
        small = query_one(conn, "SELECT eventbox.send(%s, '\\x01'::bytea, key => %s)",
                          (topic, key))
        wait_outbox_drained(topic, timeout=30)
        recs = read_topic(topic)
        assert [r.message_id for r in recs] == [big, small]
        assert recs[0].value == payload
    finally:
        cancel_unsent(conn, topic)
