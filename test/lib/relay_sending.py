"""Helpers of the relay's integration tests: a relay known to be publishing, one-row commits
at a steady rate, when their messages reach Kafka, and the statistics views read once the
relay's counts reached them."""
import os
import threading
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from eventbox_fixtures import query, query_one, wait_for_ids


def warm_relay(conn, topic):
    """Sends one message to `topic` and waits for it in Kafka: the relay runs and its producer is
    connected (after a setting that recreates it, too)."""
    wait_for_ids(topic, [query_one(conn, "SELECT eventbox.send(%s, '{}'::jsonb)", (topic,))])


def relay_stat(c, sql):
    """The one value `sql` reads from the statistics views once the relay's counts reached them:
    it reports them at most once a second, at its next pass (an idle one at least every poll
    interval)."""
    time.sleep(2.5)
    query(c, "SELECT pg_stat_clear_snapshot()")
    return query_one(c, sql)


class Arrivals(threading.Thread):
    """Reads the topic's `partitions` from their start while it runs, as a consumer waiting at
    most 1 ms for a fetch: `at` maps each message id to the wall-clock time it arrived. stop()
    ends it."""

    def __init__(self, topic, partitions):
        super().__init__(daemon=True)
        self.topic, self.partitions, self.at = topic, partitions, {}
        self._done, self.error = threading.Event(), None
        self._ready = threading.Event()

    def run(self):
        try:
            consumer = Consumer({"bootstrap.servers": os.environ["EVENTBOX_BOOTSTRAP"],
                                 "group.id": "eventbox-tests-arrivals",
                                 "enable.auto.commit": False, "fetch.wait.max.ms": 1})
            try:
                consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING)
                                 for p in range(self.partitions)])
                self._ready.set()
                while not self._done.is_set():
                    m = consumer.poll(0.02)
                    if m is None or m.error():
                        continue
                    now = time.time()
                    mid = dict(m.headers() or []).get("message_id")
                    if mid is not None:
                        self.at.setdefault(mid.decode(), now)
            finally:
                consumer.close()
        except BaseException as e:  # reported by stop()
            self.error = e
            self._ready.set()

    def start(self):
        super().start()
        self._ready.wait(30)

    def stop(self):
        self._done.set()
        self.join(30)
        if self.error is not None:
            raise self.error


def send_paced(c, topic, n, rate, key_of=None, sent_at=None):
    """Sends n messages through the autocommit connection c, one eventbox.send() per
    transaction, `rate` transactions a second (each due at its time from the start); message i
    has the payload {"seq": i} and the key key_of(i) (none without key_of). Returns their ids,
    in order; with a list `sent_at`, appends the wall-clock time each commit returned."""
    ids = []
    t0 = time.monotonic()
    for i in range(n):
        pause = t0 + i / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        ids.append(str(query_one(
            c, "SELECT eventbox.send(%s, jsonb_build_object('seq', %s::int), key => %s)",
            (topic, i, key_of(i) if key_of else None))))
        if sent_at is not None:
            sent_at.append(time.time())
    return ids
