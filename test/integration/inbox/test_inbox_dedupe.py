"""Deduplication: every (subscription, message_id) is stored once, however often Kafka delivers
it (DESIGN.md section 3.2)."""
import random
import uuid

from inbox_support import end_offsets, json_value, produce, report, unique_name

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
