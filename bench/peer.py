#!/usr/bin/python3
"""The peer a user would write instead of pg_eventbox (the e2e_peer baseline; see README.md).

A confluent_kafka consumer assigned to some partitions of the input topic at the offsets stored
in its own table; per batch of up to 1000 messages, ONE transaction:
  - INSERT ... ON CONFLICT DO NOTHING of the batch into its own inbox table
    (psycopg2.extras.execute_values), RETURNING the rows that are new;
  - the business logic for each new row: INSERT a row into peer_orders and queue one outgoing
    message (in memory);
  - the offsets (next offset per partition) upserted into peer_offsets;
then COMMIT, then the queued messages are produced (confluent_kafka producer, acks=all,
idempotence, the relay's linger) and flushed before the next batch: the usual at-least-once
shape. A crash between COMMIT and the produce loses that batch's outgoing messages (the offsets
and the inbox rows are committed; a redelivery would be a duplicate and skipped).

--mode row:   the logic as one INSERT statement per new row (what a handler per message is)
--mode batch: the logic for the whole batch in one statement (INSERT ... SELECT from the
              inbox INSERT's RETURNING, in one WITH statement)

Protocol with the bench: prints "ready" once connected, waits for a line on stdin, then runs
until every assigned partition is consumed up to the end offset it saw at that moment, and
prints "done <messages> <new rows> <batches>". Both clients are connected and know the topics
before "ready". With --pause-after-commit N it writes
--pause-file after the commit of the batch that brings it to N consumed messages or more and
then sleeps (before producing that batch), so that the bench can SIGKILL it right there.
"""

import argparse
import json
import os
import sys
import time

import psycopg2
import psycopg2.extras
from confluent_kafka import Consumer, Producer, TopicPartition

BATCH = 1000

INBOX_INSERT = ('INSERT INTO peer_inbox (message_id, topic, "partition", "offset", key, payload, '
                'event_type) VALUES %s ON CONFLICT (message_id) DO NOTHING')
INBOX_TEMPLATE = "(%s, %s, %s, %s, %s, %s::jsonb, %s)"
ORDER_INSERT = ("INSERT INTO peer_orders (order_id, message_id, customer, amount) "
                "VALUES (%s, %s, %s, %s)")
BATCH_SQL = ("WITH new AS (" + INBOX_INSERT + " RETURNING message_id, key, payload) "
             "INSERT INTO peer_orders (order_id, message_id, customer, amount) "
             "SELECT (payload->>'id')::bigint, message_id, payload->>'customer', "
             "       (payload->>'amount')::bigint FROM new "
             "RETURNING order_id, customer, message_id")
OFFSETS_UPSERT = ('INSERT INTO peer_offsets (consumer, topic, "partition", next_offset) '
                  'VALUES %s ON CONFLICT (consumer, topic, "partition") '
                  'DO UPDATE SET next_offset = excluded.next_offset')


def outgoing(order_id, customer):
    return json.dumps({"order_id": order_id, "customer": customer, "status": "accepted"})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--in-topic", required=True)
    ap.add_argument("--out-topic", required=True)
    ap.add_argument("--partitions", required=True, help="comma-separated")
    ap.add_argument("--name", required=True, help="consumer name in peer_offsets")
    ap.add_argument("--mode", choices=("row", "batch"), default="row")
    ap.add_argument("--linger-ms", type=int, default=5)
    ap.add_argument("--pause-after-commit", type=int, default=0)
    ap.add_argument("--pause-file")
    args = ap.parse_args()
    parts = [int(x) for x in args.partitions.split(",")]

    conn = psycopg2.connect(args.dsn, application_name="eventbox-bench-peer")
    cur = conn.cursor()
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.name,
                         "enable.auto.commit": False, "enable.auto.offset.store": False,
                         "enable.partition.eof": False})
    producer = Producer({"bootstrap.servers": args.bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": args.linger_ms,
                         "partitioner": "murmur2_random"})
    failed = []

    def on_delivery(err, _msg):
        if err is not None:
            failed.append(err)

    # Warm: both clients connected and the topics' metadata known (a long-running peer's state;
    # a cold producer's first flush waits ~0.7 s for the topic's metadata).
    producer.list_topics(args.out_topic, timeout=10)
    consumer.list_topics(args.in_topic, timeout=10)
    print("ready", flush=True)
    sys.stdin.readline()

    # Offsets from our own table (committed with the rows), end offsets as of now.
    cur.execute('SELECT "partition", next_offset FROM peer_offsets WHERE consumer = %s AND '
                'topic = %s', (args.name, args.in_topic))
    stored = dict(cur.fetchall())
    conn.commit()
    pos = {p: stored.get(p, 0) for p in parts}
    end = {p: consumer.get_watermark_offsets(TopicPartition(args.in_topic, p), timeout=10)[1]
           for p in parts}
    consumer.assign([TopicPartition(args.in_topic, p, pos[p]) for p in parts])

    consumed = new_rows = batches = 0
    while any(pos[p] < end[p] for p in parts):
        msgs = [m for m in consumer.consume(BATCH, timeout=0.5) if not m.error()]
        if not msgs:
            continue
        rows, parsed = [], {}
        for m in msgs:
            hdrs = dict(m.headers() or [])
            mid = hdrs["message_id"].decode() if "message_id" in hdrs else "%s-%d-%d" % (
                m.topic(), m.partition(), m.offset())
            value = m.value().decode()
            rows.append((mid, m.topic(), m.partition(), m.offset(), m.key(), value,
                         hdrs.get("event_type", b"").decode() or None))
            parsed[mid] = (m.key(), value)
            pos[m.partition()] = max(pos[m.partition()], m.offset() + 1)
        out = []
        if args.mode == "row":
            new = psycopg2.extras.execute_values(cur, INBOX_INSERT + " RETURNING message_id",
                                                 rows, template=INBOX_TEMPLATE, page_size=BATCH,
                                                 fetch=True)
            for (mid,) in new:
                key, value = parsed[mid]
                order = json.loads(value)
                cur.execute(ORDER_INSERT, (order["id"], mid, order["customer"], order["amount"]))
                out.append((key, outgoing(order["id"], order["customer"]), mid))
        else:
            new = psycopg2.extras.execute_values(cur, BATCH_SQL, rows, template=INBOX_TEMPLATE,
                                                 page_size=BATCH, fetch=True)
            for order_id, customer, mid in new:
                out.append((parsed[mid][0], outgoing(order_id, customer), mid))
        psycopg2.extras.execute_values(
            cur, OFFSETS_UPSERT, [(args.name, args.in_topic, p, pos[p])
                                  for p in sorted({m.partition() for m in msgs})])
        conn.commit()
        consumed += len(msgs)
        new_rows += len(new)
        batches += 1
        if args.pause_after_commit and consumed >= args.pause_after_commit:
            with open(args.pause_file + ".tmp", "w") as f:
                f.write("%d %d\n" % (consumed, len(out)))
            os.rename(args.pause_file + ".tmp", args.pause_file)
            while True:  # killed here, between the commit and the produce
                time.sleep(1)
        for key, value, mid in out:
            while True:
                try:
                    producer.produce(args.out_topic, value.encode(), key=key,
                                     headers=[("event_type", "OrderAccepted"),
                                              ("message_id", mid)],
                                     on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.01)
        if producer.flush(60) != 0 or failed:
            print("peer: %d undelivered, %d failed: %s" % (len(producer), len(failed),
                                                          failed[:1]), file=sys.stderr)
            sys.exit(1)
    consumer.close()
    conn.close()
    print("done %d %d %d" % (consumed, new_rows, batches), flush=True)


if __name__ == "__main__":
    main()
