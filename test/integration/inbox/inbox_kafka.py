"""Kafka helpers of the inbox tests (kafka-python, a client independent of the extension's
librdkafka): producers, headers the wire format allows but kafka-python does not, end offsets
and the dev broker's control interface. The tests import from here what they produce and read
with."""

import collections
import json
import os

from inbox_env import poll

from eventbox_fixtures import env

from devbroker import DevBroker

from kafka import KafkaConsumer, KafkaProducer, TopicPartition  # kafka-python
from kafka.record.default_records import DefaultRecordBatchBuilder

# kafka-python only takes str header names and bytes values. These two markers, translated
# back at the lowest level (the record batch builder), let a test send a header whose name is
# arbitrary bytes, or whose value is null (-1 length), which the wire format allows.
NULL_HEADER = b"\x00eventbox-tests:null-header-value\x00"
_RAW_NAME_PREFIX = "\ue000eventbox-tests-raw-name:"


def raw_header_name(data):
    """A header name made of arbitrary bytes (e.g. not UTF-8), for KafkaProducer.send()."""
    return _RAW_NAME_PREFIX + bytes(data).hex()


class _RawName(str):
    raw = b""

    def encode(self, *args, **kwargs):
        return self.raw


def _wire_headers(headers):
    out = []
    for name, value in headers:
        if isinstance(name, str) and name.startswith(_RAW_NAME_PREFIX):
            raw = _RawName(name)
            raw.raw = bytes.fromhex(name[len(_RAW_NAME_PREFIX):])
            name = raw
        if value == NULL_HEADER:
            value = None
        out.append((name, value))
    return out


if not getattr(DefaultRecordBatchBuilder.append, "_eventbox_raw_headers", False):
    _original_append = DefaultRecordBatchBuilder.append

    def _append(self, offset, timestamp, key, value, headers, *args, **kwargs):
        return _original_append(self, offset, timestamp, key, value, _wire_headers(headers),
                                *args, **kwargs)

    _append._eventbox_raw_headers = True
    DefaultRecordBatchBuilder.append = _append


def header_json_name(data):
    """How the inbox writes a header name or value: the text when UTF-8 (without NUL), else
    "\\x" + hex."""
    try:
        text = data.decode("utf-8")
        if "\x00" not in text:
            return text
    except UnicodeDecodeError:
        pass
    return "\\x" + data.hex()


def bootstrap():
    return env("EVENTBOX_BOOTSTRAP")


def devbroker():
    return DevBroker(os.environ.get("EVENTBOX_CONTROL_HOST") or "127.0.0.1",
                     int(env("EVENTBOX_CONTROL_PORT")))


def new_producer(**extra):
    conf = dict(bootstrap_servers=bootstrap(), acks="all", linger_ms=5, retries=0,
                batch_size=256 * 1024, max_request_size=16 * 1024 * 1024,
                buffer_memory=128 * 1024 * 1024, client_id="eventbox-inbox-tests",
                max_in_flight_requests_per_connection=1)
    conf.update(extra)
    return KafkaProducer(**conf)


Sent = collections.namedtuple("Sent", "topic partition offset key value headers")


def produce(producer, topic, records, timeout=120.0):
    """Produces records (dicts with value and optional key, headers, partition) and waits for
    every acknowledgement; returns a list of Sent (with the partition and offset given by the
    broker) in the order of `records`."""
    futures = []
    for r in records:
        futures.append(producer.send(topic, value=r.get("value"), key=r.get("key"),
                                     headers=list(r.get("headers", [])),
                                     partition=r.get("partition")))
    producer.flush(timeout=timeout)
    out = []
    for r, f in zip(records, futures):
        md = f.get(timeout=timeout)
        out.append(Sent(topic, md.partition, md.offset, r.get("key"), r.get("value"),
                        list(r.get("headers", []))))
    return out


def end_offsets(topic, partitions=None):
    """{(topic, partition): end offset (high watermark)} read with kafka-python."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap(), group_id=None,
                             enable_auto_commit=False, client_id="eventbox-inbox-tests")
    try:
        if partitions is None:
            parts = poll(lambda: consumer.partitions_for_topic(topic), 30,
                         "metadata of topic %s" % topic)
        else:
            parts = range(partitions)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        ends = consumer.end_offsets(tps)
        return {(tp.topic, tp.partition): off for tp, off in ends.items()}
    finally:
        consumer.close(autocommit=False)


def json_value(obj):
    return json.dumps(obj, separators=(",", ":")).encode()

