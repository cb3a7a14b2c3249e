"""RabbitMQ subscriptions in eventbox.subscription_errors: a queue that does not exist (404 on
basic.consume) and a node that refuses the connection each show with their reason, without the
credentials, and disappear once consumption works again; the messages then flow, lost 0."""
import json
import time
import uuid

import pika

from eventbox_fixtures import connect, query, report, wait_until


def subscribe(queues):
    name = "s_%s" % uuid.uuid4().hex[:8]
    c = connect()
    try:
        query(c, "SELECT eventbox.create_subscription(%s, %s, source => 'amqp', "
                 "batch_size => 100)", (name, queues))
    finally:
        c.close()
    return name


def drop(name):
    c = connect()
    try:
        query(c, "SELECT eventbox.drop_subscription(%s)", (name,))
    finally:
        c.close()


def errors_of(sub):
    c = connect()
    try:
        return [tuple(r) for r in query(
            c, "SELECT error, attempts, ingest_worker FROM eventbox.subscription_errors "
               "WHERE subscription = %s", (sub,))]
    finally:
        c.close()


def stored(sub):
    c = connect()
    try:
        return {r[0] for r in query(c, "SELECT message_id FROM eventbox.inbox "
                                       "WHERE subscription = %s", (sub,))}
    finally:
        c.close()


def publish(channel, queue, ids):
    for i in ids:
        channel.basic_publish("", queue, json.dumps({"id": i}),
                              pika.BasicProperties(message_id=i, delivery_mode=2))


def test_missing_queue_listed_until_declared(extension, channel):
    queue = "q_missing_%s" % uuid.uuid4().hex[:8]
    sub = subscribe([queue])
    ids = ["m%04d" % i for i in range(100)]
    try:
        wait_until(lambda: errors_of(sub), 60, interval=0.3,
                   what="a row of %s in eventbox.subscription_errors" % sub)
        [(error, attempts, worker)] = errors_of(sub)
        assert "404" in error and queue in error, error
        assert "basic.consume" in error, error
        assert attempts == 0 and worker >= 1
        channel.queue_declare(queue, durable=True)
        publish(channel, queue, ids)
        # The channel is opened again after its backoff (1 s doubling, at most 30 s).
        wait_until(lambda: set(ids) <= stored(sub), 120, interval=0.3,
                   what="the messages of %s in the inbox" % sub)
        wait_until(lambda: not errors_of(sub), 30, interval=0.3,
                   what="the row of %s gone from eventbox.subscription_errors" % sub)
        lost = len(set(ids) - stored(sub))
        report("amqp missing queue listed, then consumed", sent=len(ids), lost=lost)
        assert lost == 0
    finally:
        drop(sub)
        channel.queue_delete(queue)


def test_refused_connection_listed_without_credentials(extension, channel):
    queue = "q_%s" % uuid.uuid4().hex[:8]
    channel.queue_declare(queue, durable=True)
    sub = subscribe([queue])
    ids = ["r%04d" % i for i in range(100)]
    c = connect()
    try:
        # A port nothing listens on (port 1 is privileged and unused on loopback).
        query(c, "ALTER SYSTEM SET eventbox.amqp_url = 'amqp://127.0.0.1:1/%2f'")
        query(c, "SELECT pg_reload_conf()")
        wait_until(lambda: any("not connected to RabbitMQ" in e for e, _, _ in errors_of(sub)),
                   60, interval=0.3, what="the refused connection of %s listed" % sub)
        [(error, _, _)] = errors_of(sub)
        assert "connect" in error, error
        assert "guest" not in error, error  # the test environment's user and password
        publish(channel, queue, ids)
        time.sleep(1)
        assert not (set(ids) & stored(sub))
    finally:
        query(c, "ALTER SYSTEM RESET eventbox.amqp_url")
        query(c, "SELECT pg_reload_conf()")
        c.close()
    try:
        wait_until(lambda: set(ids) <= stored(sub), 120, interval=0.3,
                   what="the messages of %s in the inbox" % sub)
        wait_until(lambda: not errors_of(sub), 30, interval=0.3,
                   what="the row of %s gone from eventbox.subscription_errors" % sub)
        lost = len(set(ids) - stored(sub))
        report("amqp refused connection listed, then consumed", sent=len(ids), lost=lost)
        assert lost == 0
    finally:
        drop(sub)
        channel.queue_delete(queue)
