"""Several ingest workers (eventbox.ingest_workers): the partitions are dealt out between them,
each message is still stored exactly once (also when a copy of it arrives in a partition of the
other worker at the same time), offsets stay exact, and changing the number of workers or killing
one while messages stream in loses nothing."""
import random
import threading
import time
import uuid

import psycopg2

from inbox_kafka import end_offsets, json_value, produce
from inbox_support import LogWatch, poll, report, sigkill, unique_name

PARTITIONS = 8


def ingest_workers(db, column="messages"):
    """[(pid, messages or another counter)] of the running ingest workers."""
    assert column in ("messages", "duplicates", "errors"), column
    return db.rows("SELECT w.pid, w." + column + " FROM eventbox.workers w "
                   "WHERE w.role = 'ingest' "
                   "AND w.state <> 'starting' AND w.pid IN (SELECT pid FROM pg_stat_activity "
                   "WHERE backend_type = 'eventbox ingest') ORDER BY w.pid")


def wait_workers(db, n, not_pids=()):
    """Waits until n ingest workers run, none of them in not_pids (across a crash restart)."""
    def probe():
        try:
            w = ingest_workers(db)
        except psycopg2.DatabaseError:
            return None  # the server restarts after a SIGKILL; db reconnects next time
        return w if len(w) == n and not {p for p, _ in w} & set(not_pids) else None
    return poll(probe, 90, "%d ingest workers" % n, 0.2)


def records_for(ids, rng, copies):
    """One record per id, plus `copies` redelivered copies of random ids, each produced to a
    random partition (so often to a partition of the other worker)."""
    out = []
    for i, mid in enumerate(ids):
        out.append({"key": b"k%d" % (i % 97), "value": json_value({"n": i, "id": mid}),
                    "headers": [("message_id", mid.encode())]})
    for mid in rng.sample(ids, copies):
        out.append({"value": json_value({"copy": mid}), "partition": rng.randrange(PARTITIONS),
                    "headers": [("message_id", mid.encode())]})
    rng.shuffle(out)
    return out


def new_stream(ib_topic, label, seed, n, copies):
    """A fresh topic and subscription name, n message ids and their records with copies."""
    topic = ib_topic(label, PARTITIONS)
    run = uuid.uuid4().hex[:8]
    ids = ["%s-%05d" % (run, i) for i in range(n)]
    return topic, unique_name(label), ids, records_for(ids, random.Random(seed), copies)


def stored_ids(db, sub):
    rows = db.rows_retry("SELECT message_id FROM eventbox.inbox WHERE subscription = %s", (sub,))
    return [r[0] for r in rows]


def test_two_ingest_workers_share_partitions_and_store_each_message_once(
        ib_db, ib_topic, ib_producer, ib_subscriptions, settings):
    settings.set("eventbox.ingest_workers", 2)
    wait_workers(ib_db, 2)
    log = LogWatch()
    errors_before = dict(ingest_workers(ib_db, "errors"))
    topic, sub, ids, records = new_stream(ib_topic, "workers", 2, 20_000, 4_000)
    before = dict(ingest_workers(ib_db))
    ib_subscriptions(sub, [topic])
    produce(ib_producer, topic, records)
    ends = end_offsets(topic)
    assert sum(ends.values()) == len(records)
    stored = ib_db.wait_caught_up(sub, ends, timeout=120)

    got = stored_ids(ib_db, sub)
    after = dict(ingest_workers(ib_db))
    per_worker = {pid: after[pid] - before.get(pid, 0) for pid in after}
    owners = ib_db.rows("SELECT count(DISTINCT \"partition\") FROM eventbox.inbox "
                        "WHERE subscription = %s", (sub,))[0][0]
    report("ingest_workers_2", messages=len(ids), copies=4_000, rows=len(got),
           lost=len(set(ids) - set(got)), per_worker=per_worker)
    assert len(got) == len(set(got)) == len(ids)
    assert set(got) == set(ids)
    assert stored == {tp: end for tp, end in ends.items() if end > 0}
    assert owners == PARTITIONS
    # Both workers read a share of the partitions.
    assert len(per_worker) == 2 and all(n > 0 for n in per_worker.values()), per_worker
    assert sum(per_worker.values()) == len(records), per_worker

    # eventbox.replay of every partition: each worker seeks its own partitions back, and every
    # record read again is a duplicate.
    dups_before = sum(n for _, n in ingest_workers(ib_db, "duplicates"))
    ib_db.rows("SELECT eventbox.replay(%s, %s, p, 0) FROM generate_series(0, %s) p",
               (sub, topic, PARTITIONS - 1))
    poll(lambda: sum(n for _, n in ingest_workers(ib_db, "duplicates")) - dups_before
         >= len(records), 60, "every record read again after the replay")
    assert ib_db.wait_caught_up(sub, ends, timeout=60) == stored
    assert ib_db.inbox_count(sub) == len(ids)
    assert sum(n for _, n in ingest_workers(ib_db, "duplicates")) - dups_before == len(records)
    # Copies of one message stored by both workers at once wait for each other, never deadlock
    # (which would surface as an ERROR, a batch read again and a worker's error count).
    assert dict(ingest_workers(ib_db, "errors")) == errors_before
    assert log.lines(r"deadlock detected|eventbox ingest.*ERROR") == []


def test_changing_and_killing_ingest_workers_while_streaming_loses_nothing(
        ib_db, ib_topic, ib_producer, ib_subscriptions, settings):
    topic, sub, ids, records = new_stream(ib_topic, "workers-change", 3, 30_000, 3_000)
    ib_subscriptions(sub, [topic])

    done = threading.Event()
    failure = []

    def stream():
        try:
            for start in range(0, len(records), 1_000):
                produce(ib_producer, topic, records[start:start + 1_000])
                time.sleep(0.05)
        except Exception as e:  # reported by the test thread
            failure.append(e)
        finally:
            done.set()

    log = LogWatch()
    t = threading.Thread(target=stream)
    t.start()
    events = []
    try:
        ib_db.wait_rows(sub, 3_000, timeout=60)
        settings.set("eventbox.ingest_workers", 2)
        wait_workers(ib_db, 2)
        events.append("1->2 at %d rows" % ib_db.inbox_count(sub))
        ib_db.wait_rows(sub, 10_000, timeout=60)
        victim = ingest_workers(ib_db)[0][0]
        sigkill(victim)
        events.append("killed %d at %d rows" % (victim, ib_db.value_retry(
            "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s", (sub,))))
        wait_workers(ib_db, 2, not_pids=(victim,))
        # One worker stopped alone (no crash restart of the server): the launcher starts its
        # index again and it takes its partitions back at their stored offsets.
        stopped = ingest_workers(ib_db)[-1][0]
        ib_db.rows("SELECT pg_terminate_backend(%s)", (stopped,))
        events.append("terminated %d at %d rows" % (stopped, ib_db.inbox_count(sub)))
        wait_workers(ib_db, 2, not_pids=(stopped,))
        poll(lambda: ib_db.value_retry("SELECT count(*) >= 20000 FROM eventbox.inbox "
                                       "WHERE subscription = %s", (sub,)), 90, "20000 rows")
        settings.set("eventbox.ingest_workers", 1)
        wait_workers(ib_db, 1)
        events.append("2->1 at %d rows" % ib_db.value_retry(
            "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s", (sub,)))
    finally:
        done.wait(180)
        t.join(5)
    assert not failure, failure
    ends = end_offsets(topic)
    assert sum(ends.values()) == len(records)
    stored = ib_db.wait_caught_up(sub, ends, timeout=120)
    got = stored_ids(ib_db, sub)
    report("ingest_workers_change", messages=len(ids), rows=len(got),
           lost=len(set(ids) - set(got)), events="; ".join(events))
    assert set(got) == set(ids) and len(got) == len(ids)
    assert stored == {tp: end for tp, end in ends.items() if end > 0}
    # Old and new owners of a partition read it at once while the count changes: still no
    # deadlock between their inserts.
    assert log.lines(r"deadlock detected") == []
