"""make demo: publishes a few thousand orders through eventbox.send() in many small transactions
(some rolled back) and shows, live, what is committed, pending in the outbox, acknowledged by the
broker, read back by an independent Kafka client, and consumed into eventbox.inbox by the ingest
worker (subscription 'audit' on the same topic). An independent producer also sends payments,
some of them malformed, which land in the inbox as well ('unparsable', bytes kept)."""
import json
import os
import sys
import threading
import time

import psycopg2
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "test", "lib"))
from devbroker import DevBroker  # noqa: E402

TOPIC = "orders"
PARTITIONS = 4


def connect():
    conn = psycopg2.connect(host=os.environ["PGHOST"], port=os.environ["PGPORT"],
                            user="postgres", dbname="app")
    conn.autocommit = True
    return conn


class Reader(threading.Thread):
    """Reads the topic with kafka-python and counts distinct message ids."""

    def __init__(self):
        super().__init__(daemon=True)
        self.ids = set()
        self.records = 0
        self.stop = False

    def run(self):
        consumer = KafkaConsumer(bootstrap_servers=os.environ["EVENTBOX_BOOTSTRAP"],
                                 enable_auto_commit=False, consumer_timeout_ms=200)
        consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        while not self.stop:
            for record in consumer:
                headers = dict(record.headers or [])
                self.ids.add(headers.get("message_id", b"").decode())
                self.records += 1
        consumer.close()


def wait_for_workers(cur, timeout=40):
    deadline = time.time() + timeout
    while time.time() < deadline:
        cur.execute("SELECT count(*) FROM eventbox.workers WHERE role IN ('relay', 'ingest') "
                    "AND state = 'running'")
        if cur.fetchone()[0] == 2:
            return
        time.sleep(0.2)
    raise SystemExit("demo: the workers did not start; see " + os.environ["EVENTBOX_LOG"])


def produce_payments():
    """An independent producer: 200 payments, every 20th one malformed."""
    producer = KafkaProducer(bootstrap_servers=os.environ["EVENTBOX_BOOTSTRAP"])
    for i in range(200):
        value = (b"\xff\xfe not json" if i % 20 == 0
                 else json.dumps({"payment": i, "type": "PaymentReceived"}).encode())
        producer.send("payments", key=str(i % 7).encode(), value=value,
                      headers=[("message_id", f"pay-{i}".encode())])
        time.sleep(0.005)
    producer.flush()
    producer.close()


def main():
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    broker = DevBroker(os.environ["EVENTBOX_CONTROL_HOST"], int(os.environ["EVENTBOX_CONTROL_PORT"]))
    broker.create_topic(TOPIC, PARTITIONS)
    broker.create_topic("payments", 2)
    conn = connect()
    cur = conn.cursor()
    cur.execute("CREATE EXTENSION IF NOT EXISTS pg_eventbox")
    cur.execute("SELECT eventbox.create_subscription('audit', topics => ARRAY['orders', 'payments'])")
    print("demo: CREATE EXTENSION pg_eventbox; create_subscription('audit', orders + payments); "
          "waiting for the workers ...")
    wait_for_workers(cur)
    payments = threading.Thread(target=produce_payments, daemon=True)
    payments.start()
    cur.execute("SELECT backend_type, pid FROM pg_stat_activity "
                "WHERE backend_type LIKE 'eventbox%' ORDER BY 1")
    for backend_type, pid in cur.fetchall():
        print(f"demo:   {backend_type:<18} pid {pid}")

    reader = Reader()
    reader.start()
    writer = connect()
    wcur = writer.cursor()
    committed, rolled_back, batch = 0, 0, 50
    rolled_back_ids = set()
    tty = sys.stdout.isatty()
    last_print = 0.0
    print(f"demo: sending {total} orders in transactions of {batch}; every 10th transaction rolls back")
    start = time.time()
    n = 0
    inbox_orders = inbox_payments = unparsable = 0
    while True:
        if committed < total:
            n += 1
            wcur.execute("BEGIN")
            wcur.execute(
                "SELECT eventbox.send('orders', jsonb_build_object('order', i, 'total', i * 1.5), "
                "key => (i %% 97)::text, headers => '{\"event_type\":\"OrderCreated\"}') "
                "FROM generate_series(%s, %s - 1) i", (committed, committed + batch))
            ids = [row[0] for row in wcur.fetchall()]
            if n % 10 == 0:
                wcur.execute("ROLLBACK")
                rolled_back += batch
                rolled_back_ids.update(ids)
            else:
                wcur.execute("COMMIT")
                committed += batch
            time.sleep(0.02)
        now = time.time()
        if now - last_print >= (0.2 if tty else 1.0) or committed >= total:
            cur.execute("SELECT count(*) FROM eventbox.outbox")
            pending = cur.fetchone()[0]
            cur.execute("SELECT coalesce(sum(messages), 0) FROM eventbox.workers WHERE role = 'relay'")
            acked = cur.fetchone()[0]
            cur.execute("SELECT count(*) FILTER (WHERE topic = 'orders'), "
                        "count(*) FILTER (WHERE topic = 'payments'), "
                        "count(*) FILTER (WHERE status = 'unparsable') "
                        "FROM eventbox.inbox WHERE subscription = 'audit'")
            inbox_orders, inbox_payments, unparsable = cur.fetchone()
            line = (f"outbox: committed {committed:>5} rolled back {rolled_back:>4} pending {pending:>4}"
                    f" acked {acked:>5} | kafka-python read {len(reader.ids):>5} | inbox: orders "
                    f"{inbox_orders:>5} payments {inbox_payments:>3} (unparsable {unparsable})")
            print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
            last_print = now
            if (committed >= total and len(reader.ids) >= committed and inbox_orders >= committed
                    and inbox_payments >= 200):
                break
        if now - start > 120:
            break
    reader.stop = True
    reader.join(timeout=5)
    print()
    elapsed = time.time() - start
    leaked = len(rolled_back_ids & reader.ids)
    ok = (len(reader.ids) == committed and leaked == 0 and inbox_orders == committed
          and inbox_payments == 200 and unparsable == 10)
    print(f"demo: {committed} committed messages, {len(reader.ids)} distinct message ids read back "
          f"from Kafka ({reader.records} records) in {elapsed:.1f}s; "
          f"rolled-back messages published: {leaked} of {len(rolled_back_ids)}")
    print(f"demo: inbox 'audit': {inbox_orders} orders and {inbox_payments} payments, "
          f"{unparsable} of them unparsable with their bytes kept in raw_payload")
    if not ok:
        print("demo: MISMATCH: every committed message should arrive once (in Kafka and in the "
              "inbox), no rolled-back one, and 200 payments with 10 unparsable")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
