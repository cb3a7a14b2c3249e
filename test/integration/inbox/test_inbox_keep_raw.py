"""The producer's bytes, kept (issue 28): with keep_raw => true, or a dead-letter topic, every
record's value bytes are kept in raw_payload, JSON ones too, and the dead letters carry exactly
the producer's value, key and headers, however the JSON was spelled (whitespace, key order,
duplicate keys, \\u escapes, numbers jsonb rewrites). Records are produced with kafka-python and
the dead letters read back with confluent_kafka, two independent clients."""
import time

import confluent_kafka

from inbox_support import bootstrap, end_offsets, produce, report, unique_name

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

