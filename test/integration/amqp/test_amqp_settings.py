"""RabbitMQ that cannot be used, in both directions: eventbox.amqp_url empty while an AMQP
destination and a subscription with source 'amqp' exist, and a node that refuses the login.
Each shows where a user looks (the rows' last_error in eventbox.outbox, the subscription's row
in eventbox.subscription_errors), never with the password; rows wait and messages stay in their
queue; once RabbitMQ can be used again everything arrives, lost 0, and the errors are gone."""
import json
import time
import uuid

import pika

from amqp_support import drain, sql
from eventbox_fixtures import report, wait_until


def subscribe(queue):
    name = "s_%s" % uuid.uuid4().hex[:8]
    sql("SELECT eventbox.create_subscription(%s, ARRAY[%s], source => 'amqp', "
        "batch_size => 100)", (name, queue))
    return name


def errors_of(sub):
    return [r[0] for r in sql("SELECT error FROM eventbox.subscription_errors "
                              "WHERE subscription = %s", (sub,))]


def stored(sub):
    return {r[0] for r in sql("SELECT message_id FROM eventbox.inbox WHERE subscription = %s",
                              (sub,))}


def outbox_errors(topic):
    """(status, attempts, last_error) of the topic's rows still in the outbox."""
    return [tuple(r) for r in sql("SELECT status, attempts, last_error FROM eventbox.outbox "
                                  "WHERE topic = %s", (topic,))]


def send(topic, n):
    rows = sql("SELECT eventbox.send(%s, jsonb_build_object('n', g), 'k' || (g %% 4)) "
               "FROM generate_series(1, %s) g", (topic, n))
    return [str(r[0]) for r in rows]


def publish(channel, queue, ids):
    for i in ids:
        channel.basic_publish("", queue, json.dumps({"id": i}),
                              pika.BasicProperties(message_id=i, delivery_mode=2))


def received(channel, queue, ids, timeout=120.0):
    got = set()

    def done():
        got.update(p.message_id for p, _ in drain(channel, queue))
        return set(ids) <= got

    wait_until(done, timeout, interval=0.3, what="%d messages in %s" % (len(ids), queue))
    return got


def recovered(test, channel, exchange, ids, sub, messages, timeout, **figures):
    """Once RabbitMQ can be used again: the rows `ids` arrive in the exchange's queue, the
    `messages` in the subscription's inbox, its error row goes; reports and asserts lost 0."""
    got = received(channel, exchange, ids, timeout=timeout)
    wait_until(lambda: set(messages) <= stored(sub), timeout, interval=0.3,
               what="the messages of %s in the inbox" % sub)
    wait_until(lambda: not errors_of(sub), 60, interval=0.3,
               what="the row of %s gone from eventbox.subscription_errors" % sub)
    lost = len(set(ids) - got) + len(set(messages) - stored(sub))
    report(test, sent=len(ids) + len(messages), lost=lost, **figures)
    assert lost == 0


def clean_up(channel, sub, queue, exchange):
    sql("SELECT eventbox.drop_subscription(%s)", (sub,))
    channel.queue_delete(queue)
    channel.queue_delete(exchange)
    channel.exchange_delete(exchange)


def declare(channel):
    name = "x_%s" % uuid.uuid4().hex[:8]
    channel.exchange_declare(name, "fanout", durable=True)
    channel.queue_declare(name, durable=True)
    channel.queue_bind(name, name)
    return name


def test_empty_url_listed_for_destinations_and_subscriptions(extension, channel, amqp_topic):
    exchange = declare(channel)
    queue = "q_%s" % uuid.uuid4().hex[:8]
    channel.queue_declare(queue, durable=True)
    topic = amqp_topic(exchange)
    sub = subscribe(queue)
    url = sql("SHOW eventbox.amqp_url")[0][0]
    try:
        sql("ALTER SYSTEM SET eventbox.amqp_url = ''")
        sql("SELECT pg_reload_conf()")
        wait_until(lambda: any("eventbox.amqp_url is empty" in e for e in errors_of(sub)), 60,
                   interval=0.3, what="the empty URL listed for %s" % sub)
        ids = send(topic, 40)
        # A key's first row fails (its last_error says why); the rows behind it wait.
        wait_until(lambda: any(e and "eventbox.amqp_url is empty" in e
                               for _, _, e in outbox_errors(topic)), 60, interval=0.3,
                   what="the empty URL as last_error of the rows of %s" % topic)
        rows = outbox_errors(topic)
        assert len(rows) == len(ids) and all(s == "pending" for s, _, _ in rows), rows
        assert all("reload" in e for _, _, e in rows if e), rows
        messages = ["u%03d" % i for i in range(40)]
        publish(channel, queue, messages)
        time.sleep(1)
        assert not stored(sub)
        assert not drain(channel, exchange)  # nothing went anywhere else meanwhile
    finally:
        sql("ALTER SYSTEM SET eventbox.amqp_url = %s", (url,))
        sql("SELECT pg_reload_conf()")
    try:
        recovered("amqp empty url listed, then delivered and consumed", channel, exchange, ids,
                  sub, messages, timeout=120)
    finally:
        clean_up(channel, sub, queue, exchange)


def test_refused_login_listed_without_password_then_recovered(extension, rabbit, amqp_topic):
    # eventbox logs in as guest/guest (the test environment's eventbox.amqp_options): the node
    # is made to refuse that login by changing guest's password, and all connections are cut.
    # This test's own client uses a user of its own.
    tester, secret = "t_%s" % uuid.uuid4().hex[:8], uuid.uuid4().hex
    rabbit.ctl("add_user", tester, secret)
    rabbit.ctl("set_permissions", "-p", "/", tester, ".*", ".*", ".*")

    def open_channel():
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", int(rabbit.port), "/", pika.PlainCredentials(tester, secret))).channel()

    ch = open_channel()
    exchange = declare(ch)
    queue = "q_%s" % uuid.uuid4().hex[:8]
    ch.queue_declare(queue, durable=True)
    topic = amqp_topic(exchange)
    sub = subscribe(queue)
    wait_until(lambda: sql("SELECT count(*) FROM eventbox.offsets WHERE subscription = %s",
                           (sub,))[0][0] > 0 or not errors_of(sub), 60, interval=0.3,
               what="%s consuming" % sub)
    try:
        rabbit.ctl("change_password", "guest", uuid.uuid4().hex)
        rabbit.ctl("close_all_connections", "eventbox test: refused login")
        ch = open_channel()  # this client's connection was cut too
        wait_until(lambda: any("ACCESS_REFUSED" in e or "login" in e for e in errors_of(sub)),
                   90, interval=0.3, what="the refused login listed for %s" % sub)
        [error] = errors_of(sub)
        assert "guest" not in error, error
        ids = send(topic, 40)
        wait_until(lambda: any(e and "login" in e for _, _, e in outbox_errors(topic)), 90,
                   interval=0.3, what="the refused login as last_error of the rows of %s" % topic)
        rows = outbox_errors(topic)
        assert len(rows) == len(ids), rows
        assert all(s == "pending" and "guest" not in (e or "") for s, _, e in rows), rows
        messages = ["v%03d" % i for i in range(40)]
        publish(ch, queue, messages)
        time.sleep(1)
        assert not stored(sub)
        # Retried with backoff: a few attempts in these seconds, not one per pass.
        attempts = max(a for _, a, _ in outbox_errors(topic))
        assert 1 <= attempts <= 10, attempts
    finally:
        rabbit.ctl("change_password", "guest", "guest")
    try:
        # Reconnects back off up to 30 s, retries of a row up to relay_retry_backoff_max.
        recovered("amqp refused login listed, then delivered and consumed", ch, exchange, ids,
                  sub, messages, timeout=180, attempts=attempts)
    finally:
        clean_up(ch, sub, queue, exchange)
        ch.connection.close()
        rabbit.ctl("delete_user", tester)
