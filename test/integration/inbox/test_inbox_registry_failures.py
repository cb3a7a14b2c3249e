"""value_format 'registry' when things go wrong (docs/guide/formats.md): bad input (an unknown
schema id, a wrong magic byte, truncated data, a schema that cannot be parsed) is stored
'unparsable' with its bytes and the reason while the rest goes on; a registry that is down or
slow pauses only the subscriptions waiting for it, and one paused because the registry was down
is read again as soon as it answers; the relay fails a row whose subject is unknown."""
import time

from inbox_streams import (ORDER, expected, order, outbox_statuses, registry_subscription,
                           subscription_error)
from inbox_kafka import end_offsets, json_value, produce
from inbox_support import poll, report, unique_name
from schema_registry import avro_encode, wire

def test_bad_input_is_stored_unparsable_and_the_rest_goes_on(
        ib_db, ib_topic, ib_producer, ib_subscriptions, registry):
    topic = ib_topic("avrobad", 1)
    sid = registry.register(topic + "-value", ORDER)
    registry.add_id(sid + 1000, '{"type": "record", "name": "Broken"}')  # no fields
    good = wire(sid, avro_encode(ORDER, order(1)))
    cases = [
        ("unknown-id", wire(999999, b"\x02x"), r"999999.*not in the schema registry"),
        ("wrong-magic", b"\x01" + good[1:], r"magic byte"),
        ("json-text", b'{"a":1}', r"magic byte"),
        ("short-header", b"\x00\x00\x01", r"shorter than"),
        ("truncated", good[:-3], r"does not match its schema"),
        ("trailing", good + b"\x00\x00", r"after its value"),
        ("bad-schema", wire(sid + 1000, b"\x00"), r"schema id %d: Avro schema" % (sid + 1000)),
        ("empty", b"", r"empty"),
        ("good", good, None),
    ]
    sub = registry_subscription(ib_db, ib_subscriptions, "avrobad", [topic])
    produce(ib_producer, topic, [{"value": v, "headers": [("message_id", label.encode())]}
                                 for label, v, _ in cases])
    ib_db.wait_rows(sub, len(cases), timeout=60)
    ib_db.wait_caught_up(sub, end_offsets(topic), timeout=30)
    rows = {r["message_id"]: r for r in ib_db.inbox_rows(
        sub, "message_id, status, payload, raw_payload, last_error")}
    import re
    for label, value, reason in cases:
        r = rows[label]
        if reason is None:
            assert r["status"] == "received" and r["payload"] == expected(1)
            continue
        assert r["status"] == "unparsable", (label, r)
        assert r["payload"] is None
        assert (b"" if r["raw_payload"] is None else bytes(r["raw_payload"])) == value, label
        assert re.search(reason, r["last_error"]), (label, r["last_error"])


# The attempt whose backoff (16 s) the registry comes back in.
BACKOFF_ATTEMPTS = 5


def test_registry_down_pauses_only_its_subscription_and_nothing_is_lost(
        ib_db, ib_topic, ib_producer, ib_subscriptions, registry):
    topic, other_topic = ib_topic("regdown", 2), ib_topic("regdown_json", 2)
    sid = registry.register(topic + "-value", ORDER)
    sub = registry_subscription(ib_db, ib_subscriptions, "regdown", [topic])
    other = ib_subscriptions(unique_name("regdown_json"), [other_topic])
    registry.stop()
    produce(ib_producer, topic, [{"value": wire(sid, avro_encode(ORDER, order(i))),
                                  "headers": [("message_id", b"d%d" % i)]} for i in range(20)])
    error = poll(lambda: subscription_error(ib_db, sub), 30, "the registry error of " + sub)
    assert registry.url in error and "schema id %d" % sid in error, error
    # Another subscription is not held up meanwhile.
    start = time.monotonic()
    produce(ib_producer, other_topic, [{"value": json_value({"n": i})} for i in range(50)])
    ib_db.wait_rows(other, 50, timeout=30)
    other_latency = time.monotonic() - start
    assert ib_db.inbox_count(sub) == 0
    # Down long enough for a long backoff (1 s doubling: the 5th attempt waits 16 s).
    poll(lambda: ib_db.value("SELECT attempts >= %s FROM eventbox.subscription_errors "
                             "WHERE subscription = %s", (BACKOFF_ATTEMPTS, sub)), 90,
         "attempt %d of %s" % (BACKOFF_ATTEMPTS, sub))
    attempts, retry_at, backoff_left = ib_db.rows(
        "SELECT attempts, next_retry_at, extract(epoch FROM next_retry_at - clock_timestamp()) "
        "FROM eventbox.subscription_errors WHERE subscription = %s", (sub,))[0]
    registry.start()  # back, on the same port
    ib_db.wait_rows(sub, 20, timeout=90)
    ib_db.wait_caught_up(sub, end_offsets(topic), timeout=30)
    # Stored as soon as the registry answered again (its schema is asked for while the
    # subscription is paused), not once the backoff it was in had run out.
    stored_at = ib_db.value("SELECT max(received_at) FROM eventbox.inbox "
                            "WHERE subscription = %s", (sub,))
    assert stored_at < retry_at, (stored_at, retry_at, attempts, backoff_left)
    poll(lambda: subscription_error(ib_db, sub) is None, 90, "the error of %s to clear" % sub)
    statuses = ib_db.rows("SELECT status, count(*) FROM eventbox.inbox WHERE subscription = %s "
                          "GROUP BY 1", (sub,))
    assert statuses == [("received", 20)]
    report("registry_down", other_subscription_s="%.2f" % other_latency,
           backoff_left_at_restart_s="%.1f" % backoff_left,
           stored_before_retry_s="%.1f" % (retry_at - stored_at).total_seconds())


def test_slow_registry_does_not_slow_other_subscriptions(
        ib_db, ib_topic, ib_producer, ib_subscriptions, registry):
    topic, other_topic = ib_topic("regslow", 1), ib_topic("regslow_json", 1)
    sid = registry.register(topic + "-value", ORDER)
    sub = registry_subscription(ib_db, ib_subscriptions, "regslow", [topic])
    other = ib_subscriptions(unique_name("regslow_json"), [other_topic])
    registry.delay = 4.0
    produce(ib_producer, topic, [{"value": wire(sid, avro_encode(ORDER, order(1)))}])
    # The fetch starts once the worker has taken the new subscription in: a reload that may also
    # resolve other subscriptions' start offsets (seconds under a full run's load).
    poll(lambda: registry.count("/schemas/ids/%d" % sid) >= 1, 30, "the schema's fetch")
    start = time.monotonic()
    produce(ib_producer, other_topic, [{"value": json_value({"n": i})} for i in range(20)])
    ib_db.wait_rows(other, 20, timeout=30)
    other_latency = time.monotonic() - start
    assert other_latency < 2.0, other_latency  # not behind the 4 s fetch
    ib_db.wait_rows(sub, 1, timeout=30)
    assert ib_db.value("SELECT status FROM eventbox.inbox WHERE subscription = %s",
                       (sub,)) == "received"
    report("slow_registry", other_subscription_s="%.2f" % other_latency)


def test_unknown_subject_fails_the_row_with_the_reason(ib_db, ib_topic, registry):
    topic = ib_topic("outnosubject", 1)
    ib_db.rows("SELECT eventbox.set_topic_format(%s, 'registry', value_subject => 'nope')",
               (topic,))
    ib_db.rows("SELECT eventbox.send(%s, '{\"a\": 1}'::jsonb)", (topic,))
    failed = poll(lambda: [r for r in outbox_statuses(ib_db, topic) if r[0] == "failed"], 90,
                  "the row to fail")
    assert 'subject "nope" version latest is not in the schema registry' in failed[0][2]
