"""Message id, event type and headers of inbox rows (docs/design/guarantees.md):
  message id: header message_id, else CloudEvents ce_id, else the subscription's
              message_id_field (a top-level JSON string or integer), else the transport
              identity topic/partition/offset (counted in eventbox.workers.transport_ids);
  event type: header event_type, else ce_type, else the JSON field "type", else NULL;
  headers:    a jsonb object; bytes that are not UTF-8 as "\\x<hex>", null values as null.
(Header names are read through librdkafka's rd_kafka_header_get_all(), which returns them as C
strings: a name containing a NUL byte cannot come through whole, so none is used here.)"""
from inbox_kafka import (NULL_HEADER, end_offsets, header_json_name, json_value, produce,
                         raw_header_name)
from inbox_support import report, unique_name

T = "<transport>"  # expected message id: topic/partition/offset of the record


def h(name, value):
    return (name, value if isinstance(value, bytes) else value.encode())


# label, headers, value, expected id with message_id_field => 'order_id', expected id without
# it, expected event type
CASES = [
    ("all-headers", [h("ce_id", "ce-1"), h("message_id", "mid-1"), h("ce_type", "CeType1"),
                     h("event_type", "Type1")],
     {"type": "Json1", "order_id": "o-1"}, "mid-1", "mid-1", "Type1"),
    ("ce-only", [h("ce_id", "ce-2"), h("ce_type", "CeType2")],
     {"type": "Json2", "order_id": "o-2"}, "ce-2", "ce-2", "CeType2"),
    ("ce-id-beats-field", [h("ce_id", "ce-3")], {"order_id": "o-3"}, "ce-3", "ce-3", None),
    ("field-string", [], {"type": "Json4", "order_id": "o-4"}, "o-4", T, "Json4"),
    ("field-integer", [], {"order_id": 4711}, "4711", T, None),
    ("field-negative-integer", [], {"order_id": -42, "type": "Json6"}, "-42", T, "Json6"),
    ("field-float", [], {"order_id": 4.5}, T, T, None),
    ("field-empty-string", [], {"order_id": ""}, T, T, None),
    ("field-object", [], {"order_id": {"id": 1}}, T, T, None),
    ("field-not-top-level", [], {"data": {"order_id": "o-10", "type": "Nested"}}, T, T, None),
    ("empty-message-id-header", [h("message_id", ""), h("ce_id", "ce-11")], {"a": 1},
     "ce-11", "ce-11", None),
    ("non-utf8-message-id-header", [h("message_id", b"\xff\xfe")], {"order_id": "o-12"},
     "o-12", T, None),
    ("message-id-256-bytes", [h("message_id", "m" * 256)], {"a": 1}, "m" * 256, "m" * 256, None),
    ("message-id-257-bytes", [h("message_id", "n" * 257)], {"a": 1}, T, T, None),
    # An unusable candidate does not end the search: the next rule is tried.
    ("long-message-id-then-ce-id", [h("message_id", "n" * 300), h("ce_id", "ce-23")], {"a": 1},
     "ce-23", "ce-23", None),
    ("non-utf8-ce-id-then-field", [h("ce_id", b"\xc3\x28")], {"order_id": "o-24"}, "o-24", T,
     None),
    ("long-field-value", [], {"order_id": "f" * 257}, T, T, None),
    ("not-json", [], b"order_id=15", T, T, None),
    ("not-json-with-headers", [h("message_id", "mid-16"), h("event_type", "Type16")],
     b"\xff\x00 not json", "mid-16", "mid-16", "Type16"),
    ("empty-event-type-header", [h("event_type", ""), h("ce_type", "CeType17")],
     {"type": "Json17"}, T, T, "CeType17"),
    ("non-utf8-event-type-header", [h("event_type", b"\xff")], {"type": "Json18"}, T, T,
     "Json18"),
    ("type-not-a-string", [], {"type": ["x"]}, T, T, None),
    ("top-level-array", [], [1, 2, 3], T, T, None),
    ("headers-content", [h("message_id", "mid-21"), h("bin", b"\x00\x01\xff"),
                         h("nul", b"a\x00b"), ("nullvalue", NULL_HEADER),
                         h("txt", "h\u00e9llo \u4e16\u754c"), h("empty", b""),
                         (raw_header_name(b"\xc3\x28"), b"v"),
                         (raw_header_name(b"\xff\x01"), b"w")],
     {"a": 1}, "mid-21", "mid-21", None),
]


def expected_headers(headers):
    out = {}
    for name, value in headers:
        if name.startswith("\ue000"):
            name_bytes = bytes.fromhex(name.split(":", 1)[1])
        else:
            name_bytes = name.encode()
        out[header_json_name(name_bytes)] = (None if value == NULL_HEADER
                                             else header_json_name(value))
    return out


def test_message_id_event_type_and_headers(ib_db, ib_topic, ib_producer, ib_subscriptions):
    topic = ib_topic("rules", 2)
    by_field = unique_name("rules_field")
    plain = unique_name("rules_plain")
    before = ib_db.counters()
    ib_subscriptions(by_field, [topic], message_id_field="order_id")
    ib_subscriptions(plain, [topic])
    records = []
    for i, (label, headers, value, _, _, _) in enumerate(CASES):
        raw = value if isinstance(value, bytes) else json_value(value)
        records.append({"value": raw, "key": b"\x00key-" + label.encode() + b"\xff",
                        "headers": headers, "partition": i % 2})
    sent = produce(ib_producer, topic, records)
    ends = end_offsets(topic)
    for sub in (by_field, plain):
        ib_db.wait_rows(sub, len(CASES), timeout=60)
        ib_db.wait_caught_up(sub, ends, timeout=30)

    problems = []
    transport_rows = 0
    for sub, column in ((by_field, 3), (plain, 4)):
        rows = {r["message_id"]: r for r in ib_db.inbox_rows(
            sub, 'message_id, topic, "partition", "offset", key, headers, event_type')}
        wanted = set()
        for case, s in zip(CASES, sent):
            label, headers, _, _, _, event_type = case
            want_id = case[column]
            if want_id == T:
                want_id = "%s/%d/%d" % (s.topic, s.partition, s.offset)
                transport_rows += 1
            wanted.add(want_id)
            r = rows.get(want_id)
            if r is None:
                problems.append("%s %s: no row with message id %r" % (sub, label, want_id[:60]))
                continue
            if (r["topic"], r["partition"], r["offset"]) != (s.topic, s.partition, s.offset):
                problems.append("%s %s: row %r is from %s/%s/%s, expected %s/%s/%s" % (
                    sub, label, want_id[:60], r["topic"], r["partition"], r["offset"],
                    s.topic, s.partition, s.offset))
            if r["event_type"] != event_type:
                problems.append("%s %s: event_type %r, expected %r"
                                % (sub, label, r["event_type"], event_type))
            if r["headers"] != expected_headers(headers):
                problems.append("%s %s: headers %r, expected %r"
                                % (sub, label, r["headers"], expected_headers(headers)))
            if bytes(r["key"]) != records[sent.index(s)]["key"]:
                problems.append("%s %s: key %r" % (sub, label, bytes(r["key"])))
        if set(rows) != wanted:
            problems.append("%s: unexpected rows %r" % (sub, sorted(set(rows) - wanted)))
    after = ib_db.counters()
    report("message_rules", transport_id_rows=transport_rows,
           transport_ids_counter=after["transport_ids"] - before["transport_ids"])
    assert not problems, "\n".join(problems)
    assert after["pid"] == before["pid"], "the ingest worker restarted"
    assert after["transport_ids"] - before["transport_ids"] >= transport_rows, (
        "eventbox.workers.transport_ids grew by %d, %d rows got a transport id"
        % (after["transport_ids"] - before["transport_ids"], transport_rows))
