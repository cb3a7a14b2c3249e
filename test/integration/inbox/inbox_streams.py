"""What the inbox tests that stream records under faults share (test/integration/inbox and
test/fault/inbox): a paced producer thread, and the Schema Registry the workers use."""
import threading
import time

import pytest

from inbox_support import new_producer
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
