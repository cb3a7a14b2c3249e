"""Behaviour tests for eventbox-devbroker (tools/devbroker).

Run: /usr/bin/python3 -m pytest test/devbroker
The binary comes from $EVENTBOX_DEVBROKER (default
tools/devbroker/eventbox-devbroker under the repo root); nothing is built here.
Kafka traffic uses two independent clients from Debian: kafka-python
(python3-kafka) and confluent_kafka (python3-confluent-kafka).
"""

import os
import pathlib
import signal
import socket
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "test" / "lib"))

import devbroker  # noqa: E402
from devbroker import DevBroker, DevBrokerError  # noqa: E402

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

BINARY = pathlib.Path(os.environ.get(
    "EVENTBOX_DEVBROKER", "tools/devbroker/eventbox-devbroker"))
if not BINARY.is_absolute():
    BINARY = REPO / BINARY

API_PRODUCE = 0
ERR_TOPIC_AUTHORIZATION_FAILED = 29   # non-retriable
ERR_NOT_LEADER_FOR_PARTITION = 6      # retriable
ERR_INVALID_RECORD = 87               # non-retriable, per batch


@pytest.fixture
def binary():
    if not BINARY.exists():
        pytest.fail("dev broker binary not found: %s (build it first)" % BINARY)
    return BINARY


class Running:
    """A started broker: process, bootstrap string and control client."""

    def __init__(self, binary, **kw):
        self.proc, self.bootstrap, host, port = devbroker.start(binary, **kw)
        self.ctl = DevBroker(host, port)
        self.host, self.port = host, port

    def stop(self):
        self.ctl.close()
        return devbroker.stop(self.proc)


@pytest.fixture
def broker(binary):
    b = Running(binary)
    yield b
    assert b.stop() == 0


def confluent_producer(bootstrap, **extra):
    conf = {"bootstrap.servers": bootstrap, "linger.ms": 0,
            "enable.idempotence": False, "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 200, "log_level": 2}
    conf.update(extra)
    return confluent_kafka.Producer(conf)


def produce_one(producer, topic, value, timeout=30.0):
    """Produces one message and returns its delivery report (err, msg)."""
    reports = []
    producer.produce(topic, value=value, partition=0,
                     on_delivery=lambda err, msg: reports.append((err, msg)))
    deadline = time.monotonic() + timeout
    while not reports and time.monotonic() < deadline:
        producer.poll(0.1)
    assert reports, "no delivery report within %.0fs" % timeout
    return reports[0]


def partition_count(bootstrap, topic):
    p = confluent_producer(bootstrap)
    md = p.list_topics(topic, timeout=10)
    t = md.topics[topic]
    assert t.error is None, t.error
    return len(t.partitions)


# --- startup, ready line, shutdown -------------------------------------------

def test_ready_line_file_and_multiple_brokers(binary, tmp_path):
    ready = tmp_path / "ready"
    b = Running(binary, brokers=3, extra_args=["--ready-file", str(ready)])
    try:
        addrs = b.bootstrap.split(",")
        assert len(addrs) == 3
        assert all(a.startswith("127.0.0.1:") for a in addrs)
        assert b.host == "127.0.0.1"
        line = ready.read_text()
        assert line == "bootstrap=%s control=127.0.0.1:%d\n" % (
            b.bootstrap, b.port)
        assert b.ctl.ping() == "pong"
        assert b.ctl.bootstrap() == b.bootstrap
        # A real client sees all three brokers.
        md = confluent_producer(b.bootstrap).list_topics(timeout=10)
        assert sorted(md.brokers) == [1, 2, 3]
    finally:
        assert b.stop() == 0


def test_quit_exits_zero(binary):
    b = Running(binary)
    b.ctl.quit()
    assert b.proc.wait(10) == 0


def test_sigint_exits_zero(binary):
    b = Running(binary)
    b.proc.send_signal(signal.SIGINT)
    assert b.proc.wait(10) == 0
    b.stop()


def test_bad_command_line_fails(binary):
    import subprocess
    r = subprocess.run([str(binary), "--brokers", "zero"],
                       capture_output=True, timeout=10)
    assert r.returncode != 0
    assert r.stdout == b""


# --- Kafka data path -----------------------------------------------------------

def test_kafka_python_produce_confluent_consume(broker):
    topic = "roundtrip"
    broker.ctl.create_topic(topic, 3)
    assert partition_count(broker.bootstrap, topic) == 3

    prod = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all",
                               linger_ms=5)
    futures = []
    for i in range(100):
        headers = [("seq", str(i).encode()), ("origin", b"kafka-python")]
        futures.append(prod.send(topic, key=b"key-%d" % (i % 10),
                                 value=b"value-%d" % i, headers=headers))
    prod.flush(30)
    metas = [f.get(timeout=30) for f in futures]
    prod.close(10)
    assert {m.partition for m in metas} <= {0, 1, 2}
    assert len({m.partition for m in metas}) > 1  # keys spread out

    cons = confluent_kafka.Consumer({
        "bootstrap.servers": broker.bootstrap, "group.id": "devbroker-test",
        "enable.auto.commit": False, "log_level": 2})
    cons.assign([confluent_kafka.TopicPartition(
        topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(3)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 100 and time.monotonic() < deadline:
        m = cons.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append(m)
    cons.close()
    assert len(got) == 100

    by_seq = {}
    for m in got:
        hdrs = dict(m.headers())
        assert hdrs["origin"] == b"kafka-python"
        seq = int(hdrs["seq"])
        assert m.value() == b"value-%d" % seq
        assert m.key() == b"key-%d" % (seq % 10)
        by_seq[seq] = m
    assert sorted(by_seq) == list(range(100))
    # Same partition and offset as the producer was told.
    for i, meta in enumerate(metas):
        assert by_seq[i].partition() == meta.partition
        assert by_seq[i].offset() == meta.offset
    # One key -> one partition, in produce order.
    for k in range(10):
        msgs = [by_seq[i] for i in range(k, 100, 10)]
        assert len({m.partition() for m in msgs}) == 1
        offsets = [m.offset() for m in msgs]
        assert offsets == sorted(offsets)


def test_topic_auto_creation_and_default_partitions(binary):
    b = Running(binary, partitions=6)
    try:
        # Metadata for an unknown topic auto-creates it with the mock's
        # hard-wired 4 partitions (not --partitions).
        assert partition_count(b.bootstrap, "auto_created") == 4
        # create_topic without a count uses --partitions.
        b.ctl.create_topic("explicit")
        assert partition_count(b.bootstrap, "explicit") == 6
        with pytest.raises(DevBrokerError, match="TOPIC_ALREADY_EXISTS"):
            b.ctl.create_topic("explicit", 2)
        # kafka-python auto-creates on first send too.
        prod = kafka.KafkaProducer(bootstrap_servers=b.bootstrap)
        prod.send("auto_kp", b"x").get(timeout=30)
        assert prod.partitions_for("auto_kp") == {0, 1, 2, 3}
        prod.close(10)
    finally:
        assert b.stop() == 0


# --- fault injection -------------------------------------------------------------

def test_broker_down_and_up(broker):
    topic = "downup"
    broker.ctl.create_topic(topic, 1)
    p = confluent_producer(broker.bootstrap, **{"message.timeout.ms": 1500})
    err, _ = produce_one(p, topic, b"before")
    assert err is None

    port = int(broker.bootstrap.split(":")[1])
    broker.ctl.broker_down("all")
    # The down broker refuses new connections ...
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    # ... so a produce with a short timeout fails.
    err, _ = produce_one(p, topic, b"while-down")
    assert err is not None
    assert err.code() == confluent_kafka.KafkaError._MSG_TIMED_OUT

    broker.ctl.broker_up("all")
    assert broker.ctl.bootstrap() == broker.bootstrap  # same port after up
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    p2 = confluent_producer(broker.bootstrap, **{"message.timeout.ms": 15000})
    err, msg = produce_one(p, topic, b"after-up-same-producer")
    assert err is None, err
    err, msg = produce_one(p2, topic, b"after-up")
    assert err is None, err
    p.flush(5)
    p2.flush(5)


def test_broker_down_single_broker_of_three(binary):
    b = Running(binary, brokers=3)
    try:
        ports = [int(a.split(":")[1]) for a in b.bootstrap.split(",")]
        b.ctl.broker_down(2)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", ports[1]), timeout=5)
        socket.create_connection(("127.0.0.1", ports[0]), timeout=5).close()
        b.ctl.broker_up(2)
        socket.create_connection(("127.0.0.1", ports[1]), timeout=5).close()
    finally:
        assert b.stop() == 0


def test_inject_errors_kafka_python_sees_error(broker):
    topic = "inject_kp"
    broker.ctl.create_topic(topic, 1)
    prod = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, retries=0,
                               acks=1)
    prod.send(topic, b"warmup").get(timeout=30)
    broker.ctl.inject_errors(API_PRODUCE, [ERR_TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
        prod.send(topic, b"fails").get(timeout=30)
    # The injected error is used up: the next produce succeeds.
    meta = prod.send(topic, b"recovered").get(timeout=30)
    assert meta.offset == 1  # "fails" was never stored
    prod.close(10)


def test_inject_errors_confluent_fail_then_recover(broker):
    topic = "inject_ck"
    broker.ctl.create_topic(topic, 1)
    p = confluent_producer(broker.bootstrap, **{"message.send.max.retries": 0})
    assert produce_one(p, topic, b"warmup")[0] is None
    # Two non-retriable errors: two messages fail in turn, then OK.
    broker.ctl.inject_errors(API_PRODUCE, [ERR_INVALID_RECORD] * 2)
    for _ in range(2):
        err, _ = produce_one(p, topic, b"fails")
        assert err is not None
        assert err.code() == ERR_INVALID_RECORD
    err, msg = produce_one(p, topic, b"ok")
    assert err is None, err
    assert msg.offset() == 1

    # Retriable errors: librdkafka retries them and delivers anyway, using up
    # the injected errors (checked below with a no-retry kafka-python
    # producer, which would otherwise see NotLeaderForPartition).
    broker.ctl.inject_errors(API_PRODUCE, [ERR_NOT_LEADER_FOR_PARTITION] * 3)
    retrying = confluent_producer(broker.bootstrap,
                                  **{"retry.backoff.ms": 10})
    err, msg = produce_one(retrying, topic, b"retried")
    assert err is None, err
    assert msg.offset() == 2
    kp = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, retries=0)
    assert kp.send(topic, b"after", partition=0).get(timeout=30).offset == 3
    kp.close(10)


def test_inject_retriable_error_seen_without_retries(broker):
    topic = "inject_retriable"
    broker.ctl.create_topic(topic, 1)
    kp = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, retries=0)
    kp.send(topic, b"warmup").get(timeout=30)
    broker.ctl.inject_errors(API_PRODUCE, [ERR_NOT_LEADER_FOR_PARTITION])
    with pytest.raises(kafka.errors.NotLeaderForPartitionError):
        kp.send(topic, b"fails").get(timeout=30)
    assert kp.send(topic, b"ok").get(timeout=30).offset == 1
    kp.close(10)


def test_clear_errors(broker):
    topic = "cleared"
    broker.ctl.create_topic(topic, 1)
    p = confluent_producer(broker.bootstrap, **{"message.send.max.retries": 0})
    assert produce_one(p, topic, b"warmup")[0] is None
    broker.ctl.inject_errors(API_PRODUCE, [ERR_TOPIC_AUTHORIZATION_FAILED])
    broker.ctl.clear_errors(API_PRODUCE)
    assert produce_one(p, topic, b"ok")[0] is None


def test_broker_rtt_delays_responses(broker):
    topic = "slow"
    broker.ctl.create_topic(topic, 1)
    p = confluent_producer(broker.bootstrap)
    assert produce_one(p, topic, b"warmup")[0] is None
    broker.ctl.broker_rtt(1, 600)
    t0 = time.monotonic()
    assert produce_one(p, topic, b"slow")[0] is None
    assert time.monotonic() - t0 >= 0.5
    broker.ctl.broker_rtt("all", 0)
    t0 = time.monotonic()
    assert produce_one(p, topic, b"fast")[0] is None
    assert time.monotonic() - t0 < 0.5


# --- TCP_NODELAY on the broker side ---------------------------------------------

def broker_sockets(broker):
    """(accepted Kafka connections, how many have TCP_NODELAY) from the broker."""
    reply = broker.ctl.command("sockets")
    fields = dict(kv.split("=") for kv in reply.split())
    return int(fields["connections"]), int(fields["nodelay"])


def test_accepted_connections_have_tcp_nodelay(binary):
    # The option itself, read back by the broker process with getsockopt() on
    # every accepted connection (a client cannot see the peer's option).
    b = Running(binary, brokers=3)
    try:
        assert broker_sockets(b) == (0, 0)
        b.ctl.create_topic("nodelay", 6, 1)
        p = confluent_producer(b.bootstrap)
        for part in range(6):
            p.produce("nodelay", b"x", partition=part)
        assert p.flush(10) == 0
        kp = kafka.KafkaProducer(bootstrap_servers=b.bootstrap)
        kp.send("nodelay", b"y", partition=0).get(timeout=10)
        conns, nodelay = broker_sockets(b)
        assert conns >= 3  # at least one per broker (partition leaders)
        assert nodelay == conns
        kp.close()
    finally:
        assert b.stop() == 0


def test_produce_round_trip_over_partitions_is_not_delayed(broker):
    # What the option changes: one flush of small messages to 8 partitions
    # (acks=all, linger.ms=0) took ~44 ms without it (the response waited for
    # the client's delayed ACK behind Nagle), well under 1 ms with it.
    topic = "roundtrips"
    broker.ctl.create_topic(topic, 8)
    p = confluent_producer(broker.bootstrap, acks="all")

    def flush_ms():
        t0 = time.monotonic()
        for part in range(8):
            p.produce(topic, b"x" * 100, partition=part)
        assert p.flush(10) == 0
        return (time.monotonic() - t0) * 1000

    for _ in range(5):
        flush_ms()
    times = sorted(flush_ms() for _ in range(40))
    assert times[len(times) // 2] < 20, times


# --- control protocol ------------------------------------------------------------

BAD_COMMANDS = [
    "frobnicate",
    "PING",
    "ping extra",
    "create_topic",
    "create_topic t 0",
    "create_topic t -3",
    "create_topic t abc",
    "create_topic t 3 2",          # replication > brokers
    "create_topic bad/name 1",
    "create_topic t 1 1 extra",
    "broker_down",
    "broker_down 0",
    "broker_down 2",
    "broker_down -1",
    "broker_up x",
    "inject_errors",
    "inject_errors 0",
    "inject_errors x 6",
    "inject_errors 0 6,,6",
    "inject_errors 0 6,",
    "inject_errors 0 99999999999999999999",
    "inject_errors -1 6",
    "broker_rtt 1",
    "broker_rtt 1 -5",
    "broker_rtt 9 5",
    "clear_errors",
    "quit now",
    "sockets all",
]


@pytest.mark.parametrize("cmd", BAD_COMMANDS)
def test_bad_commands_get_err(broker, cmd):
    with pytest.raises(DevBrokerError):
        broker.ctl.command(cmd)
    assert broker.ctl.ping() == "pong"  # same connection still works


def test_raw_protocol(broker):
    s = socket.create_connection((broker.host, broker.port), timeout=5)
    f = s.makefile("rwb")
    f.write(b"ping\r\nbootstrap\n\nnope 1 2\ncreate_topic raw 2\n")
    f.flush()
    assert f.readline() == b"OK pong\n"
    assert f.readline() == ("OK %s\n" % broker.bootstrap).encode()
    assert f.readline().startswith(b"ERR ")
    assert f.readline().startswith(b"ERR unknown command")
    assert f.readline() == b"OK\n"
    # An over-long line gets one ERR and is skipped; the connection and the
    # broker keep working.
    f.write(b"x" * 100000 + b"\nping\n")
    f.flush()
    assert f.readline() == b"ERR line too long\n"
    assert f.readline() == b"OK pong\n"
    s.close()
    assert broker.ctl.ping() == "pong"


def test_idle_client_does_not_block_others(broker):
    idle = socket.create_connection((broker.host, broker.port), timeout=5)
    idle.sendall(b"pin")  # partial line, never finished
    other = DevBroker(broker.host, broker.port, timeout=5)
    assert other.ping() == "pong"
    assert broker.ctl.ping() == "pong"
    idle.sendall(b"g\n")
    assert idle.makefile("rb").readline() == b"OK pong\n"
    idle.close()
    other.close()


def test_quit_reply_before_exit(broker):
    other = socket.create_connection((broker.host, broker.port), timeout=5)
    broker.ctl.command("quit")
    assert broker.proc.wait(10) == 0
    other.close()
