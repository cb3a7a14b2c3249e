"""value_format 'registry' with JSON Schema (docs/guide/formats.md): the records' JSON text is
stored as sent, the schema read for its name (title or $id), text that is not JSON stored
'unparsable' with its bytes; a schema's references to other subjects are not needed."""
import json
import time

from inbox_streams import registry_subscription
from inbox_kafka import produce
from schema_registry import wire

def test_json_schema_records(ib_db, ib_topic, ib_producer, ib_subscriptions, registry):
    topic = ib_topic("jsonschema", 1)
    sid = registry.register(topic + "-value", json.dumps(
        {"$schema": "http://json-schema.org/draft-07/schema#", "title": "Payment",
         "type": "object", "properties": {"id": {"type": "string"}}}), "JSON")
    sub = registry_subscription(ib_db, ib_subscriptions, "jsonschema", [topic])
    values = [wire(sid, b'{"id":"p1","amount":3}'), wire(sid, b'{"id": nope}')]
    produce(ib_producer, topic, [{"value": v, "headers": [("message_id", b"j%d" % k)]}
                                 for k, v in enumerate(values)])
    ib_db.wait_rows(sub, 2, timeout=60)
    rows = {r["message_id"]: r for r in ib_db.inbox_rows(
        sub, "message_id, status, payload, raw_payload, event_type, last_error")}
    assert rows["j0"]["payload"] == {"id": "p1", "amount": 3}
    assert rows["j0"]["event_type"] == "Payment"
    assert bytes(rows["j0"]["raw_payload"]) == values[0]
    assert rows["j1"]["status"] == "unparsable" and "not valid JSON" in rows["j1"]["last_error"]
    assert bytes(rows["j1"]["raw_payload"]) == values[1]


def test_json_schema_with_references_to_other_subjects(
        ib_db, ib_topic, ib_producer, ib_subscriptions, registry):
    """A JSON Schema whose $ref names another subject (the registry's `references`): its records
    are stored as sent, the schema read for its name, the reference not needed."""
    topic = ib_topic("jsonrefs", 1)
    registry.register("jsonrefs-address", json.dumps(
        {"$id": "address.json", "type": "object",
         "properties": {"city": {"type": "string"}}}), "JSON")
    sid = 910000 + int(time.time()) % 10000
    registry.add_id(sid, json.dumps(
        {"title": "Customer", "type": "object",
         "properties": {"home": {"$ref": "address.json"}}}), "JSON",
        references=[{"name": "address.json", "subject": "jsonrefs-address", "version": 1}])
    sub = registry_subscription(ib_db, ib_subscriptions, "jsonrefs", [topic])
    value = wire(sid, b'{"home":{"city":"Lyon"}}')
    produce(ib_producer, topic, [{"value": value, "headers": [("message_id", b"r1")]}])
    ib_db.wait_rows(sub, 1, timeout=60)
    (row,) = ib_db.inbox_rows(sub, "status, payload, event_type, raw_payload, last_error")
    assert row["status"] == "received", row
    assert row["payload"] == {"home": {"city": "Lyon"}} and row["event_type"] == "Customer"
    assert bytes(row["raw_payload"]) == value
