"""Change-data-capture envelopes (issue 28): message_id_rule 'debezium' and 'cockroachdb'. The
message id comes from where the change is in the source database's log, so that a connector
emitting the same changes again at new Kafka offsets (a restart from an older offset, a replayed
snapshot) stores nothing twice while a real change is stored; the operation is the event type;
Debezium tombstones and CockroachDB resolved timestamps are not stored, their offsets are, and
eventbox_ingest_skipped_total counts them. The envelopes follow the examples of Debezium's
PostgreSQL connector documentation and CockroachDB's changefeed messages page; they are produced
with kafka-python and confluent_kafka."""
import json

import confluent_kafka

from inbox_kafka import bootstrap, end_offsets, produce
from inbox_support import report, unique_name


def debezium(op, before, after, lsn, tx, ts_ms, snapshot="false", table="customers"):
    """A PostgreSQL connector change event (JSON converter, schemas enabled as by default)."""
    payload = {
        "before": before, "after": after,
        "source": {"version": "2.7.0.Final", "connector": "postgresql",
                   "name": "PostgreSQL_server", "ts_ms": 1559033904863, "snapshot": snapshot,
                   "db": "postgres", "sequence": json.dumps([str(lsn - 9), str(lsn)]),
                   "schema": "public", "table": table, "txId": tx, "lsn": lsn, "xmin": None},
        "op": op, "ts_ms": ts_ms}
    envelope = {"schema": {"type": "struct", "optional": False,
                           "name": "PostgreSQL_server.public.%s.Envelope" % table},
                "payload": payload}
    return json.dumps(envelope).encode()


def key(i):
    return json.dumps({"schema": {"type": "struct", "optional": False,
                                  "name": "PostgreSQL_server.public.customers.Key"},
                       "payload": {"id": i}}).encode()


def row(i, email):
    return {"id": i, "first_name": "Anne %d" % i, "last_name": "Kretchmar",
            "email": email}


def skipped(db, sub):
    return db.value("SELECT coalesce(sum(value), 0) FROM eventbox.metrics "
                    "WHERE name = 'eventbox_ingest_skipped_total' "
                    "AND labels->>'subscription' = %s", (sub,))


def types(db, sub):
    return sorted((r["event_type"], r["status"]) for r in db.inbox_rows(
        sub, "event_type, status"))


def test_debezium_replayed_snapshot_stores_nothing_twice(ib_db, ib_topic, ib_producer,
                                                         ib_subscriptions):
    topic = ib_topic("dbz", 2)
    sub = ib_subscriptions(unique_name("dbz"), [topic], message_id_rule="debezium")
    # A snapshot of three rows (op r, one position), then a create, an update, a delete and
    # its tombstone.
    snapshot = [{"key": key(i), "value": debezium("r", None, row(i, "a%d@x" % i), 24023128, 555,
                                                  1559033904000 + i, snapshot="true"),
                 "partition": i % 2} for i in (1, 2, 3)]
    changes = [
        {"key": key(4), "value": debezium("c", None, row(4, "a4@x"), 24023200, 556, 1559033905000),
         "partition": 0},
        {"key": key(1), "value": debezium("u", row(1, "a1@x"), row(1, "b1@x"), 24023300, 557,
                                          1559033906000), "partition": 1},
        {"key": key(2), "value": debezium("d", row(2, "a2@x"), None, 24023400, 558,
                                          1559033907000), "partition": 0},
        {"key": key(2), "value": None, "partition": 0},   # the delete's tombstone
    ]
    produce(ib_producer, topic, snapshot + changes)
    ib_db.wait_caught_up(sub, end_offsets(topic))
    assert ib_db.inbox_count(sub) == 6
    assert types(ib_db, sub) == [("create", "received"), ("delete", "received"),
                                 ("read", "received"), ("read", "received"),
                                 ("read", "received"), ("update", "received")]
    ids = {r["message_id"] for r in ib_db.inbox_rows(sub, "message_id")}
    assert all(i.startswith("postgresql:PostgreSQL_server:postgres.public.customers:lsn=")
               for i in ids), ids
    assert skipped(ib_db, sub) == 1

    # The connector restarts from an older offset and emits it all again (processed at another
    # time: ts_ms differs), through another client, at new offsets and other partitions.
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap(), "acks": "all"})
    for r in snapshot + changes:
        value = r["value"]
        if value is not None:
            doc = json.loads(value)
            doc["payload"]["ts_ms"] += 60000
            value = json.dumps(doc, indent=1).encode()
        p.produce(topic, key=r["key"], value=value, partition=1 - r["partition"])
    assert p.flush(60) == 0
    ib_db.wait_caught_up(sub, end_offsets(topic))
    assert ib_db.inbox_count(sub) == 6
    assert {r["message_id"] for r in ib_db.inbox_rows(sub, "message_id")} == ids
    assert skipped(ib_db, sub) == 2
    # Replays are duplicates, not conflicts.
    assert ib_db.value("SELECT count(*) FROM eventbox.conflicts WHERE subscription = %s",
                       (sub,)) == 0

    # A real update of row 1 (a new position) is stored.
    produce(ib_producer, topic, [{"key": key(1), "value": debezium(
        "u", row(1, "b1@x"), row(1, "c1@x"), 24023500, 559, 1559033908000), "partition": 1}])
    ib_db.wait_caught_up(sub, end_offsets(topic))
    assert ib_db.inbox_count(sub) == 7
    report("cdc_debezium", records=2 * len(snapshot + changes) + 1,
           stored=ib_db.inbox_count(sub), skipped=skipped(ib_db, sub))


def cockroach(after, updated, before="absent"):
    doc = {"after": after, "updated": updated}
    if before != "absent":
        doc["before"] = before
    return json.dumps(doc).encode()


def test_cockroachdb_changefeed(ib_db, ib_topic, ib_producer, ib_subscriptions):
    topic = ib_topic("office_dogs", 2)
    sub = ib_subscriptions(unique_name("crdb"), [topic], message_id_rule="cockroachdb")
    resolved = [{"value": json.dumps({"resolved": "1563898016883227000.0000000000"}).encode(),
                 "partition": p} for p in (0, 1)]
    changes = [
        {"key": b"[1]", "value": cockroach({"id": 1, "name": "Petee H"},
                                           "1563898016883227000.0000000000"), "partition": 0},
        {"key": b"[2]", "value": cockroach({"id": 2, "name": "Carl"},
                                           "1563898016883227000.0000000000"), "partition": 1},
        {"key": b"[1]", "value": cockroach({"id": 1, "name": "Petee"},
                                           "1563898032451434000.0000000000",
                                           before={"id": 1, "name": "Petee H"}), "partition": 0},
        {"key": b"[2]", "value": cockroach(None, "1563898040012534000.0000000000"),
         "partition": 1},
    ]
    produce(ib_producer, topic, changes[:2] + resolved + changes[2:] + resolved)
    ib_db.wait_caught_up(sub, end_offsets(topic))
    assert ib_db.inbox_count(sub) == 4
    assert types(ib_db, sub) == [("delete", "received"), ("update", "received"),
                                 ("upsert", "received"), ("upsert", "received")]
    assert skipped(ib_db, sub) == 4
    # At-least-once delivery: the changefeed emits some messages again after a restart.
    produce(ib_producer, topic, changes + resolved)
    ib_db.wait_caught_up(sub, end_offsets(topic))
    assert ib_db.inbox_count(sub) == 4
    assert skipped(ib_db, sub) == 6
    ids = sorted(r["message_id"] for r in ib_db.inbox_rows(sub, "message_id"))
    assert all(i.startswith("cockroachdb:%s:15638980" % topic) for i in ids), ids
    report("cdc_cockroachdb", records=14, stored=4, resolved=6)
