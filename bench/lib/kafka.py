"""Kafka as the sections use it around the extension: topics filled in bulk beforehand, and
their watermarks read to check what the broker holds."""

import time

from confluent_kafka import Consumer, Producer, TopicPartition

from .common import BenchError


def produce(env, topic, partitions, records, flush_s=120):
    """Creates `topic` with `partitions` partitions and produces `records` ((value, key,
    partition, headers) each) to it; returns the seconds it took. Checks that the broker holds
    every record: the dev broker drops the oldest sets beyond ~5 MiB per partition."""
    env.broker.create_topic(topic, partitions)
    p = Producer({"bootstrap.servers": env.bootstrap, "linger.ms": 20,
                  "enable.idempotence": True, "batch.num.messages": 10000,
                  "queue.buffering.max.messages": 1000000,
                  "queue.buffering.max.kbytes": 1048576})
    failed = []

    def on_delivery(err, _msg):
        if err is not None:
            failed.append(err)

    t0 = time.monotonic()
    n = 0
    for value, key, partition, headers in records:
        while True:
            try:
                p.produce(topic, value, key=key, partition=partition, headers=headers,
                          on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
        n += 1
    if p.flush(flush_s) != 0 or failed:
        raise BenchError("producing to %s: %d undelivered, %d failed"
                         % (topic, len(p), len(failed)))
    elapsed = time.monotonic() - t0
    check_topic(env, topic, partitions, n)
    return elapsed


class Watermarks:
    """The watermarks of a topic's partitions, added up (one consumer kept open)."""

    def __init__(self, env, topic, partitions):
        self.topic, self.partitions = topic, partitions
        self.c = Consumer({"bootstrap.servers": env.bootstrap, "group.id": "eventbox-bench-wm",
                           "enable.auto.commit": False})

    def low_high(self):
        lo = hi = 0
        for p in range(self.partitions):
            a, b = self.c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)
            lo, hi = lo + a, hi + b
        return lo, hi

    def high(self):
        return self.low_high()[1]

    def close(self):
        self.c.close()


def watermarks(env, topic, partitions):
    """(low, high) watermarks of a topic, each added up over its partitions."""
    wm = Watermarks(env, topic, partitions)
    try:
        return wm.low_high()
    finally:
        wm.close()


def check_topic(env, topic, partitions, n):
    """The topic holds offsets 0..n, added up over its partitions."""
    lo, hi = watermarks(env, topic, partitions)
    if lo != 0 or hi != n:
        raise BenchError("topic %s holds offsets adding up to %d..%d, expected 0..%d: the dev "
                         "broker dropped records (more partitions or fewer messages needed)"
                         % (topic, lo, hi, n))
