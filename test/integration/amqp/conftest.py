"""Fixtures of the RabbitMQ tests: the environment's node (tools/rabbitmq.sh), a pika channel
and an AMQP destination for a fresh topic, dropped afterwards."""
import os
import pathlib
import subprocess
import sys
import uuid

import pika
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "lib"))

from eventbox_fixtures import cancel_unsent, connect, query  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[3]


class Rabbit:
    """The environment's RabbitMQ node: pika connections, restarts, rabbitmqctl."""

    def __init__(self):
        self.dir = os.environ.get("EVENTBOX_AMQP_DIR")
        self.port = os.environ.get("EVENTBOX_AMQP_PORT")
        if not self.dir or not self.port:
            pytest.fail("EVENTBOX_AMQP_DIR/PORT are not set: the environment has no RabbitMQ "
                        "node (tools/cluster.sh starts one when rabbitmq-server is installed)")

    def channel(self):
        params = pika.ConnectionParameters("127.0.0.1", int(self.port), "/",
                                           pika.PlainCredentials("guest", "guest"),
                                           connection_attempts=30, retry_delay=0.5)
        return pika.BlockingConnection(params).channel()

    def script(self, *args):
        return subprocess.run([str(REPO / "tools" / "rabbitmq.sh"), args[0], self.dir]
                              + list(args[1:]), check=True, capture_output=True, text=True,
                              timeout=180).stdout

    def restart(self):
        self.script("restart")

    def stop(self):
        self.script("stop")

    def start_again(self):
        # `restart` on a stopped node: stop is a no-op, then it starts with its data.
        self.script("restart")

    def ctl(self, *args):
        return self.script("ctl", *args)


@pytest.fixture(scope="session")
def rabbit():
    return Rabbit()


@pytest.fixture
def channel(rabbit):
    ch = rabbit.channel()
    yield ch
    try:
        ch.connection.close()
    except Exception:
        pass


@pytest.fixture
def amqp_topic(extension):
    """amqp_topic(exchange, routing_key=None) -> a fresh topic published to `exchange`."""
    topics = []

    def make(exchange, routing_key=None):
        topic = "a_%s" % uuid.uuid4().hex[:10]
        c = connect()
        try:
            query(c, "SELECT eventbox.create_amqp_destination(%s, %s, %s)",
                  (topic, exchange, routing_key))
        finally:
            c.close()
        topics.append(topic)
        return topic

    yield make
    c = connect()
    try:
        for t in topics:
            cancel_unsent(c, t)
            query(c, "SELECT eventbox.drop_amqp_destination(%s)", (t,))
    finally:
        c.close()
