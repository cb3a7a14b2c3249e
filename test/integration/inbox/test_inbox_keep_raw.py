"""The producer's bytes, kept (issue 28): with keep_raw => true, or a dead-letter topic, every
record's value bytes are kept in raw_payload, JSON ones too, and the dead letters carry exactly
the producer's value, key and headers, however the JSON was spelled (whitespace, key order,
duplicate keys, \\u escapes, numbers jsonb rewrites). Records are produced with kafka-python and
the dead letters read back with confluent_kafka, two independent clients."""
import json
import pathlib
import sys
import time

import confluent_kafka

from inbox_kafka import bootstrap, end_offsets, produce
from inbox_support import report, unique_name

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "lib"))
from schema_registry import avro_encode, wire  # noqa: E402

# Values jsonb stores as the same JSON with other bytes.
SPELLINGS = [
    b'{ "b" : 1,\n\t"a" : [ 1 , 2 ] }',             # whitespace, key order
    b'{"a":1,"a":2}',                                # a duplicate key (jsonb keeps the last)
    b'{"s":"caf\\u00e9 \\ud83d\\ude00 \\/"}',         # \u escapes, a surrogate pair, \/
    b'{"n":[1.0,1e2,-0,0.10,1E+2,12345678901234567890.5]}',  # numbers numeric rewrites
    b'[1, {"x": null}, "\xc3\xa9"]',                   # not an object; UTF-8
]

HANDLER = """
CREATE OR REPLACE FUNCTION public.eventbox_raw_refuse(msg eventbox.inbox) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'refused %', msg.message_id USING ERRCODE = 'QE001';
END $$;
"""


def read_all(topic, partitions, n, timeout=60.0):
    """The first n records of `topic` read with confluent_kafka (fewer on timeout)."""
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap(), "group.id": unique_name("g"),
                                  "enable.auto.commit": False})
    try:
        c.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                  for p in range(partitions)])
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            out.append(m)
        return out
    finally:
        c.close()


def setup_handler(db, sub):
    role = "eventbox_raw_test"
    db.rows("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '%s') THEN "
            "CREATE ROLE %s NOLOGIN; END IF; END $$" % (role, role))
    db.rows("GRANT USAGE ON SCHEMA eventbox TO %s" % role)
    db.rows(HANDLER)
    db.rows("GRANT EXECUTE ON FUNCTION public.eventbox_raw_refuse(eventbox.inbox) TO %s" % role)
    db.rows("SELECT eventbox.register_handler(%s, "
            "'public.eventbox_raw_refuse(eventbox.inbox)'::regprocedure, run_as => %s)",
            (sub, role))


def test_dead_letters_carry_the_producers_bytes(ib_db, ib_topic, ib_producer, ib_subscriptions):
    topic = ib_topic("raw-dlt", 2)
    dlt = ib_topic("raw-dlt-dead", 1)
    sub = ib_subscriptions(unique_name("rawdlt"), [topic], dead_letter_topic=dlt,
                           unhandled="ignore", max_attempts=1)
    setup_handler(ib_db, sub)
    records = []
    for i, value in enumerate(SPELLINGS + [b"not json \xff", b""]):
        records.append({
            "value": value, "partition": i % 2,
            "key": b"k\x00\xfe-%d" % i,           # binary key bytes
            "headers": [("message_id", ("raw-%d" % i).encode()),
                        ("trace", "t\u00e9-%d" % i),
                        ("event_type", b"Order")],
        })
    for r in records:
        r["headers"] = [(n, v.encode() if isinstance(v, str) else v) for n, v in r["headers"]]
    sent = produce(ib_producer, topic, records)
    ib_db.wait_caught_up(sub, end_offsets(topic))

    # Every row keeps its bytes; the JSON ones their jsonb too.
    rows = {r["message_id"]: r for r in ib_db.inbox_rows(
        sub, "message_id, payload, raw_payload, status")}
    for i, r in enumerate(records):
        row = rows["raw-%d" % i]
        assert bytes(row["raw_payload"]) == r["value"], (i, row)
    assert rows["raw-0"]["payload"] == {"a": [1, 2], "b": 1}

    dead = read_all(dlt, 1, len(records))
    assert len(dead) == len(records), [m.value() for m in dead]
    by_id = {dict(m.headers())["__eventbox.errors.message_id"].decode(): m for m in dead}
    for i, r in enumerate(records):
        m = by_id["raw-%d" % i]
        assert m.value() == r["value"], (i, m.value(), r["value"])
        assert m.key() == r["key"]
        headers = m.headers()
        for name, value in r["headers"]:
            if name == "message_id":
                continue  # the dead letter's own id (the outbox row's)
            assert [v for n, v in headers if n == name] == [value], (name, headers)
        status = dict(headers)["__eventbox.errors.status"].decode()
        assert status == ("dead" if i < len(SPELLINGS) else "unparsable"), (i, status)
    assert all(s.offset >= 0 for s in sent)
    report("keep_raw_dead_letters", records=len(records), dead_letters=len(dead))


def test_keep_raw_option(ib_db, ib_topic, ib_producer, ib_subscriptions):
    topic = ib_topic("raw-keep", 1)
    kept = ib_subscriptions(unique_name("rawkeep"), [topic], keep_raw=True)
    plain = ib_subscriptions(unique_name("rawplain"), [topic])
    value = b'{ "id" : 1.0 , "z":"\\u0041" }'
    produce(ib_producer, topic, [{"value": value, "partition": 0,
                                  "headers": [("message_id", b"k-1")]}])
    ends = end_offsets(topic)
    ib_db.wait_caught_up(kept, ends)
    ib_db.wait_caught_up(plain, ends)
    get = "SELECT payload, raw_payload FROM eventbox.inbox WHERE subscription = %s"
    (payload, raw), = ib_db.rows(get, (kept,))
    assert payload == {"id": 1.0, "z": "A"} and bytes(raw) == value
    (payload, raw), = ib_db.rows(get, (plain,))
    assert payload == {"id": 1.0, "z": "A"} and raw is None

    # Changed without a restart: the next record of `plain` keeps its bytes.
    ib_db.alter_subscription(plain, keep_raw=True)
    time.sleep(1.0)
    produce(ib_producer, topic, [{"value": b'{"v" : 2}', "partition": 0,
                                  "headers": [("message_id", b"k-2")]}])
    ib_db.wait_caught_up(plain, end_offsets(topic))
    raw = ib_db.value("SELECT raw_payload FROM eventbox.inbox WHERE subscription = %s "
                      "AND message_id = 'k-2'", (plain,))
    assert bytes(raw) == b'{"v" : 2}'
    # The same JSON spelled otherwise is a duplicate, not a conflict.
    produce(ib_producer, topic, [{"value": b'{"z":"A","id":1.0}', "partition": 0,
                                  "headers": [("message_id", b"k-1")]}])
    ib_db.wait_caught_up(kept, end_offsets(topic))
    assert ib_db.value("SELECT count(*) FROM eventbox.conflicts WHERE subscription = %s",
                       (kept,)) == 0
    report("keep_raw_option", subscriptions=2)



# Headers jsonb cannot hold as they came: a repeated name, a null value, an empty one, bytes that
# are not UTF-8, a name that is not ASCII; with the record's own message_id among them.
def odd_headers(i):
    return [("trace", b"t-1"), ("message_id", b"odd-%d" % i), ("trace", b"t-2"),
            ("nothing", None), ("empty", b""), ("bin", b"\x00\xff\xfe-%d" % i),
            ("n\u00e9", b"caf\xc3\xa9")]


def assert_headers_as_produced(m, produced):
    """The dead letter's headers: the relay's message_id, then the producer's headers exactly as
    they were (order, repeats, null and binary values) but its message_id, then those saying why
    (__connect.errors.*, __eventbox.errors.*)."""
    got = m.headers()
    assert got[0][0] == "message_id", got
    want = [(n, v) for n, v in produced if n != "message_id"]
    assert got[1:1 + len(want)] == want, (got, want)
    assert all(n.startswith(("__connect.errors.", "__eventbox.errors."))
               for n, _ in got[1 + len(want):]), got


def test_dead_letters_carry_the_producers_headers_exactly(ib_db, ib_topic, ib_producer,
                                                          ib_subscriptions):
    topic = ib_topic("raw-hdr", 1)
    dlt = ib_topic("raw-hdr-dead", 1)
    sub = ib_subscriptions(unique_name("rawhdr"), [topic], dead_letter_topic=dlt,
                           unhandled="ignore", max_attempts=1)
    setup_handler(ib_db, sub)
    # confluent_kafka's producer, which can send a header with a null value.
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap(), "acks": "all"})
    values = [b'{ "a" : 1 }', b"not json \xff"]
    for i, v in enumerate(values):
        p.produce(topic, value=v, key=b"k\x00-%d" % i, partition=0, headers=odd_headers(i))
    assert p.flush(60) == 0
    ib_db.wait_caught_up(sub, end_offsets(topic))
    raw = ib_db.value("SELECT raw_headers FROM eventbox.inbox WHERE subscription = %s "
                      "AND message_id = 'odd-0'", (sub,))
    assert raw is not None
    dead = read_all(dlt, 1, len(values))
    assert len(dead) == len(values)
    by_id = {dict(m.headers())["__eventbox.errors.message_id"].decode(): m for m in dead}
    for i, v in enumerate(values):
        m = by_id["odd-%d" % i]
        assert m.value() == v and m.key() == b"k\x00-%d" % i
        assert_headers_as_produced(m, odd_headers(i))
    report("raw_headers_dead_letters", dead_letters=len(dead))


ORDER = json.dumps({"type": "record", "name": "Order", "namespace": "com.example",
                    "fields": [{"name": "id", "type": "string"}, {"name": "qty", "type": "int"}]})


def test_registry_dead_letters_carry_value_key_and_headers_exactly(
        ib_db, ib_topic, ib_producer, ib_subscriptions, registry):
    topic = ib_topic("raw-reg", 1)
    dlt = ib_topic("raw-reg-dead", 1)
    sid = registry.register(topic + "-value", ORDER)
    sub = ib_subscriptions(unique_name("rawreg"), [topic], dead_letter_topic=dlt,
                           unhandled="ignore", max_attempts=1)
    since = ib_db.value("SELECT clock_timestamp()")
    ib_db.rows("SELECT eventbox.set_subscription_format(%s, 'registry')", (sub,))
    ib_db.wait_worker_reloaded(since)
    setup_handler(ib_db, sub)
    values = [wire(sid, avro_encode(ORDER, {"id": "o-1", "qty": 2})),  # decoded, then refused
              b"\x01" + wire(sid, avro_encode(ORDER, {"id": "o-2", "qty": 3}))[1:]]  # unparsable
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap(), "acks": "all"})
    for i, v in enumerate(values):
        p.produce(topic, value=v, key=b"\x00\x00\x00\x00\x07k%d" % i, partition=0,
                  headers=odd_headers(i))
    assert p.flush(60) == 0
    ib_db.wait_caught_up(sub, end_offsets(topic), timeout=60)
    dead = read_all(dlt, 1, len(values))
    assert len(dead) == len(values)
    by_id = {dict(m.headers())["__eventbox.errors.message_id"].decode(): m for m in dead}
    for i, v in enumerate(values):
        m = by_id["odd-%d" % i]
        assert m.value() == v and m.key() == b"\x00\x00\x00\x00\x07k%d" % i
        assert_headers_as_produced(m, odd_headers(i))
    status = {k: dict(m.headers())["__eventbox.errors.status"] for k, m in by_id.items()}
    assert status == {"odd-0": b"dead", "odd-1": b"unparsable"}, status
    report("raw_headers_registry_dead_letters", dead_letters=len(dead))
