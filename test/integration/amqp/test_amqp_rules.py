"""message_id_rule on RabbitMQ deliveries: the same rules as for Kafka records, through the same
code (inbox::classify(), order_rows()). 'debezium' and 'cockroachdb' take the id from the
change's position (a change delivered again, under another AMQP message_id, is stored once) and
the operation as event type; a CockroachDB resolved timestamp is not stored, its offset is;
'fingerprint' takes the id from the body whatever the message_id property says."""
import json
import uuid

import pika

from amqp_support import sql
from eventbox_fixtures import report, wait_until


def consume(channel, rule, bodies):
    """A fresh queue holding `bodies` (each with a message_id property of its own), consumed by a
    subscription with `rule` until its offset is past them all; returns (sub, queue, rows)."""
    queue = "q_%s" % uuid.uuid4().hex[:8]
    channel.queue_declare(queue, durable=True)
    for body in bodies:
        channel.basic_publish("", queue, body, pika.BasicProperties(
            message_id="amqp-%s" % uuid.uuid4().hex, delivery_mode=2))
    sub = "s_%s" % uuid.uuid4().hex[:8]
    sql("SELECT eventbox.create_subscription(%s, ARRAY[%s], source => 'amqp', "
        "message_id_rule => %s)", (sub, queue, rule))

    def offset():
        rows = sql("SELECT coalesce(sum(next_offset), 0) FROM eventbox.offsets "
                   "WHERE subscription = %s", (sub,))
        return int(rows[0][0])

    wait_until(lambda: offset() >= len(bodies), 90, interval=0.3,
               what="%d deliveries of %s stored" % (len(bodies), queue))
    rows = sql("SELECT message_id, event_type, status FROM eventbox.inbox "
               "WHERE subscription = %s ORDER BY message_id", (sub,))
    return sub, queue, [tuple(r) for r in rows]


def drop(channel, sub, queue):
    sql("SELECT eventbox.drop_subscription(%s)", (sub,))
    channel.queue_delete(queue)


def debezium(op, after, lsn, ts_ms):
    """A PostgreSQL connector change event (JSON converter, schemas enabled)."""
    payload = {
        "before": None, "after": after,
        "source": {"version": "2.7.0.Final", "connector": "postgresql",
                   "name": "PostgreSQL_server", "ts_ms": 1559033904863, "snapshot": "false",
                   "db": "postgres", "sequence": json.dumps([str(lsn - 9), str(lsn)]),
                   "schema": "public", "table": "customers", "txId": 556, "lsn": lsn,
                   "xmin": None},
        "op": op, "ts_ms": ts_ms}
    return json.dumps({"schema": {"type": "struct", "optional": False,
                                  "name": "PostgreSQL_server.public.customers.Envelope"},
                       "payload": payload})


def test_debezium_change_delivered_twice_is_stored_once(extension, channel):
    row = {"id": 4, "first_name": "Anne", "email": "a4@x"}
    # The connector emits the change again after a restart: processed later (ts_ms differs).
    sub, queue, rows = consume(channel, "debezium", [debezium("c", row, 24023200, 1559033905000),
                                                     debezium("c", row, 24023200, 1559033965000)])
    try:
        report("amqp debezium rule", delivered=2, stored=len(rows))
        assert len(rows) == 1, rows
        [(message_id, event_type, status)] = rows
        assert message_id.startswith(
            "postgresql:PostgreSQL_server:postgres.public.customers:lsn="), message_id
        assert (event_type, status) == ("create", "received")
    finally:
        drop(channel, sub, queue)


def test_cockroachdb_resolved_timestamp_is_not_stored(extension, channel):
    change = json.dumps({"after": {"id": 1, "name": "Petee"},
                         "updated": "1563898016883227000.0000000000"})
    resolved = json.dumps({"resolved": "1563898016883227000.0000000000"})
    sub, queue, rows = consume(channel, "cockroachdb", [resolved, change, change])
    try:
        report("amqp cockroachdb rule", delivered=3, stored=len(rows))
        assert len(rows) == 1, rows
        [(message_id, event_type, status)] = rows
        assert message_id.startswith("cockroachdb:%s:1563898016883227000" % queue), message_id
        assert (event_type, status) == ("upsert", "received")
    finally:
        drop(channel, sub, queue)


def test_fingerprint_ignores_the_message_id_property(extension, channel):
    body = json.dumps({"order": 7, "total": "12.50"})
    sub, queue, rows = consume(channel, "fingerprint", [body, body, json.dumps({"order": 8})])
    try:
        report("amqp fingerprint rule", delivered=3, stored=len(rows))
        assert len(rows) == 2, rows
        assert not any(m.startswith("amqp-") for m, _, _ in rows), rows
    finally:
        drop(channel, sub, queue)
