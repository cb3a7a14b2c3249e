"""What the inbox tests that stream records under faults share (test/integration/inbox and
test/fault/inbox): a paced producer thread, and the Schema Registry the workers use; and what
the registry formats' tests (test_inbox_registry_*.py) share: an Avro record schema with its
records and their JSON mapping, a registry subscription, the outbox read back."""
import json
import threading
import time

import pytest

from inbox_kafka import new_producer
from inbox_support import unique_name
from schema_registry import SchemaRegistry


class PacedStream(threading.Thread):
    """Produces `records` ((message_id, value, key) each; the id also as the message_id header)
    with kafka-python, `chunk` at a time with `pace_s` between chunks: a stream a fault test
    crashes workers under. `where` maps each message id to the (partition, offset) the broker
    acknowledged, `produced` counts them, `error` is what stopped the stream early."""

    def __init__(self, topic, records, chunk, pace_s, name="inbox-fault-producer"):
        super().__init__(daemon=True, name=name)
        self.topic = topic
        self.records = records
        self.chunk = chunk
        self.pace_s = pace_s
        self.where = {}
        self.produced = 0
        self.error = None

    def run(self):
        producer = new_producer(linger_ms=2)
        try:
            for start in range(0, len(self.records), self.chunk):
                futures = [(mid, producer.send(self.topic, key=key, value=value,
                                               headers=[("message_id", mid.encode())]))
                           for mid, value, key in self.records[start:start + self.chunk]]
                producer.flush(timeout=60)
                for mid, f in futures:
                    md = f.get(timeout=60)
                    self.where[mid] = (md.partition, md.offset)
                self.produced = len(self.where)
                time.sleep(self.pace_s)
        except BaseException as e:
            self.error = e
        finally:
            producer.close(timeout=10)


@pytest.fixture
def registry(ib_db):
    """A Schema Registry on loopback that the workers use (eventbox.schema_registry_url) for the
    test, then no registry again."""
    r = SchemaRegistry().start()
    since = ib_db.set_setting("eventbox.schema_registry_url", r.url, r.url)
    ib_db.wait_worker_reloaded(since)
    yield r
    r.stop()
    ib_db.set_setting("eventbox.schema_registry_url", None, "")


# ---- the registry formats' tests

ORDER = json.dumps({
    "type": "record", "name": "Order", "namespace": "com.example.shop",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10,
                                    "scale": 2}},
        {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "status", "type": {"type": "enum", "name": "Status",
                                    "symbols": ["NEW", "PAID"]}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "lines", "type": {"type": "array", "items": {
            "type": "record", "name": "Line",
            "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}},
        {"name": "attrs", "type": {"type": "map", "values": "double"}},
        {"name": "blob", "type": "bytes"},
    ]})


def order(i, **extra):
    import datetime
    import decimal
    datum = {"id": "o-%d" % i, "amount": decimal.Decimal("12.%02d" % (i % 100)),
             "placed": datetime.datetime(2024, 5, 1, 12, 0, 0, 250000,
                                         tzinfo=datetime.timezone.utc),
             "day": datetime.date(2024, 5, 1), "status": "PAID" if i % 2 else "NEW",
             "note": None if i % 3 else "n%d" % i,
             "lines": [{"sku": "s%d" % i, "qty": i}], "attrs": {"w": 1.5}, "blob": b"\x00\xff"}
    datum.update(extra)
    return datum


def expected(i):
    return {"id": "o-%d" % i, "amount": "12.%02d" % (i % 100),
            "placed": "2024-05-01T12:00:00.250Z", "day": "2024-05-01",
            "status": "PAID" if i % 2 else "NEW", "note": None if i % 3 else "n%d" % i,
            "lines": [{"sku": "s%d" % i, "qty": i}], "attrs": {"w": 1.5}, "blob": "AP8="}


def registry_subscription(ib_db, ib_subscriptions, label, topics, key_format="json",
                          **options):
    """A subscription created with value_format 'registry' (its options, as a user creates it)."""
    since = ib_db.value("SELECT clock_timestamp()")
    name = ib_subscriptions(unique_name(label), topics, value_format="registry",
                            key_format=key_format, **options)
    ib_db.wait_worker_reloaded(since)
    return name


def subscription_error(ib_db, sub):
    return ib_db.value("SELECT error FROM eventbox.subscription_errors WHERE subscription = %s",
                       (sub,))


def read_values(topic, n, timeout=60, keys=False):
    """The first n values (with keys: (key, value) pairs) of `topic` (kafka-python), in offset
    order of its one partition."""
    from kafka import KafkaConsumer, TopicPartition

    from inbox_kafka import bootstrap
    consumer = KafkaConsumer(bootstrap_servers=bootstrap(), group_id=None,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             client_id="eventbox-registry-tests")
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        values = []
        deadline = time.monotonic() + timeout
        while len(values) < n and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                values.extend((r.key, r.value) if keys else r.value for r in records)
        assert len(values) >= n, "read %d of %d records of %s" % (len(values), n, topic)
        return values[:n]
    finally:
        consumer.close(autocommit=False)


def outbox_statuses(ib_db, topic):
    return ib_db.rows("SELECT status, count(*), max(last_error) FROM eventbox.outbox "
                      "WHERE topic = %s GROUP BY 1 ORDER BY 1", (topic,))
