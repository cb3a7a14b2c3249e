"""Outbox -> RabbitMQ: properties, publisher confirms, mandatory returns, nacks, broker
restarts and cut connections, each reporting lost / duplicated counts (an independent client,
pika, reads the queues)."""
import json
import time
import uuid

from amqp_support import drain
from eventbox_fixtures import (connect, query, query_one, report, wait_outbox_drained,
                               wait_until)


def declare(channel, kind="direct", queue_args=None, bind_key="#", bind_args=None):
    """A fresh durable exchange with one durable queue bound to it."""
    name = "x_%s" % uuid.uuid4().hex[:8]
    channel.exchange_declare(name, kind, durable=True)
    channel.queue_declare(name, durable=True, arguments=queue_args)
    channel.queue_bind(name, name, bind_key, arguments=bind_args)
    return name


def send(topic, n, keys, start=0, headers=None):
    """Sends n messages (payload {"n": i}) round-robin over `keys`; returns their message ids."""
    c = connect()
    try:
        rows = query(c, "SELECT eventbox.send(%s, jsonb_build_object('n', g), 'k' || (g %% %s), "
                        "%s) FROM generate_series(%s, %s) g",
                     (topic, keys, json.dumps(headers or {}), start, start + n - 1))
    finally:
        c.close()
    return [str(r[0]) for r in rows]


def check(test, got, ids, keys):
    """Reports and asserts: every id arrived, duplicates only as copies of a sent message_id,
    and per key the first arrivals in send order."""
    seen = {}
    order = {}
    for props, body in got:
        seen[props.message_id] = seen.get(props.message_id, 0) + 1
        n = json.loads(body)["n"]
        if seen[props.message_id] == 1:
            order.setdefault(n % keys, []).append(n)
    lost = [i for i in ids if i not in seen]
    foreign = [m for m in seen if m not in set(ids)]
    duplicated = sum(c - 1 for c in seen.values())
    report(test, sent=len(ids), lost=len(lost), duplicated=duplicated, foreign=len(foreign))
    assert not lost and not foreign
    for key, ns in order.items():
        assert ns == sorted(ns), "key k%d out of order: %r" % (key, ns[:20])


def collect(channel, queue, ids, timeout=120.0):
    got = []
    wanted = set(ids)

    def done():
        got.extend(drain(channel, queue))
        return wanted <= {p.message_id for p, _ in got}

    wait_until(done, timeout, interval=0.2, what="%d messages in queue %s" % (len(ids), queue))
    time.sleep(0.5)
    got.extend(drain(channel, queue))
    return got


def test_properties_and_key_routing(channel, amqp_topic):
    exchange = declare(channel, "topic", bind_key="k1")
    topic = amqp_topic(exchange)
    ids = send(topic, 6, 2, headers={"event_type": "OrderPlaced", "tenant": "7"})
    wait_outbox_drained(topic)
    got = drain(channel, exchange)
    # Routing by the message key: only k1's three messages reach the queue bound to "k1"...
    # and the k0 ones were returned as unroutable: they are failed, not lost silently.
    assert sorted(json.loads(b)["n"] for _, b in got) == [1, 3, 5]
    props = got[0][0]
    assert props.message_id in ids
    assert props.type == "OrderPlaced"
    assert props.content_type == "application/json"
    assert props.delivery_mode == 2
    assert props.headers == {"event_type": "OrderPlaced", "tenant": "7"}


def test_fixed_routing_key(channel, amqp_topic):
    exchange = declare(channel, "direct", bind_key="all")
    topic = amqp_topic(exchange, "all")
    ids = send(topic, 50, 5)
    check("amqp fixed routing key", collect(channel, exchange, ids), ids, 5)
    wait_outbox_drained(topic)


def test_unroutable_fails_and_key_moves_on(channel, amqp_topic, settings):
    settings.set("eventbox.relay_max_attempts", "2")
    settings.set("eventbox.relay_retry_backoff", "50ms")
    # A headers exchange: the same key, one message routable and one not.
    exchange = declare(channel, "headers", bind_key="",
                       bind_args={"x-match": "all", "route": "yes"})
    topic = amqp_topic(exchange)
    c = connect()
    try:
        bad = str(query_one(c, "SELECT eventbox.send(%s, '{\"n\": 0}'::jsonb, 'k', "
                               "'{\"route\": \"no\"}')", (topic,)))
        good = str(query_one(c, "SELECT eventbox.send(%s, '{\"n\": 1}'::jsonb, 'k', "
                                "'{\"route\": \"yes\"}')", (topic,)))

        def failed():
            return query(c, "SELECT status, attempts, last_error FROM eventbox.outbox "
                            "WHERE message_id = %s AND status = 'failed'", (bad,))
        row = wait_until(failed, 60, what="the unroutable message to be failed")[0]
        assert row[1] == 2
        assert "312 NO_ROUTE" in row[2]
        got = collect(channel, exchange, [good])
        assert [p.message_id for p, _ in got] == [good]
        report("amqp unroutable", failed=1, delivered_after_it=1, lost=0)
    finally:
        c.close()


def test_nack_is_retried(channel, amqp_topic, settings):
    settings.set("eventbox.relay_retry_backoff", "100ms")
    settings.set("eventbox.relay_retry_backoff_max", "500ms")
    # The queue refuses publishes beyond 5 messages: the broker nacks them.
    exchange = declare(channel, "direct", bind_key="all",
                       queue_args={"x-max-length": 5, "x-overflow": "reject-publish"})
    topic = amqp_topic(exchange, "all")
    ids = send(topic, 40, 4)
    c = connect()
    try:
        wait_until(lambda: query_one(c, "SELECT count(*) FROM eventbox.outbox WHERE topic = %s "
                                        "AND last_error LIKE '%%basic.nack%%'", (topic,)),
                   60, what="a nacked publish")
    finally:
        c.close()
    check("amqp nack", collect(channel, exchange, ids), ids, 4)
    wait_outbox_drained(topic)


def test_connections_cut_mid_confirm(rabbit, amqp_topic):
    ch = rabbit.channel()
    exchange = declare(ch, "direct", bind_key="all")
    ch.connection.close()
    topic = amqp_topic(exchange, "all")
    ids = []
    for round_ in range(5):
        ids += send(topic, 400, 16, start=round_ * 400)
        time.sleep(0.05)
        rabbit.ctl("close_all_connections", "test: cut mid-confirm")
    ch = rabbit.channel()
    try:
        check("amqp connection cut mid-confirm", collect(ch, exchange, ids), ids, 16)
    finally:
        ch.connection.close()
    wait_outbox_drained(topic)


def test_broker_restart_while_publishing(rabbit, amqp_topic):
    ch = rabbit.channel()
    exchange = declare(ch, "direct", bind_key="all")
    ch.connection.close()
    topic = amqp_topic(exchange, "all")
    ids = send(topic, 500, 16)
    rabbit.stop()
    ids += send(topic, 500, 16, start=500)  # wait in the outbox while the broker is down
    rabbit.start_again()
    ids += send(topic, 500, 16, start=1000)
    ch = rabbit.channel()
    try:
        check("amqp broker restart while publishing", collect(ch, exchange, ids, timeout=180),
              ids, 16)
    finally:
        ch.connection.close()
    wait_outbox_drained(topic, timeout=120)
