"""Schema references (docs/guide/formats.md): Avro schemas whose named types are defined in other
subjects and Protobuf schemas importing other subjects' .proto files, written by independent
encoders (python3-avro with the referenced types in its Names; python3-protobuf classes generated
by protoc), decoded by the inbox and encoded by the relay byte for byte. Hostile references (a
missing subject, a cycle, deeper than the bound) leave the records 'unparsable' with their bytes
and the reason, and the rest goes on. Also: send() after set_topic_format() in one transaction
checks the transaction's own formats."""
import io
import json
import subprocess
import sys

import psycopg2
import pytest

from inbox_streams import (outbox_statuses, read_values, registry_subscription,
                           subscription_error)
from inbox_kafka import end_offsets, produce
from inbox_support import Db, poll
from schema_registry import wire

ADDRESS = json.dumps({
    "type": "record", "name": "Address", "namespace": "com.acme.common",
    "fields": [{"name": "city", "type": "string"},
               {"name": "kind", "type": {"type": "enum", "name": "Kind",
                                         "symbols": ["HOME", "WORK"]}}]})
CUSTOMER = json.dumps({
    "type": "record", "name": "Customer", "namespace": "com.acme.crm",
    "fields": [{"name": "name", "type": "string"},
               {"name": "home", "type": "com.acme.common.Address"},
               {"name": "others", "type": {"type": "array", "items": "com.acme.common.Address"}},
               {"name": "kind", "type": "com.acme.common.Kind"}]})


def avro_schema(main, *referenced):
    """`main` parsed by python3-avro with the referenced schemas' named types (its own way of
    resolving references, independent of the extension's)."""
    import avro.name
    import avro.schema
    names = avro.name.Names()
    for r in referenced:
        avro.schema.make_avsc_object(json.loads(r), names)
    return avro.schema.make_avsc_object(json.loads(main), names)


def avro_bytes(schema, datum):
    import avro.io
    out = io.BytesIO()
    avro.io.DatumWriter(schema).write(datum, avro.io.BinaryEncoder(out))
    return out.getvalue()


def avro_read(schema, data):
    import avro.io
    return avro.io.DatumReader(schema).read(avro.io.BinaryDecoder(io.BytesIO(data)))


def customer(i):
    return {"name": "c%d" % i, "home": {"city": "Lyon", "kind": "HOME"},
            "others": [{"city": "Oslo", "kind": "WORK"}] * (i % 3), "kind": "WORK"}


def register_customer(registry, prefix, subject):
    registry.register(prefix + "-address", ADDRESS)
    return registry.register(subject, CUSTOMER, references=[
        {"name": "com.acme.common.Address", "subject": prefix + "-address", "version": 1}])


def rows_by_id(ib_db, sub):
    return {r["message_id"]: r for r in ib_db.inbox_rows(
        sub, "message_id, status, payload, raw_payload, event_type, last_error")}


def test_avro_references_decode_and_encode(ib_db, ib_topic, ib_producer, ib_subscriptions,
                                           registry):
    topic, out = ib_topic("avrorefs", 1), ib_topic("avrorefs_out", 1)
    sid = register_customer(registry, topic, topic + "-value")
    schema = avro_schema(CUSTOMER, ADDRESS)
    sub = registry_subscription(ib_db, ib_subscriptions, "avrorefs", [topic])
    values = [wire(sid, avro_bytes(schema, customer(i))) for i in range(6)]
    produce(ib_producer, topic, [{"value": v, "headers": [("message_id", b"a%d" % i)]}
                                 for i, v in enumerate(values)])
    ib_db.wait_rows(sub, len(values), timeout=60)
    rows = rows_by_id(ib_db, sub)
    for i, v in enumerate(values):
        r = rows["a%d" % i]
        assert r["status"] == "received", r
        assert r["payload"] == customer(i)
        assert r["event_type"] == "com.acme.crm.Customer"
        assert bytes(r["raw_payload"]) == v
    # The referenced subject version was fetched once.
    assert registry.count("/subjects/%s-address/versions/1" % topic) == 1
    # Version 2 of the subject references the same version of the address: it is not fetched
    # again (a subject version never changes).
    v2 = json.dumps(dict(json.loads(CUSTOMER), fields=json.loads(CUSTOMER)["fields"] + [
        {"name": "vip", "type": "boolean", "default": False}]))
    sid2 = registry.register(topic + "-value", v2, references=[
        {"name": "com.acme.common.Address", "subject": topic + "-address", "version": 1}])
    assert sid2 != sid
    value2 = wire(sid2, avro_bytes(avro_schema(v2, ADDRESS), dict(customer(9), vip=True)))
    produce(ib_producer, topic, [{"value": value2, "headers": [("message_id", b"a9")]}])
    ib_db.wait_rows(sub, len(values) + 1, timeout=60)
    assert rows_by_id(ib_db, sub)["a9"]["payload"] == dict(customer(9), vip=True)
    assert registry.count("/schemas/ids/%d" % sid2) == 1
    assert registry.count("/subjects/%s-address/versions/1" % topic) == 1
    # The relay encodes with a referencing subject: python3-avro's bytes, and its decoder reads
    # them back.
    oid = register_customer(registry, topic, out + "-value")
    ib_db.rows("SELECT eventbox.set_topic_format(%s, 'registry')", (out,))
    for i in range(4):
        ib_db.rows("SELECT eventbox.send(%s, %s::jsonb, key => 'k')",
                   (out, json.dumps(customer(i))))
    got = read_values(out, 4, timeout=90)
    for i, v in enumerate(got):
        assert v == wire(oid, avro_bytes(schema, customer(i))), i
        assert avro_read(schema, v[5:]) == customer(i)


PROTO_MONEY = """syntax = "proto3";
package acme.common;
message Money { string currency = 1; int64 units = 2; int32 nanos = 3; }
"""
PROTO_ORDER = """syntax = "proto3";
package acme.shop;
import "acme/common/money.proto";
import "google/protobuf/timestamp.proto";
message Order {
  string id = 1;
  acme.common.Money total = 2;
  repeated acme.common.Money parts = 3;
  google.protobuf.Timestamp at = 4;
}
"""


@pytest.fixture(scope="module")
def order_pb2(tmp_path_factory):
    """protoc's Python classes of PROTO_ORDER and the file it imports."""
    root = tmp_path_factory.mktemp("protorefs")
    (root / "acme" / "common").mkdir(parents=True)
    (root / "acme" / "shop").mkdir(parents=True)
    (root / "acme" / "common" / "money.proto").write_text(PROTO_MONEY)
    (root / "acme" / "shop" / "order.proto").write_text(PROTO_ORDER)
    subprocess.run(["protoc", "-I", str(root), "--python_out", str(root),
                    "acme/common/money.proto", "acme/shop/order.proto"], check=True)
    sys.path.insert(0, str(root))
    from acme.shop import order_pb2 as module
    return module


def register_order(registry, prefix, subject):
    registry.register(prefix + "-money", PROTO_MONEY, "PROTOBUF")
    return registry.register(subject, PROTO_ORDER, "PROTOBUF", references=[
        {"name": "acme/common/money.proto", "subject": prefix + "-money", "version": 1}])


def test_protobuf_imports_decode_and_encode(ib_db, ib_topic, ib_producer, ib_subscriptions,
                                            registry, order_pb2):
    pb = order_pb2
    topic, out = ib_topic("protorefs", 1), ib_topic("protorefs_out", 1)
    sid = register_order(registry, topic, topic + "-value")
    o = pb.Order(id="o1")
    o.total.currency, o.total.units = "EUR", 12
    o.parts.add(currency="EUR", units=5, nanos=500000000)
    o.at.seconds = 1714564800
    value = wire(sid, b"\x00" + o.SerializeToString())
    sub = registry_subscription(ib_db, ib_subscriptions, "protorefs", [topic])
    produce(ib_producer, topic, [{"value": value, "headers": [("message_id", b"p1")]}])
    ib_db.wait_rows(sub, 1, timeout=60)
    r = rows_by_id(ib_db, sub)["p1"]
    as_json = {"id": "o1", "total": {"currency": "EUR", "units": "12", "nanos": 0},
               "parts": [{"currency": "EUR", "units": "5", "nanos": 500000000}],
               "at": "2024-05-01T12:00:00Z"}
    assert r["status"] == "received", r
    assert r["payload"] == as_json and r["event_type"] == "acme.shop.Order"
    assert bytes(r["raw_payload"]) == value
    # The relay: what protoc's classes serialize (deterministically) for the same message.
    oid = register_order(registry, topic, out + "-value")
    ib_db.rows("SELECT eventbox.set_topic_format(%s, 'registry')", (out,))
    ib_db.rows("SELECT eventbox.send(%s, %s::jsonb, key => 'k')", (out, json.dumps(as_json)))
    (got,) = read_values(out, 1, timeout=90)
    assert got == wire(oid, b"\x00" + o.SerializeToString(deterministic=True))
    decoded = pb.Order()
    decoded.ParseFromString(got[6:])
    assert decoded == o


def test_hostile_references_are_unparsable_and_nothing_is_lost(
        ib_db, ib_topic, ib_producer, ib_subscriptions, registry):
    topic = ib_topic("badrefs", 1)
    good = register_customer(registry, topic, topic + "-value")
    leaf = json.dumps({"type": "record", "name": "Leaf", "namespace": "t",
                       "fields": [{"name": "v", "type": "int"}]})
    # A reference to a subject that does not exist (404).
    missing = registry.register(topic + "-missing", CUSTOMER, references=[
        {"name": "com.acme.common.Address", "subject": topic + "-nope", "version": 1}])
    # A cycle: a refers to b, b to a.
    registry.register(topic + "-a", leaf, references=[
        {"name": "b", "subject": topic + "-b", "version": 1}])
    registry.register(topic + "-b", leaf.replace("Leaf", "Leaf2"), references=[
        {"name": "a", "subject": topic + "-a", "version": 1}])
    cycle = registry.subjects[topic + "-a"][0]
    # A chain of references one deeper than the bound (8).
    for k in range(10, 0, -1):
        refs = [] if k == 10 else [{"name": "d%d" % (k + 1), "subject": "%s-d%d" % (topic, k + 1),
                                    "version": 1}]
        registry.register("%s-d%d" % (topic, k), leaf.replace("Leaf", "D%d" % k), references=refs)
    deep = registry.register(topic + "-deep", leaf, references=[
        {"name": "d1", "subject": topic + "-d1", "version": 1}])
    sub = registry_subscription(ib_db, ib_subscriptions, "badrefs", [topic])
    schema = avro_schema(CUSTOMER, ADDRESS)
    body = avro_bytes(schema, customer(1))
    cases = [("missing", wire(missing, body),
              'reference "com.acme.common.Address" \\(subject "%s-nope" version 1\\) is not in '
              "the schema registry" % topic),
             ("cycle", wire(cycle, b"\x02"), "references form a cycle"),
             ("deep", wire(deep, b"\x02"), "is nested deeper than 8 references"),
             ("good", wire(good, body), None)]
    produce(ib_producer, topic, [{"value": v, "headers": [("message_id", label.encode())]}
                                 for label, v, _ in cases])
    ib_db.wait_rows(sub, len(cases), timeout=60)
    ib_db.wait_caught_up(sub, end_offsets(topic), timeout=30)
    rows = rows_by_id(ib_db, sub)
    import re
    for label, value, reason in cases:
        r = rows[label]
        assert bytes(r["raw_payload"]) == value, label
        if reason is None:
            assert r["status"] == "received" and r["payload"] == customer(1), r
            continue
        assert r["status"] == "unparsable" and r["payload"] is None, (label, r)
        assert re.search(reason, r["last_error"]), (label, r["last_error"])
    # The relay: a subject whose reference is missing fails its rows with the reason.
    out = ib_topic("badrefs_out", 1)
    ib_db.rows("SELECT eventbox.set_topic_format(%s, 'registry', value_subject => %s)",
               (out, topic + "-missing"))
    ib_db.rows("SELECT eventbox.send(%s, %s::jsonb)", (out, json.dumps(customer(1))))
    failed = poll(lambda: [r for r in outbox_statuses(ib_db, out) if r[0] == "failed"], 90,
                  "the row to fail")
    assert 'subject "%s-nope" version 1) is not in the schema registry' % topic in failed[0][2]


def test_a_reference_the_registry_cannot_serve_pauses_the_subscription(
        ib_db, ib_topic, ib_producer, ib_subscriptions, registry):
    """A referenced version answered 503 is an outage, not a refusal: the subscription waits
    (shown in subscription_errors), and its record is stored decoded once the registry serves
    the reference again."""
    topic = ib_topic("refdown", 1)
    sid = register_customer(registry, topic, topic + "-value")
    registry.failing = "/subjects/%s-address/" % topic
    sub = registry_subscription(ib_db, ib_subscriptions, "refdown", [topic])
    value = wire(sid, avro_bytes(avro_schema(CUSTOMER, ADDRESS), customer(2)))
    produce(ib_producer, topic, [{"value": value, "headers": [("message_id", b"d1")]}])
    error = poll(lambda: subscription_error(ib_db, sub), 60, "the subscription's error")
    assert 'reference subject "%s-address" version 1 of schema id %d: HTTP status 503' % (
        topic, sid) in error, error
    assert ib_db.inbox_rows(sub, "message_id") == []
    registry.failing = None
    ib_db.wait_rows(sub, 1, timeout=90)
    (row,) = ib_db.inbox_rows(sub, "status, payload, raw_payload")
    assert row["status"] == "received" and row["payload"] == customer(2), row
    assert bytes(row["raw_payload"]) == value


def sent_in_transaction(db, statements):
    """Runs `statements` in one transaction (rolled back): None when the last one (a send())
    succeeded, else its SQLSTATE."""
    conn = db.conn()
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            for sql, args in statements:
                cur.execute(sql, args)
        return None
    except psycopg2.Error as e:
        return e.pgcode
    finally:
        conn.rollback()
        conn.autocommit = True


def test_send_checks_the_formats_its_own_transaction_set(ib_db, ib_topic, registry):
    fmt, plain = ib_topic("txformat", 1), ib_topic("txformat_plain", 1)
    subject = fmt + "-value"
    registry.register(subject, json.dumps({"type": "record", "name": "R",
                                           "fields": [{"name": "id", "type": "string"}]}))
    ib_db.rows("SELECT eventbox.set_topic_format(%s, 'registry')", (fmt,))
    session = Db()
    bad = ("SELECT eventbox.send(%s, '{\"id\": 1}'::jsonb)", None)

    def send_bad(topic):
        return (bad[0], (topic,))

    # The session's backend gets the schema (its first send()s start the fetch).
    poll(lambda: sent_in_transaction(session, [send_bad(fmt)]), 30, "send() to know the schema")
    # Reset in the transaction: its send() goes through.
    assert sent_in_transaction(session, [
        ("SELECT eventbox.reset_topic_format(%s)", (fmt,)), send_bad(fmt)]) is None
    # Set in the transaction (the same subject: its schema is at hand): refused.
    assert sent_in_transaction(session, [
        ("SELECT eventbox.set_topic_format(%s, 'registry', value_subject => %s)",
         (plain, subject)), send_bad(plain)]) == "22023"
    # A rollback to a savepoint undoes the reset: refused again.
    assert sent_in_transaction(session, [
        ("SAVEPOINT s", None), ("SELECT eventbox.reset_topic_format(%s)", (fmt,)),
        ("ROLLBACK TO SAVEPOINT s", None), send_bad(fmt)]) == "22023"
    # After the rolled-back transactions, the committed formats again.
    assert sent_in_transaction(session, [send_bad(fmt)]) == "22023"
    assert sent_in_transaction(session, [send_bad(plain)]) is None
    session.close()
