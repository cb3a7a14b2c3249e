"""make demo: publishes a few thousand orders through eventbox.send() in many small transactions
(some rolled back) and shows, live, what is committed, pending in the outbox, acknowledged by the
broker and read back by an independent Kafka client."""
import json
import os
import sys
import threading
import time

import psycopg2
from kafka import KafkaConsumer, TopicPartition

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


def wait_for_relay(cur, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        cur.execute("SELECT state FROM eventbox.workers WHERE role = 'relay'")
        row = cur.fetchone()
        if row and row[0] == "running":
            return
        time.sleep(0.2)
    raise SystemExit("demo: the relay did not start; see " + os.environ["EVENTBOX_LOG"])


def main():
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    DevBroker(os.environ["EVENTBOX_CONTROL_HOST"], int(os.environ["EVENTBOX_CONTROL_PORT"])) \
        .create_topic(TOPIC, PARTITIONS)
    conn = connect()
    cur = conn.cursor()
    cur.execute("CREATE EXTENSION IF NOT EXISTS pg_eventbox")
    print("demo: CREATE EXTENSION pg_eventbox; waiting for the relay worker ...")
    wait_for_relay(cur)
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
    while committed < total or reader.ids.__len__() < committed:
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
            line = (f"committed {committed:>6}  rolled back {rolled_back:>5}  pending in outbox "
                    f"{pending:>5}  acked by broker {acked:>6}  read from Kafka {len(reader.ids):>6}")
            print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
            last_print = now
            if committed >= total and len(reader.ids) >= committed:
                break
        if now - start > 120:
            break
    reader.stop = True
    reader.join(timeout=5)
    print()
    elapsed = time.time() - start
    leaked = len(rolled_back_ids & reader.ids)
    ok = len(reader.ids) == committed and leaked == 0
    print(f"demo: {committed} committed messages, {len(reader.ids)} distinct message ids read back "
          f"from Kafka ({reader.records} records) in {elapsed:.1f}s; "
          f"rolled-back messages published: {leaked} of {len(rolled_back_ids)}")
    if not ok:
        print("demo: MISMATCH: every committed message should arrive and no rolled-back one")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
