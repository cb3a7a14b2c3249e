"""Avro values stored from the decoder's tokens (src/registry/avro_json.hpp): the payload is the
value of the documented mapping (docs/guide/formats.md) whether its jsonb is built from the tokens
or, nested deeper than the 64 levels built from tokens, by jsonb_in from the text written from
them; the message id field is read from the tokens; strings that JSON text must escape come
through as they were written."""
import json
import pathlib
import sys

from inbox_kafka import end_offsets, produce
from inbox_support import unique_name

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "lib"))
from schema_registry import avro_encode, wire  # noqa: E402

TEXT = 'quote " backslash \\ newline \n tab \t control \x01 accents \u00e9 \u2603 \U0001F600'


def schema(depth):
    """A record with `deep`: long values in arrays nested `depth` deep."""
    items = "long"
    for _ in range(depth):
        items = {"type": "array", "items": items}
    return json.dumps({"type": "record", "name": "Deep", "namespace": "test.tokens", "fields": [
        {"name": "id", "type": "string"}, {"name": "text", "type": "string"},
        {"name": "deep", "type": items}, {"name": "x", "type": "double"},
        {"name": "m", "type": {"type": "map", "values": ["null", "string", "long"]}}]})


def nested(depth, leaf):
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def test_payload_is_the_mapping_from_tokens_or_from_their_text(
        ib_db, ib_topic, ib_producer, ib_subscriptions, registry):
    topic = ib_topic("avro_tokens", 1)
    shallow, deep = schema(3), schema(70)
    sid = registry.register(topic + "-shallow-value", shallow)
    did = registry.register(topic + "-deep-value", deep)
    since = ib_db.value("SELECT clock_timestamp()")
    sub = ib_subscriptions(unique_name("avro_tokens"), [topic], value_format="registry",
                           message_id_field="id")
    ib_db.wait_worker_reloaded(since)
    m = {"a": None, "b": "s", "c": 5}
    records = [
        {"value": wire(sid, avro_encode(shallow, {"id": "t-1", "text": TEXT, "deep": nested(3, 7),
                                                  "x": float("nan"), "m": m})), "partition": 0},
        {"value": wire(did, avro_encode(deep, {"id": "t-2", "text": TEXT, "deep": nested(70, 8),
                                               "x": 1.5, "m": {}})), "partition": 0},
    ]
    sent = produce(ib_producer, topic, records)
    ib_db.wait_rows(sub, len(records), timeout=60)
    ib_db.wait_caught_up(sub, end_offsets(topic), timeout=30)
    rows = {r["message_id"]: r for r in ib_db.inbox_rows(
        sub, "message_id, status, payload, raw_payload, event_type")}
    assert set(rows) == {"t-1", "t-2"}  # the id field, read from the tokens
    want = {
        "t-1": {"id": "t-1", "text": TEXT, "deep": nested(3, 7), "x": "NaN", "m": m},
        "t-2": {"id": "t-2", "text": TEXT, "deep": nested(70, 8), "x": 1.5, "m": {}},
    }
    for i, message_id in enumerate(["t-1", "t-2"]):
        r = rows[message_id]
        assert r["status"] == "received", r
        assert r["payload"] == want[message_id]
        assert bytes(r["raw_payload"]) == sent[i].value
        assert r["event_type"] == "test.tokens.Deep"
    # The deep payload is the jsonb jsonb_in makes of its JSON text.
    assert ib_db.value(
        "SELECT payload = %s::jsonb FROM eventbox.inbox WHERE subscription = %s "
        "AND message_id = 't-2'", (json.dumps(want["t-2"]), sub))
