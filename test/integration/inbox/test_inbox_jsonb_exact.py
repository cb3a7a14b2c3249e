"""The ingest worker builds the payload and headers jsonb without jsonb_in (payloads from the
JSON scanner's tokens, headers from their members): what it stores must be exactly what jsonb_in
makes of the same JSON text. A corpus of values (escapes, Unicode, numbers in every form, repeated
keys, top-level scalars, nesting on both sides of the depth up to which tokens are used) and of
headers (binary, NUL, null, repeated names, quotes and control characters) is compared in SQL
with jsonb_in's result: equal and the same text."""
import json
import random

from inbox_kafka import NULL_HEADER, end_offsets, header_json_name, produce, raw_header_name
from inbox_support import unique_name

NUMBERS = ["0", "-0", "1", "-1", "0.0", "-0.0", "1.0", "1.50", "100", "1e5", "1E5", "1e+5",
           "1E-5", "2.5e-3", "-12345678901234567890.123456789e-10", "0.000", "1e1000",
           "1e-1001", "9" * 400, "0." + "0" * 300 + "1", "123456789012345678901234567890",
           "3.14159265358979323846264338327950288"]
STRINGS = ["", "plain", "caf\u00e9", "\u4e16\u754c", "\U0001f680", "q\"uote", "back\\slash",
           "sl/ash", "tab\there", "new\nline", "\r\b\f", "\x01\x1f", "\u2028\u2029",
           "x" * 3000, "mixed \"" + "y" * 500 + "\\n" + "\u00e4" * 100]


def escaped(s, rnd):
    """s as a JSON string literal, with a random mix of escape styles jsonb must all read."""
    out = ['"']
    for ch in s:
        cp = ord(ch)
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif cp < 0x20:
            out.append({"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(
                ch, "\\u%04x" % cp))
        elif ch == "/" and rnd.random() < 0.5:
            out.append("\\/")
        elif rnd.random() < 0.1:
            if cp > 0xFFFF:
                v = cp - 0x10000
                out.append("\\u%04X\\u%04x" % (0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF)))
            else:
                out.append("\\u%04x" % cp)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def random_value(rnd, depth=0):
    kind = rnd.randrange(8 if depth < 5 else 5)
    if kind == 0:
        return rnd.choice(NUMBERS)
    if kind == 1:
        return escaped(rnd.choice(STRINGS), rnd)
    if kind == 2:
        return rnd.choice(["true", "false", "null"])
    if kind == 3:
        return str(rnd.randrange(-10**6, 10**6))
    if kind == 4:
        return escaped("".join(chr(rnd.choice([rnd.randrange(0x20, 0x7f), rnd.randrange(0xa0, 0xd7ff),
                                                rnd.randrange(0x10000, 0x10ffff)]))
                               for _ in range(rnd.randrange(0, 20))), rnd)
    ws = rnd.choice(["", " ", "\n\t ", "\r\n"])
    if kind in (5, 6):
        keys = [rnd.choice(["a", "b", "type", "id", "", "k\u00e9y", "dup"]) for _ in range(rnd.randrange(0, 6))]
        members = ["%s%s:%s%s" % (escaped(k, rnd), ws, ws, random_value(rnd, depth + 1)) for k in keys]
        return "{" + ws + ("," + ws).join(members) + ws + "}"
    return "[" + ws + ("," + ws).join(random_value(rnd, depth + 1)
                                      for _ in range(rnd.randrange(0, 6))) + ws + "]"


def corpus():
    rnd = random.Random(20261121)
    values = [("number-%d" % i, n) for i, n in enumerate(NUMBERS)]
    values += [("string-%d" % i, escaped(s, rnd)) for i, s in enumerate(STRINGS)]
    values += [("repeated-keys", '{"a":1,"b":2,"a":{"x":[1]},"b":null,"a":"last"}'),
               ("repeated-keys-nested", '[{"k":1,"k":2},{"k":{"k":3,"k":4}}]'),
               ("keys-sorted-by-length", '{"bbb":1,"a":2,"cc":3,"aaa":4,"":5}'),
               ("empty-object", "{}"), ("empty-array", " [ ] "), ("true", "true"),
               ("null", "null"), ("false", "\n false \t")]
    for depth in (1, 2, 63, 64, 65, 100, 300):  # tokens up to 64 levels, jsonb_in beyond
        values.append(("arrays-%d" % depth, "[" * depth + '"d"' + "]" * depth))
        values.append(("objects-%d" % depth, '{"a":' * depth + "[1,2.50]" + "}" * depth))
    for i in range(300):
        values.append(("random-%d" % i, random_value(rnd)))
    return values


# Out of numeric's range: unparsable with the same note whichever way the jsonb is built.
OUT_OF_RANGE = [("range-%d" % depth, '{"a":' * depth + "1e999999" + "}" * depth)
                for depth in (1, 64, 65, 70)]


def test_payload_and_headers_are_what_jsonb_in_makes(ib_db, ib_topic, ib_producer,
                                                     ib_subscriptions):
    values = corpus()
    rnd = random.Random(7)
    header_sets = [[], [("event_type", b"E")], [("x", b"1"), ("x", b"\xff"), ("x", NULL_HEADER)],
                   [(raw_header_name(b"\xffbin"), b"\x00\x01"), ("q\"\\", b"a\tb\n\x01\x7f")],
                   [("n", NULL_HEADER), ("k\u00e9".encode().decode(), "v\u00e9".encode())],
                   [("h%02d" % (i % 20), bytes([rnd.randrange(256)]) * rnd.randrange(3))
                    for i in range(40)]]
    records, expect = [], {}
    for i, (label, text) in enumerate(values + OUT_OF_RANGE):
        headers = header_sets[i % len(header_sets)]
        obj = {}
        for name, value in headers:
            raw_name = (bytes.fromhex(name[len(raw_header_name(b"")):])
                        if name.startswith(raw_header_name(b"")) else name.encode())
            obj[header_json_name(raw_name)] = (None if value is NULL_HEADER
                                               else header_json_name(value))
        records.append({"value": text.encode(), "key": label.encode(), "partition": i % 2,
                        "headers": headers + [("message_id", label.encode())]})
        obj["message_id"] = label
        expect[label] = (text, json.dumps(obj))

    topic = ib_topic("jsonb_exact", 2)
    sub = unique_name("jsonb_exact")
    ib_subscriptions(sub, [topic])
    produce(ib_producer, topic, records)
    ib_db.wait_caught_up(sub, end_offsets(topic), timeout=90)

    ib_db.rows("CREATE TEMP TABLE IF NOT EXISTS jsonb_expect (message_id text, payload text, "
               "headers text)")
    ib_db.rows("TRUNCATE jsonb_expect")
    for label, (text, headers) in expect.items():
        ib_db.rows("INSERT INTO jsonb_expect VALUES (%s, %s, %s)", (label, text, headers))
    differ = ib_db.rows(
        "SELECT e.message_id, i.status, i.last_error FROM jsonb_expect e "
        "LEFT JOIN eventbox.inbox i ON i.subscription = %s AND i.message_id = e.message_id "
        "WHERE e.message_id NOT LIKE 'range-%%' AND NOT coalesce("
        "  i.payload = e.payload::jsonb AND i.payload::text = e.payload::jsonb::text "
        "  AND i.headers = e.headers::jsonb AND i.headers::text = e.headers::jsonb::text "
        "  AND i.status = 'received' AND i.raw_payload IS NULL, false) "
        "ORDER BY 1", (sub,))
    assert not differ, "%d of %d rows differ from jsonb_in's result, e.g. %r" % (
        len(differ), len(values), differ[:5])

    notes = ib_db.rows("SELECT message_id, i.status, i.last_error, i.payload IS NULL, "
                       "i.raw_payload = convert_to(e.payload, 'UTF8') FROM eventbox.inbox i "
                       "JOIN jsonb_expect e USING (message_id) WHERE i.subscription = %s "
                       "AND message_id LIKE 'range-%%' ORDER BY 1", (sub,))
    assert len(notes) == len(OUT_OF_RANGE), notes
    assert all(n[1] == "unparsable" and n[3] and n[4] for n in notes), notes
    assert len({n[2] for n in notes}) == 1, "notes differ between the two ways: %r" % notes
    assert notes[0][2].startswith("value rejected by jsonb: "), notes
