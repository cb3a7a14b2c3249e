"""Values that are not JSON jsonb can store are kept byte for byte (docs/reference/bad-input.md):
status 'unparsable', payload NULL, raw_payload = the exact bytes, the reason in last_error.
JSON that jsonb does accept must land in payload."""
import re

import psycopg2

from inbox_kafka import end_offsets, produce
from inbox_support import unique_name

# (label, value, regex the reason in last_error must match, case-insensitive)
UNPARSABLE = [
    ("invalid-utf8", b"\xff\xfe\xfd not text \x80\x81", r"utf-?8"),
    ("invalid-utf8-in-json-string", b'{"a":"\xc3\x28"}', r"utf-?8"),
    ("overlong-utf8", b'{"a":"\xc0\xaf"}', r"utf-?8"),
    ("utf8-encoded-surrogate", b'"\xed\xa0\x80"', r"utf-?8"),
    ("beyond-u10ffff", b'"\xf4\x90\x80\x80"', r"utf-?8"),
    ("latin1", "{\"name\":\"Jos\xe9\"}".encode("latin-1"), r"utf-?8"),
    ("broken-json-truncated", b'{"a": 1,', r"json"),
    ("broken-json-missing-value", b'{"a":}', r"json"),
    ("broken-json-single-quotes", b"{'a': 1}", r"json"),
    ("broken-json-bare-word", b"tru", r"json"),
    ("broken-json-trailing-garbage", b'{"a":1} x', r"json"),
    ("broken-json-two-documents", b'{"a":1}{"b":2}', r"json"),
    ("broken-json-nan", b'{"a":NaN}', r"json"),
    ("broken-json-lone-surrogate-escape", b'{"a":"\\ud800"}', r"json|surrogate|unicode"),
    ("broken-json-raw-control-char", b'{"a":"x\ty"}', r"json"),
    ("plain-text", b"hello world", r"json"),
    ("empty", b"", r"empty"),
    ("null-value", None, r"null|tombstone"),
    ("nul-byte", b"\x00", r"utf-?8|nul|\\u0000|json"),
    ("nul-bytes-binary", b"\x00\x01\x02\x00\xff\x00", r"utf-?8|nul|\\u0000|json"),
    ("nul-inside-json", b'{"a":"x\x00y"}', r"utf-?8|nul|\\u0000|json"),
    ("json-u0000-escape", b'{"a":"\\u0000"}', r"u0000|nul"),
    ("json-u0000-escape-in-key", b'{"\\u0000":1}', r"u0000|nul"),
    ("utf8-bom-then-json", b'\xef\xbb\xbf{"a":1}', r"json"),
    ("number-out-of-numeric-range", b'{"n":1e999999}', r"json|numeric|range"),
    ("negative-exponent-out-of-range", b'{"n":1e-999999}', r"json|numeric|range"),
]


def test_unparsable_values_round_trip_exactly(ib_db, ib_topic, ib_producer, ib_subscriptions):
    topic = ib_topic("unparsable", 2)
    sub = unique_name("unparsable")
    records = []
    for i, (label, value, _) in enumerate(UNPARSABLE):
        records.append({"value": value, "key": ("key-%s" % label).encode(),
                        "headers": [("message_id", label.encode())], "partition": i % 2})
    ib_subscriptions(sub, [topic])
    produce(ib_producer, topic, records)
    ib_db.wait_rows(sub, len(records), timeout=60)
    ib_db.wait_caught_up(sub, end_offsets(topic), timeout=30)

    rows = {r["message_id"]: r for r in ib_db.inbox_rows(
        sub, "message_id, key, status, payload, raw_payload, last_error")}
    assert sorted(rows) == sorted(label for label, _, _ in UNPARSABLE)
    problems = []
    for label, value, reason in UNPARSABLE:
        r = rows[label]
        raw = None if r["raw_payload"] is None else bytes(r["raw_payload"])
        if r["status"] != "unparsable":
            problems.append("%s: status %r (payload %r)" % (label, r["status"], r["payload"]))
            continue
        if r["payload"] is not None:
            problems.append("%s: payload %r, expected NULL" % (label, r["payload"]))
        if raw != value:
            problems.append("%s: raw_payload %r != sent %r" % (label, raw, value))
        if bytes(r["key"]) != ("key-%s" % label).encode():
            problems.append("%s: key %r" % (label, bytes(r["key"])))
        if not r["last_error"] or not re.search(reason, r["last_error"], re.I):
            problems.append("%s: last_error %r does not give the reason (/%s/)"
                            % (label, r["last_error"], reason))
    assert not problems, "\n".join(problems)


# JSON that PostgreSQL's jsonb accepts: stored in payload, status 'received'.
JSONB_ACCEPTS = [
    ("object", b'{"a":1,"b":[true,false,null],"c":{"d":"e"}}'),
    ("top-level-number", b"42"),
    ("top-level-string", b'"just a string"'),
    ("top-level-null", b"null"),
    ("top-level-true", b"true"),
    ("empty-array", b"[]"),
    ("surrounding-whitespace", b' \n\t{"a":1}\r\n '),
    ("unicode", '{"text":"h\u00e9llo \u4e16\u754c \U0001f600"}'.encode()),
    ("escaped-surrogate-pair", b'{"e":"\\ud83d\\ude00"}'),
    ("duplicate-keys", b'{"a":1,"a":2}'),
    ("nested-200", b"[" * 200 + b"1" + b"]" * 200),
    ("small-number", b'{"n":1e-400}'),
    ("tiny-number-exponent-below-minus-1000", b'{"n":1e-1001}'),
    ("exponent-1000", b'{"n":1e1000}'),
    ("beyond-double-range", b'{"n":1e400}'),
    ("integer-400-digits", b'{"n":' + b"9" * 400 + b"}"),
    ("escaped-backslash-then-u0000-text", b'{"path":"C:\\\\u0000dir"}'),
]


def test_json_that_jsonb_accepts_is_stored_as_payload(ib_db, ib_topic, ib_producer,
                                                      ib_subscriptions):
    topic = ib_topic("jsonb_ok", 1)
    sub = unique_name("jsonb_ok")
    # Check the premise: PostgreSQL's jsonb does take every one of these values.
    for label, value in JSONB_ACCEPTS:
        try:
            ib_db.value("SELECT %s::jsonb IS NOT NULL", (value.decode(),))
        except psycopg2.Error as e:
            raise AssertionError("test premise: jsonb rejects %s: %s" % (label, e))
    ib_subscriptions(sub, [topic])
    produce(ib_producer, topic, [{"value": v, "headers": [("message_id", label.encode())]}
                                 for label, v in JSONB_ACCEPTS])
    ib_db.wait_rows(sub, len(JSONB_ACCEPTS), timeout=60)
    rows = {r["message_id"]: r for r in ib_db.inbox_rows(
        sub, "message_id, status, raw_payload IS NULL AS no_raw, last_error, "
             "payload IS NOT NULL AS has_payload")}
    problems = []
    for label, value in JSONB_ACCEPTS:
        r = rows[label]
        same = ib_db.value("SELECT payload = %s::jsonb FROM eventbox.inbox "
                           "WHERE subscription = %s AND message_id = %s",
                           (value.decode(), sub, label))
        if r["status"] != "received" or not same or not r["no_raw"]:
            problems.append("%s (%r...): status %r, payload equal: %r, last_error %r"
                            % (label, value[:40], r["status"], same, r["last_error"]))
    assert not problems, ("JSON that jsonb accepts was not stored as payload:\n"
                          + "\n".join(problems))
