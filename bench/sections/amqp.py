"""Section amqp: RabbitMQ in both directions (bench/README.md, "Targets").

On the environment's RabbitMQ node (tools/cluster.sh starts one; without it the section starts
its own with tools/rabbitmq.sh in its scratch directory, points eventbox.amqp_url at it and stops
it afterwards), N ~1 KiB JSON messages over 64 keys:
  - relay: the rows are sent with eventbox.send() in one transaction to a topic with an AMQP
    destination (a durable fanout exchange bound to one durable queue); clock from its commit to
    the topic's outbox rows gone (each confirmed by the broker). Baseline: bench/amqp/publish.c
    (librabbitmq, built by the section with cc) publishing the same bodies with the same
    properties (persistent, mandatory, message_id, content_type) to the same exchange, waiting
    for the confirms after every window of 1,000; the publishing part timed. The queue is
    checked to hold N messages after each side, then purged.
  - queue -> inbox: a durable queue filled with N messages (by the same C publisher); a
    subscription (source 'amqp', batch_size B, unhandled 'keep') enabled, clock from enabling it
    to its stored next offset reaching N (each batch committed, then acked). Baseline: a plain
    consumer in this process (pika + psycopg2): basic.qos B, manual acks, each batch of B
    deliveries (or fewer when none came for 0.2 s) inserted into eventbox.inbox as one
    INSERT ... ON CONFLICT DO NOTHING of the same columns, committed (synchronous_commit on: the
    worker flushes its commit before acking too), then acked with one basic.ack multiple; clock
    from its basic.consume to the N-th row committed.
  - stream -> inbox: the same with a stream (x-queue-type stream) of N messages, the
    subscription starting from 'earliest', the consumer from x-stream-offset 'first'; both read
    the same stream.
"""
import json
import os
import shutil
import subprocess
import time
import uuid

import pika
import psycopg2
from psycopg2.extras import execute_values

from lib.cluster import q1
from lib.common import REPO, BenchError, log
from lib.eventbox import alter_system, relay_pid, vacuum_outbox
from lib.messages import NO_INBOX_TRIGGERS, make_payloads
from lib.proc import TICKS, proc_cpu
from lib.table import ROW, best, ok

KEYS = 64
BODY_BYTES = 1024
WINDOW = 1000
EXCHANGE = "bench_amqp_x"
RELAY_QUEUE = "bench_amqp_relay_q"
IDLE_S = 0.2  # the plain consumer flushes a short batch after this long without a delivery


class Rabbit:
    """The RabbitMQ node the section uses: the environment's, or one of its own."""

    def __init__(self, ctx):
        self.own_dir = None
        self.port = ctx.env.vals.get("EVENTBOX_AMQP_PORT") or ""
        self.cur = ctx.cur
        if not self.port:
            self.own_dir = os.path.join(ctx.tmpdir, "rabbitmq")
            log("amqp: the environment has no RabbitMQ node: starting one in %s" % self.own_dir)
            subprocess.run([os.path.join(REPO, "tools", "rabbitmq.sh"), "start", self.own_dir],
                           check=True, stdout=subprocess.DEVNULL, timeout=180)
            with open(os.path.join(self.own_dir, "port")) as f:
                self.port = f.readline().strip()
            alter_system(self.cur, "eventbox.amqp_url", "amqp://127.0.0.1:%s/%%2f" % self.port)
        self.conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", int(self.port), "/", pika.PlainCredentials("guest", "guest")))
        self.ch = self.conn.channel()

    def count(self, queue):
        return self.ch.queue_declare(queue, passive=True).method.message_count

    def stop(self):
        try:
            self.conn.close()
        except Exception:
            pass
        if self.own_dir:
            alter_system(self.cur, "eventbox.amqp_url", None)
            subprocess.run([os.path.join(REPO, "tools", "rabbitmq.sh"), "stop", self.own_dir],
                           stdout=subprocess.DEVNULL, timeout=120)


def build_publisher(tmpdir):
    exe = os.path.join(tmpdir, "amqp_publish")
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise BenchError("amqp: no C compiler (cc) to build bench/amqp/publish.c")
    subprocess.run([cc, "-O2", "-o", exe, os.path.join(REPO, "bench", "amqp", "publish.c"),
                    "-lrabbitmq"], check=True, timeout=120)
    return exe


def make_messages(n, seed):
    """[(key, message_id, body)]: ~1 KiB JSON bodies written as jsonb prints them (what the
    relay publishes after send() is then byte for byte the baseline's body), 64 keys."""
    out = []
    for i, (_key, body) in enumerate(make_payloads(n, BODY_BYTES, seed)):
        out.append(("k%02d" % (i % KEYS), str(uuid.UUID(int=(seed << 64) | i)), body))
    return out


def write_lines(path, msgs):
    with open(path, "w") as f:
        for key, mid, body in msgs:
            f.write("%s\t%s\t%s\n" % (key, mid, body))


def publish(exe, port, exchange, routing_key, path, n):
    p = subprocess.run([exe, "127.0.0.1", str(port), exchange, routing_key, str(WINDOW), path],
                       capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise BenchError("amqp_publish failed (%d): %s" % (p.returncode, p.stderr[-2000:]))
    words = p.stdout.split()  # published N seconds S
    if int(words[1]) != n:
        raise BenchError("amqp_publish published %s of %d" % (words[1], n))
    return float(words[3])


# ---------------------------------------------------------------------------------------------
# relay -> RabbitMQ


def run_relay(env, cur, rabbit, topic, msgs):
    n = len(msgs)
    if q1(cur, "SELECT count(*) FROM eventbox.outbox WHERE status = 'pending'") != 0:
        raise BenchError("eventbox.outbox has pending rows before the run")
    vacuum_outbox(cur)
    cur.execute("SELECT eventbox.create_amqp_destination(%s, %s)", (topic, EXCHANGE))
    sender = env.connect(autocommit=False)
    scur = sender.cursor()
    step = 10000
    for i in range(0, n, step):
        part = msgs[i:i + step]
        scur.execute("SELECT count(eventbox.send(%s, u.b::jsonb, key => u.k, message_id => u.m)) "
                     "FROM unnest(%s::text[], %s::text[], %s::uuid[]) AS u(b, k, m)",
                     (topic, [m[2] for m in part], [m[0] for m in part], [m[1] for m in part]))
    pid = relay_pid(cur)
    cpu0 = proc_cpu(pid)
    t0 = time.monotonic()
    sender.commit()
    sender.close()
    deadline = t0 + 3600
    while q1(cur, "SELECT count(*) FROM eventbox.outbox WHERE topic = %s AND status = 'pending'",
             (topic,)) > 0:
        if time.monotonic() > deadline:
            raise BenchError("relay: outbox not drained to RabbitMQ within an hour")
        time.sleep(0.02)
    elapsed = time.monotonic() - t0
    cpu = (proc_cpu(pid) - cpu0) / TICKS
    cur.execute("SELECT eventbox.drop_amqp_destination(%s)", (topic,))
    failed = q1(cur, "SELECT count(*) FROM eventbox.outbox WHERE topic = %s AND status = 'failed'",
                (topic,))
    cur.execute("DELETE FROM eventbox.outbox WHERE topic = %s", (topic,))
    got = rabbit.count(RELAY_QUEUE)
    rabbit.ch.queue_purge(RELAY_QUEUE)
    if got != n or failed:
        raise BenchError("relay: the queue holds %d of %d messages (%d failed)" % (got, n, failed))
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "relay_cpu_us": cpu / n * 1e6}


def run_publisher(exe, rabbit, path, n):
    elapsed = publish(exe, rabbit.port, EXCHANGE, "-", path, n)
    got = rabbit.count(RELAY_QUEUE)
    rabbit.ch.queue_purge(RELAY_QUEUE)
    if got != n:
        raise BenchError("amqp_publish: the queue holds %d of %d messages" % (got, n))
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed}


# ---------------------------------------------------------------------------------------------
# RabbitMQ -> inbox


def declare_filled(exe, rabbit, queue, stream, path, n):
    rabbit.ch.queue_declare(queue, durable=True,
                            arguments={"x-queue-type": "stream"} if stream else None)
    publish(exe, rabbit.port, "", queue, path, n)


def run_ingest(cur, queue, sub, n, batch, pg_groups):
    cur.execute("BEGIN; "
                + cur.mogrify("SELECT eventbox.create_subscription(%s, ARRAY[%s], "
                              "source => 'amqp', unhandled => 'keep', batch_size => %s)",
                              (sub, queue, batch)).decode()
                + "; " + cur.mogrify("SELECT eventbox.alter_subscription(%s, enabled => false)",
                                     (sub,)).decode() + "; COMMIT")
    pids = [p for p in pg_groups["postgres"]()]
    cpu0 = {p: proc_cpu(p) for p in pids}
    t0 = time.monotonic()
    cur.execute("SELECT eventbox.alter_subscription(%s, enabled => true)", (sub,))
    deadline = t0 + 1800
    while True:
        done = int(q1(cur, "SELECT coalesce(sum(next_offset), 0) FROM eventbox.offsets "
                           "WHERE subscription = %s", (sub,)))
        if done >= n:
            break
        if time.monotonic() > deadline:
            raise BenchError("ingest of %s: offsets at %d of %d after 30 min" % (queue, done, n))
        time.sleep(0.02)
    elapsed = time.monotonic() - t0
    cpu = sum((proc_cpu(p) or 0) - (c or 0) for p, c in cpu0.items()) / TICKS
    cur.execute("SELECT eventbox.alter_subscription(%s, enabled => false)", (sub,))
    rows = q1(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s", (sub,))
    if rows != n:
        raise BenchError("ingest of %s: %d rows stored, expected %d" % (queue, rows, n))
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "pg_cpu_us": cpu / n * 1e6}


def plain_consumer(env, port, queue, sub, n, batch, stream):
    """The baseline: see the module docstring. Returns its run."""
    db = env.connect(autocommit=False)
    dcur = db.cursor()
    dcur.execute(NO_INBOX_TRIGGERS)
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", int(port), "/", pika.PlainCredentials("guest", "guest")))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=batch)
    cpu0 = os.times()
    t0 = time.monotonic()
    rows, last_tag, done, number = [], None, 0, 0
    deadline = t0 + 1800

    def flush():
        nonlocal rows, done
        execute_values(
            dcur, "INSERT INTO eventbox.inbox (subscription, message_id, topic, \"partition\", "
                  "\"offset\", key, headers, payload, event_type, status) VALUES %s "
                  "ON CONFLICT (subscription, message_id) DO NOTHING",
            rows, template="(%s, %s, %s, 0, %s, %s, %s::jsonb, %s::jsonb, %s, 'received')",
            page_size=len(rows))
        db.commit()
        ch.basic_ack(last_tag, multiple=True)
        done += len(rows)
        rows = []

    args = {"x-stream-offset": "first"} if stream else None
    try:
        for method, props, body in ch.consume(queue, auto_ack=False, arguments=args,
                                              inactivity_timeout=IDLE_S):
            if time.monotonic() > deadline:
                raise BenchError("plain consumer: %d of %d after 30 min" % (done, n))
            if method is None:
                if rows:
                    flush()
                continue
            headers = {k: str(v) for k, v in (props.headers or {}).items()}
            if props.message_id:
                headers["message_id"] = props.message_id
            offset = headers.get("x-stream-offset") if stream else None
            rows.append((sub, props.message_id, queue,
                         int(offset) if offset is not None else number,
                         psycopg2.Binary(method.routing_key.encode()), json.dumps(headers),
                         body.decode(), props.type))
            number += 1
            last_tag = method.delivery_tag
            if len(rows) >= batch or done + len(rows) >= n:
                flush()
            if done >= n:
                break
        elapsed = time.monotonic() - t0
        cpu1 = os.times()
        ch.cancel()
    finally:
        try:
            conn.close()
        except Exception:
            pass
        db.close()
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "consumer_cpu_us": cpu / n * 1e6}


# ---------------------------------------------------------------------------------------------


def run(ctx):
    env, cur, args, res, tmpdir = ctx.env, ctx.cur, ctx.args, ctx.res, ctx.tmpdir
    n, batch = args.amqp_messages, args.amqp_batch
    exe = build_publisher(tmpdir)
    rabbit = Rabbit(ctx)
    out = res["amqp"] = {"n": n, "batch": batch, "publisher": [], "relay": [], "queue": [],
                         "queue_plain": [], "stream": [], "stream_plain": []}
    try:
        rabbit.ch.exchange_declare(EXCHANGE, "fanout", durable=True)
        rabbit.ch.queue_declare(RELAY_QUEUE, durable=True)
        rabbit.ch.queue_bind(RELAY_QUEUE, EXCHANGE)
        rabbit.ch.queue_purge(RELAY_QUEUE)
        for rep in range(args.amqp_repeat):
            tag = "%d_%s" % (rep + 1, uuid.uuid4().hex[:6])
            msgs = make_messages(n, seed=0x2900 + rep)
            out["avg_body"] = sum(len(m[2]) for m in msgs) / n
            path = os.path.join(tmpdir, "amqp_messages.txt")
            write_lines(path, msgs)
            log("amqp: plain publisher, confirms every %d, run %d" % (WINDOW, rep + 1))
            x = run_publisher(exe, rabbit, path, n)
            out["publisher"].append(x)
            log("  %.0f msg/s in %.2fs" % (x["rate"], x["elapsed"]))
            log("amqp: relay, run %d" % (rep + 1))
            x = run_relay(env, cur, rabbit, "bench_amqp_" + tag, msgs)
            out["relay"].append(x)
            log("  %.0f msg/s in %.2fs (relay %.1f us/msg)"
                % (x["rate"], x["elapsed"], x["relay_cpu_us"]))

            for kind, stream in (("queue", False), ("stream", True)):
                cur.execute("TRUNCATE eventbox.inbox")
                queue = "bench_amqp_%s_%s" % (kind, tag)
                plain_q = queue if stream else queue + "_plain"
                declare_filled(exe, rabbit, queue, stream, path, n)
                if not stream:
                    declare_filled(exe, rabbit, plain_q, stream, path, n)
                log("amqp: plain consumer of a %s, run %d" % (kind, rep + 1))
                x = plain_consumer(env, rabbit.port, plain_q, "bench_plain_" + tag, n, batch,
                                   stream)
                out[kind + "_plain"].append(x)
                log("  %.0f msg/s in %.2fs (consumer %.1f us/msg)"
                    % (x["rate"], x["elapsed"], x["consumer_cpu_us"]))
                cur.execute("TRUNCATE eventbox.inbox")
                log("amqp: %s -> inbox, run %d" % (kind, rep + 1))
                x = run_ingest(cur, queue, "bench_amqp_%s_%s" % (kind, tag), n, batch,
                               ctx.pg_groups)
                out[kind].append(x)
                log("  %.0f msg/s in %.2fs (PostgreSQL CPU %.1f us/msg)"
                    % (x["rate"], x["elapsed"], x["pg_cpu_us"]))
                cur.execute("SELECT eventbox.drop_subscription(%s)",
                            ("bench_amqp_%s_%s" % (kind, tag),))
                for q in {queue, plain_q}:
                    rabbit.ch.queue_delete(q)
            cur.execute("TRUNCATE eventbox.inbox")
            os.unlink(path)
        rabbit.ch.queue_delete(RELAY_QUEUE)
        rabbit.ch.exchange_delete(EXCHANGE)
    finally:
        rabbit.stop()


def table_rows(res):
    if "amqp" not in res:
        return []
    a = res["amqp"]
    rows = []
    for label, mine, base, bname, target in (
            ("amqp relay 1 KiB, 64 keys (msg/s)", "relay", "publisher", "librabbitmq", 0.5),
            ("amqp queue -> inbox (msg/s)", "queue", "queue_plain", "pika+psycopg2", 1.0),
            ("amqp stream -> inbox (msg/s)", "stream", "stream_plain", "pika+psycopg2", 1.0)):
        m, b = best(a[mine]), best(a[base])
        ratio = m["rate"] / b["rate"]
        rows.append(ROW % (label, "%.0f" % m["rate"], "%s %.0f" % (bname, b["rate"]),
                           "%.2f" % ratio, ">= %g %s" % (target, ok(ratio >= target))))
    return rows


def notes(res, args):
    if "amqp" not in res:
        return []
    a = res["amqp"]

    def rates(key, extra=None):
        return " ".join("%.0f" % x["rate"] + (" (%.1f us)" % x[extra] if extra else "")
                        for x in a[key])

    return [
        "amqp: %d messages of ~%.0f B JSON over %d keys per run, best of %d runs per side, on "
        "one RabbitMQ node on 127.0.0.1; relay: send() in one transaction, clock from its "
        "commit to the rows gone (broker-confirmed), vs bench/amqp/publish.c (librabbitmq, "
        "persistent, mandatory, confirms awaited every %d); queue and stream -> inbox: "
        "subscription batch_size %d, clock from enabling it to its offsets at N, vs a pika + "
        "psycopg2 consumer (prefetch %d, one INSERT ... ON CONFLICT DO NOTHING of the batch, "
        "commit, basic.ack multiple)"
        % (a["n"], a.get("avg_body", 0), KEYS, args.amqp_repeat, WINDOW, a["batch"],
           a["batch"]),
        "amqp runs, msg/s: relay %s (relay CPU per message) vs publisher %s; queue %s "
        "(PostgreSQL CPU per message) vs %s (the consumer's CPU per message); stream %s vs %s"
        % (rates("relay", "relay_cpu_us"), rates("publisher"), rates("queue", "pg_cpu_us"),
           rates("queue_plain", "consumer_cpu_us"), rates("stream", "pg_cpu_us"),
           rates("stream_plain", "consumer_cpu_us")),
    ]
