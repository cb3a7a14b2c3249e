"""Message ids from content and conflicting duplicates (issue 17).

message_id_rule => 'fingerprint': the id is the SHA-256 of the value in RFC 8785 canonical JSON
(raw bytes when it is not JSON), whatever the headers say, so that two producers publishing the
same logical event without shared ids are deduplicated. Conflicting duplicates: a record whose id
is stored already with another payload keeps the stored row, is listed in eventbox.conflicts
once and counted by eventbox_ingest_conflicts_total. Records come from kafka-python and
confluent_kafka, two independent clients."""
import hashlib
import json

import confluent_kafka

from inbox_kafka import bootstrap, end_offsets, produce
from inbox_support import report, unique_name


def canonical(obj):
    """RFC 8785 for the values used here (strings, integers, and floats whose repr is
    ECMAScript's): sorted keys, no whitespace, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha(data):
    return hashlib.sha256(data).hexdigest()


def confluent_produce(topic, records):
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap(), "acks": "all",
                                  "client.id": "eventbox-fingerprint-test"})
    for r in records:
        p.produce(topic, value=r["value"], headers=r.get("headers", []), partition=r["partition"])
    assert p.flush(60) == 0


def conflicts_metric(db, sub):
    return db.value("SELECT coalesce(sum(value), 0) FROM eventbox.metrics "
                    "WHERE name = 'eventbox_ingest_conflicts_total' "
                    "AND labels->>'subscription' = %s", (sub,))


def test_fingerprint_dedupes_two_producers(ib_db, ib_topic, ib_producer, ib_subscriptions):
    topic = ib_topic("fingerprint", 2)
    by_content = ib_subscriptions(unique_name("fp"), [topic], message_id_rule="fingerprint")
    by_header = ib_subscriptions(unique_name("fpdefault"), [topic])
    event = {"order": 42, "total": 99.5, "lines": [{"sku": "é-1", "qty": 2}], "note": None}
    # kafka-python: compact, its own id; confluent_kafka: other key order, whitespace, number
    # spelling and id, on the other partition.
    produce(ib_producer, topic, [
        {"value": json.dumps(event, separators=(",", ":")).encode(), "partition": 0,
         "headers": [("message_id", b"producer-a-1"), ("event_type", b"OrderPlaced")]},
        {"value": b"raw \xff bytes", "partition": 0, "headers": [("message_id", b"raw-1")]},
        {"value": json.dumps(dict(event, total=99.75)).encode(), "partition": 0,
         "headers": [("message_id", b"producer-a-2")]},
    ])
    # The first spelling is stored before the second arrives (the one stored first is kept).
    ib_db.wait_rows(by_content, 3)
    confluent_produce(topic, [
        {"value": ('{ "note": null, "lines": [ { "qty": 2.0, "sku": "\\u00e9-1" } ],'
                   ' "total": 9.95e1, "order": 42 }').encode(), "partition": 1,
         "headers": [("message_id", b"producer-b-77"), ("event_type", b"OrderPlaced")]},
        {"value": b"raw \xff bytes", "partition": 1, "headers": [("message_id", b"raw-2")]},
    ])
    ends = end_offsets(topic)
    ib_db.wait_caught_up(by_content, ends)
    ib_db.wait_caught_up(by_header, ends)

    rows = {r["message_id"]: r for r in ib_db.inbox_rows(
        by_content, "message_id, topic, \"partition\", \"offset\", payload, event_type, status")}
    want = {sha(canonical(event)): (0, 0), sha(b"raw \xff bytes"): (0, 1),
            sha(canonical(dict(event, total=99.75))): (0, 2)}
    assert {m: (r["partition"], r["offset"]) for m, r in rows.items()} == want, rows
    assert rows[sha(canonical(event))]["event_type"] == "OrderPlaced"
    # The default rule stores every producer's id; the fingerprint rule the event once.
    assert ib_db.inbox_count(by_header) == 5
    # Same payload, other spelling: duplicates, not conflicts.
    assert ib_db.value("SELECT count(*) FROM eventbox.conflicts WHERE subscription = %s",
                       (by_content,)) == 0
    report("fingerprint", records=5, stored_by_fingerprint=len(rows),
           stored_by_header=ib_db.inbox_count(by_header))


def test_conflicting_duplicates_are_recorded_once(ib_db, ib_topic, ib_producer, ib_subscriptions):
    topic = ib_topic("conflicts", 1)
    sub = ib_subscriptions(unique_name("conflicts"), [topic])

    def rec(mid, value):
        return {"value": value, "partition": 0, "headers": [("message_id", mid.encode())]}

    # One batch: c-1 stored at offset 0; offset 1 conflicts inside the same INSERT; offset 2 is
    # the same JSON spelled otherwise (a plain duplicate); c-2 is new; c-3 is not JSON and
    # conflicts by its bytes at offset 5, while offset 6 repeats it exactly.
    produce(ib_producer, topic, [
        rec("c-1", b'{"v":1,"w":[1,2]}'), rec("c-1", b'{"v":2,"w":[1,2]}'),
        rec("c-1", b'{ "w" : [1, 2], "v" : 1.0 }'), rec("c-2", b'{"v":1}'),
        rec("c-3", b"not json"), rec("c-3", b"not JSON"), rec("c-3", b"not json"),
    ])
    ends = end_offsets(topic)
    ib_db.wait_caught_up(sub, ends)
    # A later batch: conflicts with the stored row.
    produce(ib_producer, topic, [rec("c-1", b'{"v":3}'), rec("c-2", b'{"v":1}')])
    ends = end_offsets(topic)
    ib_db.wait_caught_up(sub, ends)

    kept = {r["message_id"]: (r["offset"], r["payload"], r["raw_payload"] and bytes(r["raw_payload"]))
            for r in ib_db.inbox_rows(sub, "message_id, \"offset\", payload, raw_payload")}
    assert kept == {"c-1": (0, {"v": 1, "w": [1, 2]}, None), "c-2": (3, {"v": 1}, None),
                    "c-3": (4, None, b"not json")}, kept
    conflicts = ib_db.rows(
        "SELECT message_id, stored_topic = topic, stored_partition, stored_offset, \"partition\","
        " \"offset\", detected_at IS NOT NULL FROM eventbox.conflicts WHERE subscription = %s"
        " ORDER BY \"offset\"", (sub,))
    assert conflicts == [("c-1", True, 0, 0, 0, 1, True), ("c-3", True, 0, 4, 0, 5, True),
                         ("c-1", True, 0, 0, 0, 7, True)], conflicts
    assert conflicts_metric(ib_db, sub) == 3

    # Reading the records again (replay) finds the same conflicts: listed and counted once.
    ib_db.rows("SELECT eventbox.replay(%s, %s, 0, 0)", (sub, topic))
    ib_db.wait_caught_up(sub, ends, timeout=60)
    produce(ib_producer, topic, [rec("c-9", b'{"v":9}')])  # a marker after the replay
    ib_db.wait_rows(sub, 4)
    assert ib_db.value("SELECT count(*) FROM eventbox.conflicts WHERE subscription = %s",
                       (sub,)) == 3
    assert conflicts_metric(ib_db, sub) == 3
    report("conflicts", records=10, conflicts=3)


def test_foreseen_duplicates_keep_the_fast_insert(ib_db, ib_topic, ib_producer, ib_subscriptions):
    """Duplicates on the insert without ON CONFLICT (issue 31): after a batch of new ids, a batch
    holding repeats of its own records (the same bytes; equal JSON spelled otherwise; another
    payload) and of records of the earlier batch (the same; another payload) stores each id
    once, lists exactly the conflicts, and stays on that insert (its new rows inserted by a
    subtransaction). Reading it all again (replay) adds nothing."""
    topic = ib_topic("foreseen", 1)
    sub = ib_subscriptions(unique_name("foreseen"), [topic])

    def rec(mid, value):
        return {"value": value, "partition": 0, "headers": [("message_id", mid.encode())]}

    # Offsets 0-1: the earlier batch (its lane's first batch goes with ON CONFLICT), 2: a batch
    # of a new id (inserted without ON CONFLICT).
    produce(ib_producer, topic, [rec("e-1", b'{"v":1}'), rec("e-2", b'{"v":2}')])
    ib_db.wait_caught_up(sub, end_offsets(topic))
    produce(ib_producer, topic, [rec("e-3", b'{"v":3}')])
    ib_db.wait_caught_up(sub, end_offsets(topic))
    # Offsets 3-12, one produce call: repeats inside the batch and of stored rows.
    produce(ib_producer, topic, [
        rec("f-1", b'{"v":1}'), rec("f-2", b'{"v":2}'), rec("f-1", b'{"v":1}'),   # 3, 4, 5
        rec("f-2", b'{ "v" : 2.0 }'), rec("f-3", b'{"v":3}'), rec("e-1", b'{"v":1}'),  # 6-8
        rec("f-3", b'{"v":33}'), rec("e-2", b'{"v":22}'), rec("e-3", b'{"v":3}'),  # 9, 10, 11
        rec("f-4", b'{"v":4}'),  # 12
    ])
    ends = end_offsets(topic)
    ib_db.wait_caught_up(sub, ends)

    kept = {r["message_id"]: (r["offset"], r["payload"])
            for r in ib_db.inbox_rows(sub, "message_id, \"offset\", payload")}
    assert kept == {"e-1": (0, {"v": 1}), "e-2": (1, {"v": 2}), "e-3": (2, {"v": 3}),
                    "f-1": (3, {"v": 1}), "f-2": (4, {"v": 2}), "f-3": (7, {"v": 3}),
                    "f-4": (12, {"v": 4})}, kept
    conflicts = ib_db.rows(
        "SELECT message_id, stored_offset, \"offset\" FROM eventbox.conflicts "
        "WHERE subscription = %s ORDER BY \"offset\"", (sub,))
    assert conflicts == [("f-3", 7, 9), ("e-2", 1, 10)], conflicts
    assert conflicts_metric(ib_db, sub) == 2
    # The new ids of the batch went in through a subtransaction (the insert without ON
    # CONFLICT): their xmin is not the offsets row's.
    plain = ib_db.value(
        "SELECT bool_and(i.xmin::text <> o.xmin::text) FROM eventbox.inbox i, eventbox.offsets o "
        "WHERE i.subscription = %s AND i.message_id LIKE 'f-%%' AND o.subscription = i.subscription",
        (sub,))
    assert plain, "a batch with foreseen duplicates was not inserted without ON CONFLICT"

    ib_db.rows("SELECT eventbox.replay(%s, %s, 0, 0)", (sub, topic))
    ib_db.wait_caught_up(sub, ends, timeout=60)
    produce(ib_producer, topic, [rec("f-9", b'{"v":9}')])  # a marker after the replay
    ib_db.wait_rows(sub, 8)
    assert ib_db.inbox_count(sub) == 8
    assert ib_db.value("SELECT count(*) FROM eventbox.conflicts WHERE subscription = %s",
                       (sub,)) == 2
    report("foreseen", records=14, conflicts=2)
