"""make demo: the whole pipeline, live.

An independent Kafka client (kafka-python) produces orders, one of them poison, plus payments, some
malformed. The ingest worker stores them in eventbox.inbox; a handler (billing.on_order, run as the
role billing_app) writes an invoice and sends it with eventbox.send() in the same transaction; the
relay publishes the invoices; kafka-python reads them back. The handler also sends each invoice
to topic 'crm.invoices', which has an HTTP destination sending bulk requests (up to 50 invoices a
request, signed with a Standard Webhooks secret, at most 20 requests a second): a local "CRM"
endpoint that verifies the signatures and answers 207 with a result per record, failing about 7%
of the records on their first attempt (503, 429), and now and then a whole request (503 with
Retry-After); the relay retries the failed records alone until each invoice is accepted, and the
CRM dedupes on each record's message id. The handler also sends each invoice to topic
'warehouse.invoices', which has an AMQP destination: the relay publishes it to the RabbitMQ
exchange 'shop' (publisher confirms, mandatory), bound to the queue 'warehouse.invoices', which
the subscription 'warehouse' (source 'amqp') consumes with acks after the inbox commit; its
handler (warehouse.on_invoice) writes a shipment per invoice. The app also sends notifications
directly, every 10th transaction rolled back. Shown live, then checked: every order invoiced
exactly once except the poison one (dead after its attempts), no rolled-back notification
published, malformed payments kept as 'unparsable' with their bytes."""
import base64
import hashlib
import hmac
import json
import os
import sys
import threading
import time
import zlib

import pika
import psycopg2
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "test", "lib"))
from devbroker import DevBroker  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "test", "integration", "http"))
from http_support import Endpoint  # noqa: E402

ORDERS = 3000
POISON = 1234  # this order's handler raises: it goes dead after max_attempts
PAYMENTS = 200  # every 20th one malformed
NOTIFY_TXNS = 60  # app transactions of 10 notifications, every 10th rolled back

SETUP = """
CREATE EXTENSION IF NOT EXISTS pg_eventbox;
DO $$ BEGIN CREATE ROLE billing_app; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
GRANT USAGE ON SCHEMA eventbox TO billing_app;
GRANT EXECUTE ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid) TO billing_app;
CREATE SCHEMA IF NOT EXISTS billing;
GRANT USAGE ON SCHEMA billing TO billing_app;
CREATE TABLE IF NOT EXISTS billing.invoices (
    order_id int, total numeric, created_by name DEFAULT current_user,
    created_at timestamptz DEFAULT now());
GRANT INSERT ON billing.invoices TO billing_app;
CREATE OR REPLACE FUNCTION billing.on_order(msg eventbox.inbox) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF (msg.payload->>'total')::numeric < 0 THEN
        RAISE EXCEPTION 'order % has a negative total', msg.payload->>'id';
    END IF;
    INSERT INTO billing.invoices (order_id, total)
    VALUES ((msg.payload->>'id')::int, (msg.payload->>'total')::numeric);
    PERFORM eventbox.send('invoices', msg.payload, key => msg.payload->>'id',
                          headers => '{"event_type":"InvoiceCreated"}');
    -- The same invoice for the CRM: delivered as an HTTP POST by the relay.
    PERFORM eventbox.send('crm.invoices', msg.payload, key => 'customer-' || (msg.payload->>'id')::int % 100,
                          headers => '{"event_type":"InvoiceCreated"}');
    -- And for the warehouse: published to RabbitMQ by the relay.
    PERFORM eventbox.send('warehouse.invoices', msg.payload,
                          key => 'customer-' || (msg.payload->>'id')::int % 100,
                          headers => '{"event_type":"InvoiceCreated"}');
END $$;
GRANT EXECUTE ON FUNCTION billing.on_order(eventbox.inbox) TO billing_app;
SELECT eventbox.create_subscription('billing', topics => ARRAY['orders', 'payments'],
                                    max_attempts => 3, backoff => '200 ms',
                                    backoff_max => '1 second');
SELECT eventbox.register_handler('billing', 'billing.on_order(eventbox.inbox)'::regprocedure,
                                 event_type => 'OrderCreated', run_as => 'billing_app');
-- RabbitMQ: invoices published to the exchange 'shop', consumed back from its queue.
DO $$ BEGIN CREATE ROLE warehouse_app; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
CREATE SCHEMA IF NOT EXISTS warehouse;
GRANT USAGE ON SCHEMA warehouse TO warehouse_app;
CREATE TABLE IF NOT EXISTS warehouse.shipments (
    order_id int, queued_by text, created_at timestamptz DEFAULT now());
GRANT INSERT ON warehouse.shipments TO warehouse_app;
CREATE OR REPLACE FUNCTION warehouse.on_invoice(msg eventbox.inbox) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO warehouse.shipments (order_id, queued_by)
    VALUES ((msg.payload->>'id')::int, msg.topic);
$$;
GRANT EXECUTE ON FUNCTION warehouse.on_invoice(eventbox.inbox) TO warehouse_app;
SELECT eventbox.create_amqp_destination('warehouse.invoices', 'shop', routing_key => 'invoice');
SELECT eventbox.create_subscription('warehouse', topics => ARRAY['warehouse.invoices'],
                                    source => 'amqp');
SELECT eventbox.register_handler('warehouse', 'warehouse.on_invoice(eventbox.inbox)'::regprocedure,
                                 event_type => 'InvoiceCreated', run_as => 'warehouse_app');
"""


CRM_SECRET = "whsec_" + base64.b64encode(b"demo-crm-signing-key-32-bytes!!!").decode()


class Crm:
    """The CRM's bulk endpoint: verifies each request's Standard Webhooks signature, answers 503
    with Retry-After: 1 to the first attempt of about 1 request in 20, and otherwise 207 with a
    result per record, failing the first attempt of about 7% of the records (503 or 429); dedupes
    on each record's message id."""

    def __init__(self):
        self.lock = threading.Lock()
        self.accepted = {}  # message id -> invoice id
        self.record_attempts = {}  # message id -> attempts seen
        self.failures = 0  # records answered 503/429 in a 207
        self.request_failures = 0  # whole requests answered 503
        self.duplicates = 0  # records sent again after they were accepted
        self.signed = self.bad_signatures = 0
        self.endpoint = Endpoint(self.answer)

    def verify(self, rec):
        key = base64.b64decode(CRM_SECRET[len("whsec_"):])
        signed = b"%s.%s.%s" % (rec.headers.get("webhook-id", "").encode(),
                                rec.headers.get("webhook-timestamp", "").encode(), rec.body)
        mac = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        return mac in rec.headers.get("webhook-signature", "").split(" ")

    def answer(self, attempt, rec):
        with self.lock:
            if not self.verify(rec):
                self.bad_signatures += 1
                return ("status", 401, {}, b"bad signature")
            self.signed += 1
            if attempt == 1 and zlib.crc32(rec.key.encode()) % 20 == 0:
                self.request_failures += 1
                return ("status", 503, {"Retry-After": "1"}, b"maintenance")
            results = []
            for record in rec.json():
                mid, invoice = record["id"], record["payload"]["id"]
                n = self.record_attempts.get(mid, 0) + 1
                self.record_attempts[mid] = n
                roll = zlib.crc32(str(invoice).encode()) % 100
                if n == 1 and roll < 7:
                    self.failures += 1
                    results.append({"id": mid, "status": 503 if roll < 4 else 429,
                                    "error": "try again"})
                    continue
                if mid in self.accepted:
                    self.duplicates += 1
                self.accepted.setdefault(mid, invoice)
                results.append({"id": mid, "status": 201})
        return ("status", 207, {"Content-Type": "application/json"},
                json.dumps(results).encode())


def connect():
    conn = psycopg2.connect(host=os.environ["PGHOST"], port=os.environ["PGPORT"],
                            user="postgres", dbname="app")
    conn.autocommit = True
    return conn


class Reader(threading.Thread):
    """Reads a topic with kafka-python and collects distinct message ids."""

    def __init__(self, topic, partitions):
        super().__init__(daemon=True)
        self.topic, self.partitions = topic, partitions
        self.ids = set()
        self.stop = False

    def run(self):
        consumer = KafkaConsumer(bootstrap_servers=os.environ["EVENTBOX_BOOTSTRAP"],
                                 enable_auto_commit=False, consumer_timeout_ms=200)
        consumer.assign([TopicPartition(self.topic, p) for p in range(self.partitions)])
        consumer.seek_to_beginning()
        while not self.stop:
            for record in consumer:
                self.ids.add(dict(record.headers or []).get("message_id", b"").decode())
        consumer.close()


def produce_inputs():
    """The outside world: orders and payments from an independent client."""
    producer = KafkaProducer(bootstrap_servers=os.environ["EVENTBOX_BOOTSTRAP"])
    for i in range(max(ORDERS, PAYMENTS)):
        if i < ORDERS:
            order = {"id": i, "total": -1 if i == POISON else round(10 + i * 0.5, 2)}
            producer.send("orders", key=str(i % 50).encode(), value=json.dumps(order).encode(),
                          headers=[("message_id", f"order-{i}".encode()),
                                   ("event_type", b"OrderCreated")])
        if i < PAYMENTS:
            value = (b"\xff\xfe not json" if i % 20 == 0
                     else json.dumps({"payment": i, "type": "PaymentReceived"}).encode())
            producer.send("payments", key=str(i % 7).encode(), value=value,
                          headers=[("message_id", f"pay-{i}".encode())])
        if i % 100 == 0:
            time.sleep(0.05)
    producer.flush()
    producer.close()


def send_notifications(rolled_back_ids):
    """The app itself: notifications sent with eventbox.send(), some transactions rolled back."""
    conn = connect()
    cur = conn.cursor()
    for n in range(NOTIFY_TXNS):
        cur.execute("BEGIN")
        cur.execute("SELECT eventbox.send('notifications', jsonb_build_object('n', i)) "
                    "FROM generate_series(1, 10) i")
        ids = [row[0] for row in cur.fetchall()]
        if n % 10 == 9:
            cur.execute("ROLLBACK")
            rolled_back_ids.update(ids)
        else:
            cur.execute("COMMIT")
        time.sleep(0.03)
    conn.close()


def wait_for_workers(cur, timeout=40):
    deadline = time.time() + timeout
    while time.time() < deadline:
        cur.execute("SELECT count(*) FILTER (WHERE role = 'relay'), "
                    "count(*) FILTER (WHERE role = 'ingest'), "
                    "count(*) FILTER (WHERE role = 'handler') "
                    "FROM eventbox.workers WHERE state = 'running'")
        relay, ingest, handlers = cur.fetchone()
        if relay and ingest and handlers:
            return
        time.sleep(0.2)
    raise SystemExit("demo: the workers did not start; see " + os.environ["EVENTBOX_LOG"])


def snapshot(cur):
    cur.execute("""
        SELECT count(*) FILTER (WHERE topic = 'orders'),
               count(*) FILTER (WHERE topic = 'orders' AND status = 'processed'),
               count(*) FILTER (WHERE topic = 'orders' AND status = 'retry'),
               count(*) FILTER (WHERE topic = 'orders' AND status = 'dead'),
               count(*) FILTER (WHERE topic = 'payments'),
               count(*) FILTER (WHERE status = 'unparsable')
          FROM eventbox.inbox WHERE subscription = 'billing'""")
    row = cur.fetchone()
    cur.execute("SELECT count(*) FROM eventbox.outbox")
    pending = cur.fetchone()[0]
    cur.execute("SELECT count(*), count(DISTINCT order_id) FROM billing.invoices")
    invoices = cur.fetchone()
    cur.execute("SELECT count(*), count(DISTINCT order_id) FROM warehouse.shipments")
    shipments = cur.fetchone()
    return row + (pending,) + invoices + shipments


def declare_rabbitmq():
    """The warehouse's topology, declared by an independent client (pika): a durable direct
    exchange 'shop' and the queue 'warehouse.invoices' bound to it with the key 'invoice'."""
    if not os.environ.get("EVENTBOX_AMQP_PORT"):
        raise SystemExit("demo: the environment has no RabbitMQ node: install rabbitmq-server "
                         "(tools/deps.sh) and unset EVENTBOX_NO_RABBITMQ")
    params = pika.ConnectionParameters("127.0.0.1", int(os.environ["EVENTBOX_AMQP_PORT"]), "/",
                                       pika.PlainCredentials("guest", "guest"),
                                       connection_attempts=30, retry_delay=0.5)
    connection = pika.BlockingConnection(params)
    channel = connection.channel()
    channel.exchange_declare("shop", "direct", durable=True)
    channel.queue_declare("warehouse.invoices", durable=True)
    channel.queue_bind("warehouse.invoices", "shop", "invoice")
    connection.close()


def main():
    broker = DevBroker(os.environ["EVENTBOX_CONTROL_HOST"], int(os.environ["EVENTBOX_CONTROL_PORT"]))
    for topic, partitions in (("orders", 8), ("payments", 2), ("invoices", 8),
                              ("notifications", 2)):
        broker.create_topic(topic, partitions)
    cur = connect().cursor()
    crm = Crm()
    declare_rabbitmq()
    cur.execute(SETUP)
    cur.execute("SELECT eventbox.create_http_destination('crm.invoices', %s, "
                "headers => '{\"Authorization\": \"Bearer demo-token\"}', max_in_flight => 8, "
                "batch_size => 50, batch_wait => '100 milliseconds', batch_format => 'json_array', "
                "signing_secret => %s, rate_limit => 20, rate_burst => 4, breaker_failures => 10, "
                "breaker_cooldown => '2 seconds')", (crm.endpoint.url, CRM_SECRET))
    print("demo: topic 'crm.invoices' delivered over HTTP to the CRM at %s (bulk requests of up "
          "to 50, signed, at most 20 requests/s)" % crm.endpoint.url)
    print("demo: extension, role billing_app, handler billing.on_order and subscription "
          "'billing' (orders + payments) created; topic 'warehouse.invoices' published to "
          "RabbitMQ (exchange 'shop' -> queue 'warehouse.invoices', node on port %s), consumed "
          "by subscription 'warehouse' (source 'amqp'); waiting for the workers ..."
          % os.environ["EVENTBOX_AMQP_PORT"])
    wait_for_workers(cur)
    cur.execute("SELECT backend_type, count(*) FROM pg_stat_activity "
                "WHERE backend_type LIKE 'eventbox%' GROUP BY 1 ORDER BY 1")
    print("demo:   " + ", ".join(f"{t} x{n}" for t, n in cur.fetchall()))

    invoices_read = Reader("invoices", 8)
    notifications_read = Reader("notifications", 2)
    invoices_read.start()
    notifications_read.start()
    rolled_back = set()
    threads = [threading.Thread(target=produce_inputs, daemon=True),
               threading.Thread(target=send_notifications, args=(rolled_back,), daemon=True)]
    for t in threads:
        t.start()

    tty = sys.stdout.isatty()
    start = time.time()
    expected_invoices = ORDERS - 1
    while True:
        (orders, processed, retry, dead, payments, unparsable, pending, invoices,
         distinct_invoices, shipments, distinct_shipments) = snapshot(cur)
        line = (f"orders in inbox {orders:>5} processed {processed:>5} retry {retry} dead {dead} | "
                f"invoices {invoices:>5} outbox pending {pending:>4} read from Kafka "
                f"{len(invoices_read.ids):>5} | CRM accepted {len(crm.accepted):>5} "
                f"failed {crm.failures:>3} | RabbitMQ shipments {shipments:>5} | "
                f"payments {payments:>3} (unparsable {unparsable})")
        print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
        done = (orders == ORDERS and processed == expected_invoices and dead == 1
                and len(invoices_read.ids) >= expected_invoices and payments == PAYMENTS
                and not any(t.is_alive() for t in threads) and pending == 0
                and len(crm.accepted) >= expected_invoices
                and distinct_shipments >= expected_invoices)
        if done or time.time() - start > 180:
            break
        time.sleep(0.2 if tty else 1.0)
    time.sleep(1.5)  # let the notification reader catch up
    invoices_read.stop = notifications_read.stop = True
    print()

    cur.execute("SELECT attempts, last_error FROM eventbox.inbox "
                "WHERE subscription = 'billing' AND message_id = %s", (f"order-{POISON}",))
    poison = cur.fetchone()
    cur.execute("SELECT DISTINCT created_by FROM billing.invoices")
    runners = [r[0] for r in cur.fetchall()]
    committed_notifications = NOTIFY_TXNS * 10 - len(rolled_back)
    leaked = len(rolled_back & notifications_read.ids)
    print(f"demo: {distinct_invoices} of {ORDERS} orders invoiced, {invoices} invoice rows "
          f"(exactly once each), written as {', '.join(runners)}; {len(invoices_read.ids)} "
          f"invoices read back from Kafka")
    print(f"demo: poison order {POISON}: dead after {poison[0] if poison else '?'} attempts: "
          f"{poison[1] if poison else '?'}")
    print(f"demo: payments: {payments}, {unparsable} unparsable kept with their bytes; "
          f"notifications: {len(notifications_read.ids)} of {committed_notifications} committed "
          f"read back, {leaked} of {len(rolled_back)} rolled back published")
    crm_requests = len(crm.endpoint.snapshot())
    crm_invoices = set(crm.accepted.values())
    print(f"demo: CRM (HTTP, bulk): {len(crm_invoices)} of {expected_invoices} invoices accepted "
          f"in {crm_requests} requests; {crm.failures} records answered 503/429 in a 207 and "
          f"retried alone, {crm.request_failures} whole requests answered 503 (Retry-After "
          f"honoured), {crm.duplicates} record(s) sent again after acceptance; signatures: "
          f"{crm.signed} verified, {crm.bad_signatures} bad")
    cur.execute("SELECT count(*), count(DISTINCT message_id), "
                "count(*) FILTER (WHERE status = 'processed') FROM eventbox.inbox "
                "WHERE subscription = 'warehouse'")
    rabbit_inbox, rabbit_ids, rabbit_processed = cur.fetchone()
    cur.execute("SELECT coalesce(sum(value), 0) FROM eventbox.metrics "
                "WHERE name = 'eventbox_ingest_redelivered_total' "
                "AND labels->>'subscription' = 'warehouse'")
    redelivered = cur.fetchone()[0]
    print(f"demo: RabbitMQ: {expected_invoices} invoices published to exchange 'shop' with "
          f"confirms; {rabbit_inbox} stored from queue 'warehouse.invoices' ({rabbit_ids} "
          f"message ids, {rabbit_processed} processed, {int(redelivered)} redelivered); "
          f"{shipments} shipment rows for {distinct_shipments} orders (exactly once each)")
    cur.execute("SELECT name, coalesce(labels->>'class', labels->>'result'), value "
                "FROM eventbox.metrics WHERE labels->>'destination' = 'crm.invoices' AND name IN "
                "('eventbox_http_responses_total', 'eventbox_http_retries_total', "
                "'eventbox_http_messages_total') AND value > 0 ORDER BY 1, 2")
    print("demo: metrics: " + ", ".join("%s%s %d" % (n, "{%s}" % c if c else "", v)
                                        for n, c, v in cur.fetchall()))
    ok = (len(crm_invoices) == expected_invoices and crm.bad_signatures == 0
          and crm.failures > 0 and crm.duplicates == 0
          and distinct_invoices == invoices == expected_invoices and dead == 1 and poison
          and poison[0] == 3 and len(invoices_read.ids) == expected_invoices
          and payments == PAYMENTS and unparsable == PAYMENTS // 20 and leaked == 0
          and len(notifications_read.ids) == committed_notifications
          and shipments == distinct_shipments == expected_invoices
          and rabbit_processed == rabbit_ids == expected_invoices)
    if not ok:
        print("demo: MISMATCH: see the counts above")
        sys.exit(1)


if __name__ == "__main__":
    main()
