"""value_format 'registry' with Avro (docs/guide/formats.md): records written by an independent
encoder (python3-avro) are stored decoded in payload with the producer's bytes in raw_payload,
schema changes between records included, with a bounded cache over 10,000 schema ids; keys in
the registry format; the relay encodes topics set with set_topic_format() byte for byte, send()
refuses what the schema cannot encode; a round trip Kafka -> inbox -> handler -> outbox ->
Kafka; Debezium envelopes in Avro dedupe a replayed connector."""
import json

import psycopg2
import pytest

from inbox_streams import (ORDER, expected, order, outbox_statuses, read_values,
                           registry_subscription)
from inbox_kafka import end_offsets, produce
from inbox_support import Db, footprint, poll, report, unique_name
from schema_registry import avro_encode, wire

# The same subject, version 2: a field added with a default (compatible).
ORDER_V2 = json.dumps(dict(json.loads(ORDER), fields=json.loads(ORDER)["fields"] + [
    {"name": "channel", "type": "string", "default": "web"}]))


def test_avro_records_are_decoded_with_their_bytes_kept(
        ib_db, ib_topic, ib_producer, ib_subscriptions, registry):
    topic = ib_topic("avro", 2)
    sid = registry.register(topic + "-value", ORDER)
    sid2 = registry.register(topic + "-value", ORDER_V2)
    assert sid2 != sid
    with pytest.raises(ValueError):  # 409: a field without a default is incompatible
        registry.register(topic + "-value", json.dumps(dict(json.loads(ORDER), fields=[
            {"name": "other", "type": "string"}])))
    sub = registry_subscription(ib_db, ib_subscriptions, "avro", [topic])
    records = []
    for i in range(40):
        # The schema changes between two records: odd ones are written with version 2.
        if i % 2:
            value = wire(sid2, avro_encode(ORDER_V2, order(i, channel="app")))
        else:
            value = wire(sid, avro_encode(ORDER, order(i)))
        headers = [("message_id", b"m-%d" % i)]
        if i == 7:
            headers.append(("event_type", b"custom.Type"))
        records.append({"value": value, "key": b"k%d" % (i % 5), "headers": headers,
                        "partition": i % 2})
    sent = produce(ib_producer, topic, records)
    ib_db.wait_rows(sub, len(records), timeout=60)
    ib_db.wait_caught_up(sub, end_offsets(topic), timeout=30)
    rows = {r["message_id"]: r for r in ib_db.inbox_rows(
        sub, "message_id, status, payload, raw_payload, event_type, last_error")}
    assert len(rows) == len(records)
    for i, s in enumerate(sent):
        r = rows["m-%d" % i]
        assert r["status"] == "received", r
        want = expected(i)
        if i % 2:
            want["channel"] = "app"
        assert r["payload"] == want
        assert bytes(r["raw_payload"]) == s.value  # the producer's bytes, byte for byte
        assert r["event_type"] == ("custom.Type" if i == 7 else "com.example.shop.Order")
    # Each schema was fetched once, however many records used it.
    assert registry.count("/schemas/ids/%d" % sid) == 1
    assert registry.count("/schemas/ids/%d" % sid2) == 1


def test_ten_thousand_schema_ids_keep_memory_bounded(
        ib_db, ib_topic, ib_producer, ib_subscriptions, registry):
    topic = ib_topic("manyids", 4)
    n = 10000
    for i in range(n):
        registry.add_id(100000 + i, json.dumps({
            "type": "record", "name": "R%d" % i, "namespace": "many",
            "fields": [{"name": "i", "type": "int"}, {"name": "pad", "type": "string"}]}))
    sub = registry_subscription(ib_db, ib_subscriptions, "manyids", [topic])
    pid = ib_db.counters()["pid"]

    def batch(lo, hi):
        return [{"value": wire(100000 + i, avro_encode(json.dumps({
            "type": "record", "name": "R%d" % i, "namespace": "many",
            "fields": [{"name": "i", "type": "int"}, {"name": "pad", "type": "string"}]}),
            {"i": i, "pad": "x" * 50})), "headers": [("message_id", b"n%d" % i)],
            "partition": i % 4} for i in range(lo, hi)]

    produce(ib_producer, topic, batch(0, 2000))
    ib_db.wait_rows(sub, 2000, timeout=240)
    warm = footprint(pid)
    produce(ib_producer, topic, batch(2000, n))
    ib_db.wait_rows(sub, n, timeout=600)
    after = footprint(pid)
    types = ib_db.value("SELECT count(DISTINCT event_type) FROM eventbox.inbox "
                        "WHERE subscription = %s AND status = 'received'", (sub,))
    assert types == n
    growth_kb = after["anon_kb"] - warm["anon_kb"]
    report("ten_thousand_ids", warm_anon_kb=warm["anon_kb"], after_anon_kb=after["anon_kb"],
           growth_kb=growth_kb, fetches=registry.count("/schemas/ids/"))
    # The cache keeps at most 1,000 schemas (the default): 8,000 more ids must not add their
    # ~8,000 schemas' worth of memory.
    assert growth_kb < 16 * 1024, (warm, after)


def test_relay_encodes_topics_with_a_registry_format(ib_db, ib_topic, registry):
    topic = ib_topic("outavro", 1)
    sid = registry.register(topic + "-value", ORDER)
    ib_db.rows("SELECT eventbox.set_topic_format(%s, 'registry')", (topic,))
    assert ib_db.rows("SELECT value_subject, value_version FROM eventbox.topic_formats "
                      "WHERE topic = %s", (topic,)) == [(topic + "-value", None)]
    for i in range(10):
        # One key: one lane, so the records keep the order they were sent in.
        ib_db.rows("SELECT eventbox.send(%s, %s::jsonb, key => 'k')",
                   (topic, json.dumps(expected(i))))
    values = read_values(topic, 10)
    for i, v in enumerate(values):
        # Byte for byte what python3-avro writes for the same order.
        assert v == wire(sid, avro_encode(ORDER, order(i))), i
    # A payload the schema refuses, sent from a new session (whose backend has not fetched the
    # schema: send() lets it through), fails with the reason; the topic's later rows go on.
    cold = Db()
    cold.rows("SELECT eventbox.send(%s, '{\"id\": 1}'::jsonb, key => 'k')", (topic,))
    cold.close()
    ib_db.rows("SELECT eventbox.send(%s, %s::jsonb, key => 'k')",
               (topic, json.dumps(expected(11))))
    assert read_values(topic, 11)[10] == wire(sid, avro_encode(ORDER, order(11)))
    failed = poll(lambda: [r for r in outbox_statuses(ib_db, topic) if r[0] == "failed"], 90,
                  "the refused row to fail")
    assert "$.id: expected a string" in failed[0][2], failed
    # Reset: the messages go out as given again.
    ib_db.rows("SELECT eventbox.reset_topic_format(%s)", (topic,))
    ib_db.rows("SELECT eventbox.send(%s, '{\"plain\": true}'::jsonb)", (topic,))
    assert json.loads(read_values(topic, 12)[11]) == {"plain": True}


def refused_at_send(db, topic, payload, key):
    """The SQLSTATE, detail and hint send() raised, or None when it took the message (rolled
    back either way)."""
    conn = db.conn()
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT eventbox.send(%s, %s::jsonb, key => %s)", (topic, payload, key))
        return None
    except psycopg2.Error as e:
        return e.pgcode, e.diag.message_primary, e.diag.message_detail, e.diag.message_hint
    finally:
        conn.rollback()
        conn.autocommit = True


def test_send_refuses_what_the_schema_cannot_encode_once_it_has_the_schema(
        ib_db, ib_topic, registry):
    topic = ib_topic("outrefuse", 1)
    registry.register(topic + "-value", ORDER)
    registry.register(topic + "-key", json.dumps({"type": "string"}))
    ib_db.rows("SELECT eventbox.set_topic_format(%s, 'registry', key_format => 'registry')",
               (topic,))
    session = Db()
    # The session's first send() starts the schemas' fetch and does not wait for it.
    bad = json.dumps({"id": 1})
    refusal = poll(lambda: refused_at_send(session, topic, bad, '"k"'), 30,
                   "send() to know the schema")
    code, message, detail, hint = refusal
    assert code == "22023", refusal
    assert message == 'payload does not fit the schema of topic "%s"' % topic, refusal
    assert "$.id: expected a string" in detail and "set_topic_format" in hint, refusal
    # A key its schema refuses (a JSON number for a string schema), and a good message.
    code, message, _, hint = refused_at_send(session, topic, json.dumps(expected(1)), "7")
    assert code == "22023" and message.startswith("key does not fit"), message
    assert refused_at_send(session, topic, json.dumps(expected(1)), '"k"') is None
    # Other topics are not checked.
    assert refused_at_send(session, ib_topic("outrefuse_plain", 1), bad, "7") is None
    session.close()
    # Nothing of the refused ones reached the outbox.
    assert outbox_statuses(ib_db, topic) == []


KEY = json.dumps({"type": "record", "name": "OrderKey", "namespace": "com.example.shop",
                  "fields": [{"name": "customer", "type": "string"},
                             {"name": "region", "type": ["null", "string"]}]})


def test_round_trip_kafka_inbox_handler_outbox_kafka_byte_for_byte(
        ib_db, ib_topic, ib_producer, ib_subscriptions, registry):
    """Values and keys in the registry format: the inbox decodes both (payload, key_payload),
    a handler sends them on, the relay encodes both: the producer's bytes come out."""
    src, dst = ib_topic("rtsrc", 1), ib_topic("rtdst", 1)
    sid = registry.register(src + "-value", ORDER)
    assert registry.register(dst + "-value", ORDER) == sid  # the same schema, the same id
    kid = registry.register(src + "-key", KEY)
    assert registry.register(dst + "-key", KEY) == kid
    ib_db.rows("SELECT eventbox.set_topic_format(%s, 'registry', key_format => 'registry')",
               (dst,))
    assert ib_db.rows("SELECT value_subject, key_subject FROM eventbox.topic_formats "
                      "WHERE topic = %s", (dst,)) == [(dst + "-value", dst + "-key")]
    role = "reg_forwarder"
    if not ib_db.value("SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)):
        ib_db.rows("CREATE ROLE reg_forwarder NOLOGIN")
    ib_db.rows("SELECT eventbox.grant_writer(%s)", (role,))
    fn = "public.fwd_" + unique_name("f").replace(".", "_").replace("-", "_")[3:]
    ib_db.rows("CREATE FUNCTION %s(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$ "
               "BEGIN PERFORM eventbox.send('%s', msg.payload, key => msg.key_payload::text); "
               "END $$" % (fn, dst))
    ib_db.rows("GRANT EXECUTE ON FUNCTION %s(eventbox.inbox) TO reg_forwarder" % fn)
    sub = registry_subscription(ib_db, ib_subscriptions, "rt", [src], key_format="registry")
    ib_db.rows("SELECT eventbox.register_handler(%s, %s::regprocedure, run_as => %s)",
               (sub, fn + "(eventbox.inbox)", role))
    # One customer: one key, so the handler and the relay keep the order.
    key = wire(kid, avro_encode(KEY, {"customer": "c-1", "region": "eu"}))
    sent = [(key, wire(sid, avro_encode(ORDER, order(i)))) for i in range(20)]
    produce(ib_producer, src, [{"key": k, "value": v, "headers": [("message_id", b"rt%d" % i)]}
                               for i, (k, v) in enumerate(sent)])
    ib_db.wait_rows(sub, 20, timeout=60)
    assert ib_db.rows("SELECT DISTINCT key_payload FROM eventbox.inbox WHERE subscription = %s",
                      (sub,)) == [({"customer": "c-1", "region": "eu"},)]
    out = read_values(dst, 20, timeout=90, keys=True)
    assert out == sent  # the producer's bytes, keys and values, through jsonb and back


def test_bad_registry_keys_are_unparsable(ib_db, ib_topic, ib_producer, ib_subscriptions,
                                          registry):
    topic = ib_topic("badkeys", 1)
    kid = registry.register(topic + "-key", KEY)
    sub = ib_subscriptions(unique_name("badkeys"), [topic])
    since = ib_db.value("SELECT clock_timestamp()")
    ib_db.rows("SELECT eventbox.set_subscription_format(%s, 'json', key_format => 'registry')",
               (sub,))
    ib_db.wait_worker_reloaded(since)
    good = wire(kid, avro_encode(KEY, {"customer": "c", "region": None}))
    records = [(b"plain-key", b'{"n":1}'), (good, b'{"n":2}'), (None, b'{"n":3}')]
    produce(ib_producer, topic, [{"key": k, "value": v, "headers": [("message_id", b"b%d" % i)]}
                                 for i, (k, v) in enumerate(records)])
    ib_db.wait_rows(sub, 3, timeout=60)
    rows = {r["message_id"]: r for r in ib_db.inbox_rows(
        sub, "message_id, status, key, key_payload, payload, raw_payload, last_error")}
    assert rows["b0"]["status"] == "unparsable"
    assert rows["b0"]["last_error"].startswith("key: value does not start with the Schema "
                                                "Registry magic byte"), rows["b0"]
    assert bytes(rows["b0"]["raw_payload"]) == b'{"n":1}' and bytes(rows["b0"]["key"]) == \
        b"plain-key"
    assert rows["b1"]["status"] == "received" and rows["b1"]["payload"] == {"n": 2}
    assert rows["b1"]["key_payload"] == {"customer": "c", "region": None}
    assert rows["b2"]["status"] == "received" and rows["b2"]["key_payload"] is None


# Debezium's PostgreSQL connector with the Avro converter: the envelope and key as its
# documentation shows them (before/after optional records of the table's row, the source block,
# op, ts_ms), written here with python3-avro.
DBZ_VALUE = json.dumps({
    "type": "record", "name": "Envelope", "namespace": "PostgreSQL_server.inventory.customers",
    "fields": [
        {"name": "before", "type": ["null", {
            "type": "record", "name": "Value", "fields": [
                {"name": "id", "type": "int"}, {"name": "first_name", "type": "string"},
                {"name": "last_name", "type": "string"}, {"name": "email", "type": "string"}]}],
         "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": {
            "type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
            "fields": [
                {"name": "version", "type": "string"}, {"name": "connector", "type": "string"},
                {"name": "name", "type": "string"}, {"name": "ts_ms", "type": "long"},
                {"name": "snapshot", "type": ["null", "string"], "default": None},
                {"name": "db", "type": "string"},
                {"name": "sequence", "type": ["null", "string"], "default": None},
                {"name": "schema", "type": "string"}, {"name": "table", "type": "string"},
                {"name": "txId", "type": ["null", "long"], "default": None},
                {"name": "lsn", "type": ["null", "long"], "default": None},
                {"name": "xmin", "type": ["null", "long"], "default": None}]}},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None}]})


DBZ_KEY = json.dumps({"type": "record", "name": "Key",
                      "namespace": "PostgreSQL_server.inventory.customers",
                      "fields": [{"name": "id", "type": "int"}]})


def dbz_change(op, before, after, lsn, tx, ts_ms, snapshot="false"):
    return {"before": before, "after": after, "op": op, "ts_ms": ts_ms,
            "source": {"version": "2.7.0.Final", "connector": "postgresql",
                       "name": "PostgreSQL_server", "ts_ms": 1559033904863,
                       "snapshot": snapshot, "db": "postgres", "sequence": None,
                       "schema": "inventory", "table": "customers", "txId": tx, "lsn": lsn,
                       "xmin": None}}


def dbz_row(i, email):
    return {"id": i, "first_name": "Anne %d" % i, "last_name": "Kretchmar", "email": email}


def test_debezium_avro_envelopes_dedupe_a_replayed_connector(
        ib_db, ib_topic, ib_producer, ib_subscriptions, registry):
    topic = ib_topic("dbzavro", 2)
    vid = registry.register(topic + "-value", DBZ_VALUE)
    kid = registry.register(topic + "-key", DBZ_KEY)
    sub = registry_subscription(ib_db, ib_subscriptions, "dbzavro", [topic],
                                key_format="registry", message_id_rule="debezium")
    changes = [(i, dbz_change("r", None, dbz_row(i, "a%d@x" % i), 24023128, 555,
                              1559033904000 + i, snapshot="true")) for i in (1, 2)]
    changes += [(3, dbz_change("c", None, dbz_row(3, "a3@x"), 24023200, 556, 1559033905000)),
                (1, dbz_change("u", dbz_row(1, "a1@x"), dbz_row(1, "b1@x"), 24023300, 557,
                               1559033906000)),
                (2, dbz_change("d", dbz_row(2, "a2@x"), None, 24023400, 558, 1559033907000)),
                (2, None)]  # the delete's tombstone

    def records(ts_shift, partition_of):
        return [{"key": wire(kid, avro_encode(DBZ_KEY, {"id": k})),
                 "value": None if c is None else wire(vid, avro_encode(DBZ_VALUE, dict(
                     c, ts_ms=c["ts_ms"] + ts_shift))),
                 "partition": partition_of(k)} for k, c in changes]

    produce(ib_producer, topic, records(0, lambda k: k % 2))
    ib_db.wait_caught_up(sub, end_offsets(topic), timeout=60)
    rows = ib_db.inbox_rows(sub, "message_id, event_type, status, payload, key_payload")
    assert sorted((r["event_type"], r["status"]) for r in rows) == [
        ("create", "received"), ("delete", "received"), ("read", "received"),
        ("read", "received"), ("update", "received")]
    ids = {r["message_id"] for r in rows}
    assert all(i.startswith("postgresql:PostgreSQL_server:postgres.inventory.customers:"
                            "lsn=") for i in ids), ids
    update = next(r for r in rows if r["event_type"] == "update")
    assert update["payload"]["after"]["email"] == "b1@x" and update["key_payload"] == {"id": 1}
    # The connector replays it all (another ts_ms, other partitions): nothing stored twice.
    produce(ib_producer, topic, records(60000, lambda k: 1 - k % 2))
    ib_db.wait_caught_up(sub, end_offsets(topic), timeout=60)
    assert {r["message_id"] for r in ib_db.inbox_rows(sub, "message_id")} == ids
    assert ib_db.value("SELECT count(*) FROM eventbox.conflicts WHERE subscription = %s",
                       (sub,)) == 0
    report("cdc_debezium_avro", records=2 * len(changes), stored=len(ids))
