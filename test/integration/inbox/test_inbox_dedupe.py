"""Deduplication: every (subscription, message_id) is stored once, however often Kafka delivers
it (docs/design/guarantees.md)."""
import random
import uuid

from inbox_kafka import end_offsets, json_value, produce
from inbox_support import report, unique_name

N = 50_000          # distinct messages
DUPLICATES = N // 10  # redelivered copies (same message_id header, produced again)
PARTITIONS = 8


def test_redelivered_messages_are_stored_exactly_once(ib_db, ib_topic, ib_producer,
                                                       ib_subscriptions):
    topic = ib_topic("dedupe", PARTITIONS)
    sub = unique_name("dedupe")
    rng = random.Random(50_000)
    run = uuid.uuid4().hex[:8]
    ids = ["%s-%06d" % (run, i) for i in range(N)]
    copied = set(rng.sample(range(N), DUPLICATES))

    # Half of the copies follow their original at once (same key, so same partition and
    # usually the same batch: deduplicated inside one INSERT); the other half are produced
    # after everything else, to a random partition (deduplicated against stored rows).
    records, late = [], []
    for i, mid in enumerate(ids):
        rec = {"key": b"k%d" % (i % 101),
               "value": json_value({"n": i, "id": mid, "pad": "p" * (i % 40)}),
               "headers": [("message_id", mid.encode()), ("event_type", b"DedupeTest")]}
        records.append(rec)
        if i in copied:
            if rng.random() < 0.5:
                records.append(dict(rec))
            else:
                late.append(dict(rec, partition=rng.randrange(PARTITIONS)))
    records += late
    assert len(records) == N + DUPLICATES

    before = ib_db.counters()
    ib_subscriptions(sub, [topic])
    produce(ib_producer, topic, records)
    ends = end_offsets(topic)
    assert sum(ends.values()) == N + DUPLICATES, ends

    ib_db.wait_rows(sub, N, timeout=120)
    ib_db.wait_caught_up(sub, ends, timeout=60)

    total, distinct, received, typed, consistent = ib_db.rows(
        "SELECT count(*), count(DISTINCT message_id), count(*) FILTER (WHERE status = 'received'),"
        " count(*) FILTER (WHERE event_type = 'DedupeTest'),"
        " count(*) FILTER (WHERE payload->>'id' = message_id AND raw_payload IS NULL)"
        " FROM eventbox.inbox WHERE subscription = %s", (sub,))[0]
    stored = {r[0] for r in ib_db.rows(
        "SELECT message_id FROM eventbox.inbox WHERE subscription = %s", (sub,))}
    lost = len(set(ids) - stored)
    extra = len(stored - set(ids))
    after = ib_db.counters()
    report("dedupe", messages=N, copies=DUPLICATES, rows=total, lost=lost, extra=extra,
           duplicates_counter=after["duplicates"] - before["duplicates"])

    assert (total, distinct) == (N, N), "rows / distinct ids: %d / %d" % (total, distinct)
    assert lost == 0 and extra == 0, "lost %d, unexpected %d" % (lost, extra)
    assert received == N and typed == N and consistent == N, (received, typed, consistent)
    assert after["pid"] == before["pid"], "the ingest worker restarted during the test"
    assert after["messages"] - before["messages"] >= N + DUPLICATES, (before, after)
    assert after["duplicates"] - before["duplicates"] >= DUPLICATES, (
        "eventbox.workers.duplicates grew by %d, expected at least %d"
        % (after["duplicates"] - before["duplicates"], DUPLICATES))


def test_batches_are_inserted_without_on_conflict_until_a_duplicate_comes(
        ib_db, ib_topic, ib_producer, ib_subscriptions):
    """After a batch without duplicates, the ingest worker inserts the next batch without ON
    CONFLICT, in a subtransaction. Duplicates it foresees (ids its last batches stored) go in
    apart with ON CONFLICT and leave the next batch on that way; an unforeseen one (an id stored
    by someone else) makes inbox_pkey refuse the batch, which is inserted again with ON CONFLICT
    (stored once, conflicts listed, offset advanced, no batch error). The batch after one with
    unforeseen duplicates goes straight to ON CONFLICT, and so does the worker's first batch in a
    lane (it stores below what the worker stored there: nothing).

    Which way a batch went shows in its rows' xmin: a subtransaction's rows have their own xid,
    the offsets row written by the same batch has the top transaction's. One record per batch
    (produced, then waited for), in one partition, so that every batch is one record."""
    topic = ib_topic("dedupe_new", 1)
    sub = ib_subscriptions(unique_name("dedupe_new"), [topic])
    run = uuid.uuid4().hex[:8]
    before = ib_db.counters()

    def record(mid, n):
        return {"key": b"k", "value": json_value({"id": mid, "n": n}),
                "headers": [("message_id", mid.encode())]}

    def send_one(rec):
        produce(ib_producer, topic, [rec])
        ib_db.wait_caught_up(sub, end_offsets(topic), timeout=60)

    def own_xid(mid):
        """Whether the row went in through a subtransaction (the insert without ON CONFLICT)."""
        return ib_db.value(
            "SELECT i.xmin::text <> o.xmin::text FROM eventbox.inbox i, eventbox.offsets o "
            "WHERE i.subscription = %s AND i.message_id = %s AND o.subscription = i.subscription",
            (sub, mid))

    first, second = "%s-first" % run, "%s-second" % run
    send_one(record(first, 1))
    assert not own_xid(first), "the worker's first batch in a lane was not inserted with ON CONFLICT"
    send_one(record(second, 2))
    assert own_xid(second), "a batch after a batch without duplicates was not inserted plainly"

    # Duplicates of ids the worker stored: foreseen, inserted apart with ON CONFLICT, which
    # leaves the stored row and lists the conflict (another payload); then an exact redelivery.
    send_one(record(second, 99))
    send_one(record(first, 1))
    third, fourth, fifth = "%s-third" % run, "%s-fourth" % run, "%s-fifth" % run
    send_one(record(third, 3))
    assert own_xid(third), "the batch after foreseen duplicates was not inserted plainly"
    # An id stored by someone else (here by hand, under another topic): not foreseen, refused by
    # inbox_pkey, then the batch inserted with ON CONFLICT (a conflict: another payload).
    other = "%s-other" % run
    ib_db.rows("INSERT INTO eventbox.inbox (subscription, message_id, topic, \"partition\", "
               "\"offset\", payload) SELECT subscription, %s, 'elsewhere', 0, 0, payload "
               "FROM eventbox.inbox WHERE subscription = %s AND message_id = %s RETURNING 1",
               (other, sub, first))
    send_one(record(other, 5))
    send_one(record(fourth, 4))
    assert not own_xid(fourth), "the batch after unforeseen duplicates was not inserted with ON CONFLICT"
    send_one(record(fifth, 6))
    assert own_xid(fifth), "a batch after a batch without duplicates was not inserted plainly"

    rows = ib_db.rows("SELECT message_id, (payload->>'n')::int, \"offset\" FROM eventbox.inbox "
                      "WHERE subscription = %s AND topic <> 'elsewhere' ORDER BY \"offset\"",
                      (sub,))
    assert rows == [(first, 1, 0), (second, 2, 1), (third, 3, 4), (fourth, 4, 6),
                    (fifth, 6, 7)], rows
    conflicts = ib_db.rows("SELECT message_id, stored_offset, \"offset\" FROM eventbox.conflicts "
                           "WHERE subscription = %s ORDER BY \"offset\"", (sub,))
    assert conflicts == [(second, 1, 2), (other, 0, 5)], conflicts
    errors = ib_db.value("SELECT count(*) FROM eventbox.ingest_errors WHERE subscription = %s",
                         (sub,))
    after = ib_db.counters()
    report("dedupe_new", rows=len(rows), conflicts=len(conflicts), errors=errors,
           duplicates_counter=after["duplicates"] - before["duplicates"])
    assert errors == 0
    assert after["pid"] == before["pid"], "the ingest worker restarted during the test"
    assert after["errors"] == before["errors"], (before, after)
    assert after["duplicates"] - before["duplicates"] == 3, (before, after)
