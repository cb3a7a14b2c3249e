"""Inbox benchmarks of pg_eventbox (sections ingest, handlers, e2e; run by bench.py).

Every figure is a ratio against a baseline measured in the same invocation, on the same table,
broker and messages; nothing is asserted on time. See bench/README.md.

  ingest    Kafka -> eventbox.inbox committed (dedupe + offsets), clock from enabling the
            subscription (N messages produced beforehand) to the stored offsets reaching N;
            baselines: binary COPY of the same rows into eventbox.inbox, a naive client
            (one INSERT ... ON CONFLICT DO NOTHING + offset upsert + COMMIT per message), and a
            full replay of the same messages (all duplicates: no table growth).
  handlers  a trivial INSERT handler over N pre-loaded inbox rows, clock from enabling the
            subscription to no row left to handle; baseline: the same INSERTs as one
            INSERT ... SELECT.
  e2e       Kafka -> handler committed at ~1k msg/s; baseline: a plain consumer with the ingest
            consumer's fetch.wait.max.ms reading the same messages at the same time.
"""

import io
import json
import os
import re
import statistics
import struct
import time

import psycopg2
from confluent_kafka import Consumer, Producer, TopicPartition

import bench as B  # bench.py (registered under this name by its main())

PARTITIONS = 32
EVENT_TYPE = "OrderCreated"
HANDLER_ROLE = "bench_handler"
INBOX_COLUMNS = ('subscription, message_id, topic, "partition", "offset", key, headers, payload, '
                 'event_type, status')


def log(msg):
    B.log(msg)


def q1(cur, sql, args=None):
    return B.q1(cur, sql, args)


def ingest_consumer_setting(name):
    """A librdkafka property the ingest consumer sets (read from the source, for the notes)."""
    try:
        with open(os.path.join(B.REPO, "src", "kafka/consumer.cpp")) as f:
            m = re.search(r'"%s",\s*"(\d+)"' % re.escape(name), f.read())
        return int(m.group(1)) if m else None
    except OSError:
        return None


def ingest_fetch_wait_ms():
    return ingest_consumer_setting("fetch.wait.max.ms")


# ---------------------------------------------------------------------------------------------
# messages and rows


class Messages:
    """n messages: (message_id, partition, offset, key, payload JSON text), message i in partition
    i % PARTITIONS at offset i // PARTITIONS of a fresh topic."""

    def __init__(self, n, size, seed):
        self.n = n
        payloads = B.make_payloads(n, size, seed=size)
        self.items = []
        for i, (key, payload) in enumerate(payloads):
            mid = "%08x-%04x-7000-8000-%012x" % (seed, size, i)
            self.items.append((mid, i % PARTITIONS, i // PARTITIONS, key, payload))
        self.avg_payload = sum(len(x[4]) for x in self.items) / n

    @staticmethod
    def headers_json(mid):
        # What the ingest worker stores for the two Kafka headers produced below.
        return json.dumps({"event_type": EVENT_TYPE, "message_id": mid})


def produce(env, topic, msgs):
    """Produces msgs to a fresh topic (explicit partitions, in order); checks that the broker
    holds all of them (the mock drops the oldest sets beyond ~5 MiB per partition)."""
    env.broker.create_topic(topic, PARTITIONS)
    p = Producer({"bootstrap.servers": env.bootstrap, "linger.ms": 20,
                  "enable.idempotence": True, "batch.num.messages": 10000,
                  "queue.buffering.max.messages": 1000000,
                  "queue.buffering.max.kbytes": 1048576})
    failed = []

    def on_delivery(err, msg):
        if err is not None:
            failed.append(err)

    t0 = time.monotonic()
    for mid, part, _off, key, payload in msgs.items:
        while True:
            try:
                p.produce(topic, payload.encode(), key=key.encode(), partition=part,
                          headers=[("event_type", EVENT_TYPE), ("message_id", mid)],
                          on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    if p.flush(60) != 0 or failed:
        raise B.BenchError("producing to %s: %d undelivered, %d failed"
                           % (topic, len(p), len(failed)))
    elapsed = time.monotonic() - t0
    c = Consumer({"bootstrap.servers": env.bootstrap, "group.id": "eventbox-bench-wm"})
    try:
        lows, highs = 0, 0
        for part in range(PARTITIONS):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, part), timeout=10)
            lows += lo
            highs += hi
    finally:
        c.close()
    if lows != 0 or highs != msgs.n:
        raise B.BenchError("topic %s holds offsets %d..%d, expected 0..%d: the mock broker "
                           "dropped messages (lower BENCH_INGEST_MESSAGES)"
                           % (topic, lows, highs, msgs.n))
    return elapsed


def copy_buffer(sub, topic, msgs, status="received", count=None):
    """PostgreSQL binary COPY data of the inbox rows the ingest worker would store for msgs."""
    out = io.BytesIO()
    w = out.write
    pk = struct.pack
    w(b"PGCOPY\n\xff\r\n\x00" + pk("!ii", 0, 0))
    sub_b, topic_b, type_b, status_b = (sub.encode(), topic.encode(), EVENT_TYPE.encode(),
                                        status.encode())

    def text(b):
        w(pk("!i", len(b)))
        w(b)

    def jsonb(s):
        b = s.encode()
        w(pk("!ib", len(b) + 1, 1))  # jsonb binary format: version 1, then the text
        w(b)

    for mid, part, off, key, payload in msgs.items[:count]:
        w(pk("!h", 10))
        text(sub_b)
        text(mid.encode())
        text(topic_b)
        w(pk("!ii", 4, part))
        w(pk("!iq", 8, off))
        text(key.encode())
        jsonb(Messages.headers_json(mid))
        jsonb(payload)
        text(type_b)
        text(status_b)
    w(pk("!h", -1))
    out.seek(0)
    return out


def copy_rows(cur, buf):
    cur.copy_expert("COPY eventbox.inbox (%s) FROM STDIN (FORMAT binary)" % INBOX_COLUMNS, buf)


# ---------------------------------------------------------------------------------------------
# helpers on the database


def worker_pids(cur, role):
    cur.execute("SELECT pid FROM eventbox.workers WHERE role = %s", (role,))
    return [r[0] for r in cur.fetchall()]


def ingest_counters(cur):
    """(messages, duplicates, errors, a last error) summed over the ingest workers."""
    cur.execute("SELECT sum(messages)::int8, sum(duplicates)::int8, sum(errors)::int8, "
                "max(last_error), count(*) FROM eventbox.workers WHERE role = 'ingest'")
    row = cur.fetchone()
    if not row[4]:
        raise B.BenchError("no ingest worker in eventbox.workers")
    return row[:4]


def set_ingest_workers(cur, n, timeout=60):
    """eventbox.ingest_workers = n (a reload); waits until exactly n ingest workers run."""
    cur.execute("ALTER SYSTEM SET eventbox.ingest_workers = %d" % n)
    cur.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + timeout
    while True:
        cur.execute("SELECT count(*) FILTER (WHERE state <> 'starting'), count(*) "
                    "FROM eventbox.workers WHERE role = 'ingest'")
        ready, total = cur.fetchone()
        if ready == n and total == n:
            return
        if time.monotonic() > deadline:
            raise B.BenchError("eventbox.ingest_workers = %d: %d ingest workers after %ds"
                               % (n, total, timeout))
        time.sleep(0.1)


def inbox_sizes(cur):
    """(heap main fork bytes, bytes of all indexes' main forks): what rows and index entries take
    (the visibility-map and free-space forks that VACUUM creates are left out)."""
    cur.execute("SELECT pg_relation_size('eventbox.inbox'), "
                "       (SELECT sum(pg_relation_size(indexrelid))::bigint FROM pg_index "
                "         WHERE indrelid = 'eventbox.inbox'::regclass)")
    return cur.fetchone()


def table_stats(cur):
    """(n_tup_ins of eventbox.inbox, n_tup_ins + n_tup_upd of eventbox.offsets) as the
    statistics system has them (what autovacuum goes by). This session's own pending counts
    (e.g. of a COPY just before) are flushed first."""
    cur.execute("SELECT pg_stat_force_next_flush()")
    cur.execute("SELECT 1")  # flushed when the session went idle in between
    cur.execute("SELECT pg_stat_clear_snapshot()")
    cur.execute("SELECT (SELECT n_tup_ins FROM pg_stat_user_tables "
                "         WHERE relid = 'eventbox.inbox'::regclass), "
                "       (SELECT n_tup_ins + n_tup_upd FROM pg_stat_user_tables "
                "         WHERE relid = 'eventbox.offsets'::regclass)")
    return cur.fetchone()


def create_disabled_subscription(cur, sub, topic, unhandled="keep", handler=None):
    """Creates `sub` disabled in one transaction (no consumer is ever started for it)."""
    sql = ["BEGIN",
           cur.mogrify("SELECT eventbox.create_subscription(%s, ARRAY[%s], unhandled => %s)",
                       (sub, topic, unhandled)).decode(),
           cur.mogrify("SELECT eventbox.alter_subscription(%s, enabled => false)",
                       (sub,)).decode()]
    if handler:
        sql.append(cur.mogrify("SELECT eventbox.register_handler(%s, %s::regprocedure, "
                               "run_as => %s)", (sub, handler, HANDLER_ROLE)).decode())
    sql.append("COMMIT")
    cur.execute("; ".join(sql))


def set_enabled(cur, sub, enabled):
    cur.execute("SELECT eventbox.alter_subscription(%s, enabled => %s)", (sub, enabled))


def offsets_sum(cur, sub):
    return int(q1(cur, "SELECT coalesce(sum(next_offset), 0) FROM eventbox.offsets "
                       "WHERE subscription = %s", (sub,)))


def wait_offsets(cur, sub, n, t0, base_messages, timeout, stall_s=None):
    """Polls (20 ms) until the stored offsets of `sub` add up to n. Returns (elapsed, first,
    first_count): first is when the ingest worker's message counter was first seen moved
    (consumer assigned and a batch committed) and first_count how far, both since t0. With
    stall_s: returns (None, None, None) when nothing moved for that long."""
    first = first_count = None
    deadline = t0 + timeout
    while True:
        time.sleep(0.02)
        now = time.monotonic()
        total = offsets_sum(cur, sub)
        if first is None:
            moved = ingest_counters(cur)[0] - base_messages
            if moved > 0:
                first, first_count = now - t0, moved
        if total >= n:
            return now - t0, first, first_count
        if stall_s is not None and first is None and now - t0 > stall_s:
            return None, None, None
        if now > deadline:
            raise B.BenchError("ingest of %s: offsets at %d of %d after %.0fs; ingest: %r"
                               % (sub, total, n, timeout, ingest_counters(cur)))


# ---------------------------------------------------------------------------------------------
# section ingest


def run_copy(env, cur, msgs, sub, topic, pg_groups):
    buf = copy_buffer(sub, topic, msgs)
    cur.execute("CHECKPOINT")
    meter = B.CpuMeter(pg_groups)
    meter.start()
    t0 = time.monotonic()
    copy_rows(cur, buf)  # autocommit: COPY is its own transaction, committed when it returns
    elapsed = time.monotonic() - t0
    cpu = meter.stop()
    got = q1(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s", (sub,))
    if got != msgs.n:
        raise B.BenchError("COPY stored %d rows, expected %d" % (got, msgs.n))
    return {"n": msgs.n, "elapsed": elapsed, "rate": msgs.n / elapsed, "cpu": cpu,
            "bytes": len(buf.getvalue())}


# Every inbox column but received_at (the worker's now()), as one text per row: NULL and '' and
# the bytes of key/raw_payload stay distinguishable, jsonb in its normalized text.
CHECK_COLUMNS = ('subscription', 'message_id', 'topic', '"partition"', '"offset"', 'key', 'headers',
                 'payload', 'raw_payload', 'event_type', 'status', 'attempts', 'next_attempt_at',
                 'processed_at', 'last_error')


def check_row(alias):
    return "md5(ROW(%s)::text)" % ", ".join("%s.%s" % (alias, c) for c in CHECK_COLUMNS)


def check_ingested(cur, sub, msgs, topic):
    """The ingest worker stored exactly the produced messages: the expected rows are COPYed into
    a temporary table (same columns and defaults, no indexes) and every column of every row is
    compared through a hash of the row, in both directions (EXCEPT ALL of 100k short hashes
    instead of a join of wide rows); received_at must lie within the ingest."""
    cur.execute("DROP TABLE IF EXISTS pg_temp.bench_expect")
    cur.execute("CREATE TEMP TABLE bench_expect (LIKE eventbox.inbox INCLUDING DEFAULTS)")
    cur.copy_expert("COPY pg_temp.bench_expect (%s) FROM STDIN (FORMAT binary)" % INBOX_COLUMNS,
                    copy_buffer(sub, topic, msgs))
    cur.execute(
        "WITH got AS (SELECT %s AS h FROM eventbox.inbox i WHERE subscription = %%(s)s), "
        "     want AS (SELECT %s AS h FROM pg_temp.bench_expect e) "
        "SELECT (SELECT count(*) FROM got), "
        "       (SELECT count(*) FROM (SELECT h FROM got EXCEPT ALL SELECT h FROM want) x), "
        "       (SELECT count(*) FROM (SELECT h FROM want EXCEPT ALL SELECT h FROM got) y), "
        "       (SELECT count(*) FROM eventbox.inbox WHERE subscription = %%(s)s "
        "         AND NOT received_at BETWEEN now() - interval '1 hour' AND now())"
        % (check_row("i"), check_row("e")), {"s": sub})
    rows, unexpected, missing, bad_time = cur.fetchone()
    if unexpected or missing or bad_time or rows != msgs.n:
        cur.execute("SELECT i.message_id FROM eventbox.inbox i WHERE i.subscription = %%s "
                    "AND NOT EXISTS (SELECT 1 FROM pg_temp.bench_expect e "
                    "WHERE e.message_id = i.message_id AND %s = %s) LIMIT 3"
                    % (check_row("e"), check_row("i")), (sub,))
        sample = [r[0] for r in cur.fetchall()]
        cur.execute("DROP TABLE pg_temp.bench_expect")
        raise B.BenchError("ingest of %s: %d rows (expected %d), %d differ from the expected "
                           "rows, %d expected rows missing, %d received_at outside the run; "
                           "e.g. %s" % (sub, rows, msgs.n, unexpected, missing, bad_time, sample))
    cur.execute("DROP TABLE pg_temp.bench_expect")


def run_ingest(env, cur, msgs, sub, topic, pg_groups, check):
    """Fresh ingest: subscription created disabled, clock from enabling it to its offsets
    reaching N (the rows commit with the offsets)."""
    create_disabled_subscription(cur, sub, topic)
    cur.execute("CHECKPOINT")
    time.sleep(0.3)
    ingest_pid = worker_pids(cur, "ingest")
    handler_pids = worker_pids(cur, "handler")
    base = ingest_counters(cur)
    stats0 = table_stats(cur)
    meter = B.CpuMeter(dict(pg_groups, ingest=lambda: ingest_pid,
                            handlers=lambda: handler_pids))
    meter.start()
    t0 = time.monotonic()
    set_enabled(cur, sub, True)
    elapsed, first, first_count = wait_offsets(cur, sub, msgs.n, t0, base[0],
                                               timeout=max(120, msgs.n / 200))
    cpu = meter.stop()
    time.sleep(1.2)  # processes flush their table statistics at most once a second
    stats1 = table_stats(cur)
    after = ingest_counters(cur)
    rows = q1(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s", (sub,))
    if rows != msgs.n:
        raise B.BenchError("ingest of %s: %d inbox rows, expected %d" % (sub, rows, msgs.n))
    # The worker's batches: received_at is the start of each batch's transaction. A gap of more
    # than 50 ms between two batch starts (a batch takes ~10-30 ms) is time it waited for Kafka.
    cur.execute("WITH b AS (SELECT received_at AS t, count(*) AS n FROM eventbox.inbox "
                "          WHERE subscription = %s GROUP BY 1), "
                "g AS (SELECT n, extract(epoch FROM t - lag(t) OVER (ORDER BY t)) AS gap FROM b) "
                "SELECT count(*), avg(n), count(*) FILTER (WHERE gap > 0.05), "
                "       coalesce(sum(gap) FILTER (WHERE gap > 0.05), 0) FROM g", (sub,))
    batches, avg_batch, stalls, stall_s = cur.fetchone()
    if check:
        t_check = time.monotonic()
        check_ingested(cur, sub, msgs, topic)
        log("  every column of the %d rows checked in %.1fs" % (msgs.n, time.monotonic() - t_check))
    return {"stat_inbox_ins": stats1[0] - stats0[0], "stat_offsets_mod": stats1[1] - stats0[1],
            "batches": batches, "avg_batch": float(avg_batch), "stalls": stalls,
            "stall_s": float(stall_s),"n": msgs.n, "elapsed": elapsed, "rate": msgs.n / elapsed, "first_s": first,
            "first_count": first_count, "steady_rate": steady_rate(msgs.n, elapsed, first,
                                                                   first_count),
            "cpu": cpu, "errors": after[2] - base[2],
            "last_error": after[3], "duplicates": after[1] - base[1]}


def steady_rate(n, elapsed, first, first_count):
    """Messages per second after the first committed batch was seen (the consumer's group join
    and first fetch left out)."""
    if first is None or elapsed <= first or first_count >= n:
        return None
    return (n - first_count) / (elapsed - first)


def run_replay(env, cur, msgs, sub, topic, pg_groups, stall_s):
    """Every partition replayed to offset 0 after the fresh ingest: all N messages are
    duplicates. Clock from the replay() calls' commit to the offsets being back at N. If the
    running consumer does not pick the replay up within stall_s, the replay is done again
    together with a group_id change (which rebuilds the consumer from the stored offsets),
    clock from that commit."""
    rows0 = q1(cur, "SELECT count(*) FROM eventbox.inbox")
    sizes0 = inbox_sizes(cur)
    replay_sql = ("SELECT count(eventbox.replay(%s, %s, p, 0)) "
                  "FROM generate_series(0, %s) p")
    ingest_pid = worker_pids(cur, "ingest")
    handler_pids = worker_pids(cur, "handler")
    res = {"n": msgs.n, "workaround": None}
    base = ingest_counters(cur)
    meter = B.CpuMeter(dict(pg_groups, ingest=lambda: ingest_pid,
                            handlers=lambda: handler_pids))
    meter.start()
    # The clock starts at the commit: the replay() calls themselves are timed apart (each counts
    # the partition's rows still in the inbox, for its notice about records stored again).
    t_call = time.monotonic()
    cur.execute(replay_sql, (sub, topic, PARTITIONS - 1))
    t0 = time.monotonic()
    res["call_s"] = t0 - t_call
    elapsed, first, first_count = wait_offsets(cur, sub, msgs.n, t0, base[0], timeout=600,
                                               stall_s=stall_s)
    if elapsed is None:
        stuck = offsets_sum(cur, sub)
        cur.execute("SELECT count(*) FILTER (WHERE next_offset = 0), count(*) FROM "
                    "eventbox.offsets WHERE subscription = %s", (sub,))
        at_zero, parts = cur.fetchone()
        res["workaround"] = ("replay() not picked up by the running consumer: %.0f s after it, "
                             "ingest counter unchanged, stored offsets sum %d (%d of %d "
                             "partitions at 0, lag view shows %d); redone with "
                             "alter_subscription(group_id => ...) in the same transaction"
                             % (stall_s, stuck, at_zero, parts, msgs.n - stuck))
        log("  " + res["workaround"])
        base = ingest_counters(cur)
        meter.start()
        t_call = time.monotonic()
        cur.execute("BEGIN; " + cur.mogrify(replay_sql, (sub, topic, PARTITIONS - 1)).decode()
                    + "; " + cur.mogrify("SELECT eventbox.alter_subscription(%s, group_id => %s)",
                                         (sub, sub + "-replay")).decode() + "; COMMIT")
        t0 = time.monotonic()
        res["call_s"] = t0 - t_call
        elapsed, first, first_count = wait_offsets(cur, sub, msgs.n, t0, base[0],
                                                   timeout=max(120, msgs.n / 200))
    res["cpu"] = meter.stop()
    # The worker counts a batch just after committing it (and its offsets): give the last
    # batch's count a moment to land.
    settle = time.monotonic() + 2
    after = ingest_counters(cur)
    while after[0] - base[0] < msgs.n and time.monotonic() < settle:
        time.sleep(0.02)
        after = ingest_counters(cur)
    res.update({"elapsed": elapsed, "rate": msgs.n / elapsed, "first_s": first,
                "steady_rate": steady_rate(msgs.n, elapsed, first, first_count),
                "duplicates": after[1] - base[1], "messages": after[0] - base[0],
                "errors": after[2] - base[2]})
    res["rows_delta"] = q1(cur, "SELECT count(*) FROM eventbox.inbox") - rows0
    sizes1 = inbox_sizes(cur)
    res["heap_delta"] = sizes1[0] - sizes0[0]
    res["index_delta"] = sizes1[1] - sizes0[1]
    res["heap_bytes"] = sizes1[0]
    return res


def run_naive(env, msgs, sub, topic, n, sync_commit):
    """Naive client: a consumer assigned to every partition at offset 0 (no group join), one
    INSERT ... ON CONFLICT DO NOTHING + offset upsert + COMMIT per message. Clock from the first
    message received to the n-th COMMIT."""
    conn = env.connect(autocommit=False)
    cur = conn.cursor()
    cur.execute("SET synchronous_commit = %s", (sync_commit,))
    cur.execute("CREATE TABLE IF NOT EXISTS public.bench_naive_offsets (consumer text, "
                "topic text, \"partition\" int, next_offset bigint, "
                "PRIMARY KEY (consumer, topic, \"partition\"))")
    conn.commit()
    c = Consumer({"bootstrap.servers": env.bootstrap, "group.id": "eventbox-bench-naive",
                  "enable.auto.commit": False, "enable.partition.eof": False})
    c.assign([TopicPartition(topic, part, 0) for part in range(PARTITIONS)])
    done = 0
    t0 = None
    deadline = time.monotonic() + 120
    try:
        while done < n:
            m = c.poll(0.5)
            if time.monotonic() > deadline:
                raise B.BenchError("naive consumer: %d of %d messages after 120 s" % (done, n))
            if m is None or m.error():
                continue
            if t0 is None:
                t0 = time.monotonic()
            hdrs = {k: v.decode() for k, v in (m.headers() or [])}
            cur.execute(
                "INSERT INTO eventbox.inbox (subscription, message_id, topic, \"partition\", "
                "\"offset\", key, headers, payload, event_type, status) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s::jsonb, %s, 'received') "
                "ON CONFLICT (subscription, message_id) DO NOTHING",
                (sub, hdrs["message_id"], m.topic(), m.partition(), m.offset(),
                 psycopg2.Binary(m.key()), json.dumps(hdrs), m.value().decode(),
                 hdrs.get("event_type")))
            cur.execute(
                "INSERT INTO public.bench_naive_offsets VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (consumer, topic, \"partition\") DO UPDATE "
                "SET next_offset = excluded.next_offset",
                (sub, m.topic(), m.partition(), m.offset() + 1))
            conn.commit()
            done += 1
        elapsed = time.monotonic() - t0
    finally:
        c.close()
        conn.close()
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "sync_commit": sync_commit}


def section_ingest(env, cur, args, pg_groups, res):
    n = args.ingest_messages
    out = res["ingest"] = {"n": n, "sizes": {}}
    for size in B.SIZES:
        log("ingest %s: generating %d messages" % (size, n))
        per = out["sizes"][size] = {"copy": [], "ingest": [], "replay": []}
        for rep in range(args.repeat):
            tag = "%s_%d" % (size.lower(), rep + 1)
            msgs = Messages(n, B.SIZES[size], seed=0x1000 + rep)
            per["avg_payload"] = msgs.avg_payload
            topic, sub = "bench_in_" + tag, "bench_in_" + tag
            produce_s = produce(env, topic, msgs)
            log("ingest %s: %d messages produced to %s in %.1fs" % (tag, n, topic, produce_s))
            cur.execute("TRUNCATE eventbox.inbox")
            x = run_copy(env, cur, msgs, "bench_copy_" + tag, topic, pg_groups)
            per["copy"].append(x)
            log("  COPY binary: %.0f rows/s in %.2fs" % (x["rate"], x["elapsed"]))
            cur.execute("TRUNCATE eventbox.inbox")
            x = run_ingest(env, cur, msgs, sub, topic, pg_groups, check=rep == 0)
            per["ingest"].append(x)
            log("  ingest: %.0f msg/s in %.2fs (first batch after %.2fs; %.0f msg/s after it)"
                % (x["rate"], x["elapsed"], x["first_s"] or -1, x["steady_rate"] or 0))
            x = run_replay(env, cur, msgs, sub, topic, pg_groups, args.replay_stall_s)
            per["replay"].append(x)
            log("  replay: %.0f msg/s in %.2fs after the calls' %.2fs, %d duplicates, rows %+d, "
                "heap %+d B, indexes %+d B"
                % (x["rate"], x["elapsed"], x["call_s"], x["duplicates"], x["rows_delta"],
                   x["heap_delta"], x["index_delta"]))
            set_enabled(cur, sub, False)
            # The same messages again into an emptied inbox, with two ingest workers.
            cur.execute("TRUNCATE eventbox.inbox")
            set_ingest_workers(cur, 2)
            try:
                x = run_ingest(env, cur, msgs, "bench_in2_" + tag, topic, pg_groups,
                               check=rep == 0)
                set_enabled(cur, "bench_in2_" + tag, False)
            finally:
                set_ingest_workers(cur, 1)
            per.setdefault("ingest2", []).append(x)
            log("  ingest, 2 workers: %.0f msg/s in %.2fs (first batch after %.2fs; %.0f msg/s "
                "after it)" % (x["rate"], x["elapsed"], x["first_s"] or -1,
                               x["steady_rate"] or 0))
            per["last_topic"] = topic
            per["last_msgs"] = msgs
        # Naive client on the last topic, into the same table (holding the last run's rows).
        msgs = per.pop("last_msgs")
        topic = per.pop("last_topic")
        naive_n = min(args.naive_messages, n)
        per["naive"] = []
        for sync in ("on", "off"):
            log("naive client %s, synchronous_commit=%s: %d messages" % (size, sync, naive_n))
            x = run_naive(env, msgs, "bench_naive_%s_%s" % (size.lower(), sync), topic,
                          naive_n, sync)
            per["naive"].append(x)
            log("  %.0f msg/s in %.2fs" % (x["rate"], x["elapsed"]))
        cur.execute("TRUNCATE eventbox.inbox")
        cur.execute("VACUUM eventbox.inbox")


# ---------------------------------------------------------------------------------------------
# section handlers


def setup_handler_objects(cur):
    if not q1(cur, "SELECT 1 FROM pg_roles WHERE rolname = %s", (HANDLER_ROLE,)):
        cur.execute("CREATE ROLE %s NOLOGIN" % HANDLER_ROLE)
    cur.execute("CREATE TABLE IF NOT EXISTS public.bench_sink (id text PRIMARY KEY, v bigint)")
    cur.execute("CREATE TABLE IF NOT EXISTS public.bench_sink2 (id text PRIMARY KEY, v bigint)")
    cur.execute("CREATE TABLE IF NOT EXISTS public.bench_e2e (id text PRIMARY KEY, "
                "sent float8, handled timestamptz)")
    cur.execute("GRANT INSERT ON public.bench_sink, public.bench_e2e TO %s" % HANDLER_ROLE)
    cur.execute("""
        CREATE OR REPLACE FUNCTION public.bench_on_msg(m eventbox.inbox) RETURNS void
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.bench_sink (id, v) VALUES (m.message_id, (m.payload->>'id')::bigint);
        END $$""")
    cur.execute("""
        CREATE OR REPLACE FUNCTION public.bench_on_e2e(m eventbox.inbox) RETURNS void
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.bench_e2e (id, sent, handled)
            VALUES (m.message_id, (m.payload->>'ts')::float8, clock_timestamp());
        END $$""")


def multi_row_insert(msgs):
    """The handler's INSERTs as one multi-row statement: INSERT INTO bench_sink2 (id, v) VALUES
    (message id, payload id), ... for every message, as a client would send it."""
    return ("INSERT INTO public.bench_sink2 (id, v) VALUES "
            + ", ".join("('%s', %d)" % (mid, json.loads(payload)["id"])
                        for mid, _p, _o, _k, payload in msgs.items))


def run_handlers(env, cur, msgs, sub, pg_groups):
    """N inbox rows pre-loaded ('received', PARTITIONS lanes) for a disabled subscription with the
    handler registered. Baselines first: the same INSERTs as one multi-row statement (the
    figure's), then as one INSERT ... SELECT from the inbox (stricter: nothing to parse or send).
    Then clock from enabling the subscription until no row is left to handle."""
    cur.execute("TRUNCATE eventbox.inbox, public.bench_sink, public.bench_sink2")
    env.broker.create_topic(sub, PARTITIONS)
    create_disabled_subscription(cur, sub, sub, handler="public.bench_on_msg(eventbox.inbox)")
    copy_rows(cur, copy_buffer(sub, sub, msgs))
    # The stored offsets the ingest worker writes with its rows: the handler workers take their
    # lanes from them (rows without are found by a slower plain walk, README "Low-water marks").
    cur.execute("INSERT INTO eventbox.offsets (subscription, topic, \"partition\", next_offset) "
                "SELECT subscription, topic, \"partition\", max(\"offset\") + 1 "
                "FROM eventbox.inbox WHERE subscription = %s GROUP BY 1, 2, 3", (sub,))
    # No VACUUM, no ANALYZE: the workers meet the backlog as a user's would (whatever
    # autovacuum managed meanwhile); their plans must not depend on statistics.
    cur.execute("CHECKPOINT")
    values_sql = multi_row_insert(msgs)
    t0 = time.monotonic()
    cur.execute(values_sql)
    values_elapsed = time.monotonic() - t0
    if cur.rowcount != msgs.n:
        raise B.BenchError("the multi-row INSERT inserted %d rows, expected %d"
                           % (cur.rowcount, msgs.n))
    cur.execute("TRUNCATE public.bench_sink2")
    cur.execute("CHECKPOINT")
    t0 = time.monotonic()
    cur.execute("INSERT INTO public.bench_sink2 (id, v) SELECT message_id, "
                "(payload->>'id')::bigint FROM eventbox.inbox WHERE subscription = %s", (sub,))
    select_elapsed = time.monotonic() - t0
    if cur.rowcount != msgs.n:
        raise B.BenchError("INSERT ... SELECT inserted %d rows, expected %d"
                           % (cur.rowcount, msgs.n))
    cur.execute("SELECT count(*) FROM public.bench_sink2 s JOIN eventbox.inbox i "
                "ON i.subscription = %s AND i.message_id = s.id "
                "AND (i.payload->>'id')::bigint = s.v", (sub,))
    if cur.fetchone()[0] != msgs.n:
        raise B.BenchError("INSERT ... SELECT rows differ from the messages")
    # Where the handler machinery's floor is (info): the handler function called once per row
    # by one statement, then the same with a subtransaction per row (a PL/pgSQL exception
    # block), as the workers run each message.
    t0 = time.monotonic()
    cur.execute("SELECT count(public.bench_on_msg(i)) FROM eventbox.inbox i "
                "WHERE i.subscription = %s", (sub,))
    fn_elapsed = time.monotonic() - t0
    cur.execute("TRUNCATE public.bench_sink")
    t0 = time.monotonic()
    cur.execute(cur.mogrify("""
        DO $bench$
        DECLARE r eventbox.inbox;
        BEGIN
            FOR r IN SELECT * FROM eventbox.inbox i WHERE i.subscription = %s LOOP
                BEGIN
                    PERFORM public.bench_on_msg(r);
                EXCEPTION WHEN others THEN RAISE;
                END;
            END LOOP;
        END $bench$""", (sub,)).decode())
    subxact_elapsed = time.monotonic() - t0
    if q1(cur, "SELECT count(*) FROM public.bench_sink") != msgs.n:
        raise B.BenchError("handler function baselines did not insert %d rows" % msgs.n)
    cur.execute("TRUNCATE public.bench_sink")
    cur.execute("CHECKPOINT")
    time.sleep(0.3)
    handler_pids = worker_pids(cur, "handler")
    # Polled: the handler workers' counter of handled messages (shared memory, moved after each
    # commit). A count(*) over the inbox while its rows are being updated took up to 50 ms a
    # call here, a quarter of a core taken from the workers being measured.
    counted = "SELECT coalesce(sum(messages), 0) FROM eventbox.workers WHERE role = 'handler'"
    base_count = int(q1(cur, counted))
    meter = B.CpuMeter(dict(pg_groups, handlers=lambda: handler_pids))
    meter.start()
    t0 = time.monotonic()
    set_enabled(cur, sub, True)
    db_t0 = q1(cur, "SELECT clock_timestamp()")
    deadline = t0 + max(300, msgs.n / 100)
    while True:
        time.sleep(0.02)
        left = msgs.n - (int(q1(cur, counted)) - base_count)
        if left <= 0:
            break
        if time.monotonic() > deadline:
            raise B.BenchError("handlers: %d of %d rows still to handle after %.0fs"
                               % (left, msgs.n, deadline - t0))
    elapsed = time.monotonic() - t0
    cpu = meter.stop()
    set_enabled(cur, sub, False)
    cur.execute("SELECT status, count(*) FROM eventbox.inbox WHERE subscription = %s "
                "GROUP BY status", (sub,))
    statuses = dict(cur.fetchall())
    sunk = q1(cur, "SELECT count(*) FROM public.bench_sink")
    if statuses != {"processed": msgs.n} or sunk != msgs.n:
        cur.execute("SELECT last_error FROM eventbox.inbox WHERE subscription = %s AND "
                    "last_error IS NOT NULL LIMIT 1", (sub,))
        err = cur.fetchone()
        raise B.BenchError("handlers: statuses %r, bench_sink %d rows, expected %d processed; "
                           "an error: %r" % (statuses, sunk, msgs.n, err))
    cur.execute("SELECT extract(epoch FROM min(processed_at) - %s), "
                "extract(epoch FROM max(processed_at) - min(processed_at)), "
                "max(attempts), count(DISTINCT processed_at) "
                "FROM eventbox.inbox WHERE subscription = %s", (db_t0, sub))
    first, span, max_attempts, passes = cur.fetchone()
    return {"n": msgs.n, "elapsed": elapsed, "rate": msgs.n / elapsed, "cpu": cpu,
            "values_rate": msgs.n / values_elapsed, "select_rate": msgs.n / select_elapsed,
            "fn_rate": msgs.n / fn_elapsed, "subxact_rate": msgs.n / subxact_elapsed,
            "first_s": float(first), "span_s": float(span), "max_attempts": max_attempts,
            "passes": passes}


def section_handlers(env, cur, args, pg_groups, res):
    setup_handler_objects(cur)
    n = args.handler_messages
    out = res["handlers"] = {"n": n, "sizes": {},
                             "workers": int(q1(cur, "SHOW eventbox.handler_workers")),
                             "timeout": q1(cur, "SHOW eventbox.handler_timeout")}
    for size in B.SIZES:
        msgs = Messages(n, B.SIZES[size], seed=0x2000)
        out["sizes"][size] = []
        for rep in range(args.repeat):
            sub = "bench_h_%s_%d" % (size.lower(), rep + 1)
            log("handlers %s: %d rows" % (sub, n))
            x = run_handlers(env, cur, msgs, sub, pg_groups)
            out["sizes"][size].append(x)
            log("  handler %.0f msg/s in %.2fs (first after %.2fs); multi-row INSERT %.0f "
                "rows/s, INSERT ... SELECT %.0f rows/s"
                % (x["rate"], x["elapsed"], x["first_s"], x["values_rate"], x["select_rate"]))
    cur.execute("TRUNCATE eventbox.inbox, public.bench_sink, public.bench_sink2")
    cur.execute("VACUUM eventbox.inbox")


# ---------------------------------------------------------------------------------------------
# section e2e


def latency_stats(xs):
    xs = sorted(xs)

    def pct(q):
        return xs[min(len(xs) - 1, int(round(q / 100.0 * (len(xs) - 1))))]
    return {"p50": pct(50), "p99": pct(99), "max": xs[-1], "min": xs[0],
            "mean": statistics.fmean(xs)}


def e2e_phase(env, cur, args, tmpdir, p, sub, tag, fetch_ms, track):
    """One paced run of the e2e figure with the (warmed-up) producer p; message ids
    'e2e<tag>-N'."""
    payloads = B.make_payloads(1000, 200, seed=11)
    failed = []
    prefix = "e2e%s-" % tag

    def on_delivery(err, msg):
        if err is not None:
            failed.append(err)

    def send(i):
        key, payload = payloads[i % len(payloads)]
        mid = "%s%08d" % (prefix, i)
        body = '{"ts": %.6f, %s' % (time.time(), payload[1:])
        p.produce(sub, body.encode(), key=key.encode(),
                  headers=[("event_type", EVENT_TYPE), ("message_id", mid)],
                  on_delivery=on_delivery)
        p.poll(0)
        return mid

    base = B.paced_latency(env, tmpdir, sub, args.e2e_rate, args.e2e_seconds, fetch_ms, send)
    if p.flush(30) != 0 or failed:
        raise B.BenchError("e2e producer: %d delivery failures" % len(failed))
    n = base["n"]
    deadline = time.monotonic() + 60
    while True:
        got = q1(cur, "SELECT count(*) FROM public.bench_e2e WHERE id LIKE %s", (prefix + "%",))
        if got >= n:
            break
        if time.monotonic() > deadline:
            raise B.BenchError("e2e: %d of %d messages handled 60 s after the last send"
                               % (got, n))
        time.sleep(0.1)
    cur.execute("SELECT (extract(epoch FROM e.handled) - e.sent) * 1000, "
                + ("(extract(epoch FROM pg_xact_commit_timestamp(e.xmin)) - e.sent) * 1000, "
                   if track else "NULL, ") +
                "(extract(epoch FROM i.received_at) - e.sent) * 1000 "
                "FROM public.bench_e2e e JOIN eventbox.inbox i ON i.subscription = %s "
                "AND i.message_id = e.id WHERE e.id LIKE %s", (sub, prefix + "%"))
    rows = cur.fetchall()
    cur.execute("SELECT count(*), max(attempts), count(*) FILTER (WHERE status <> 'processed'), "
                "count(DISTINCT received_at), count(DISTINCT processed_at) "
                "FROM eventbox.inbox WHERE subscription = %s AND message_id LIKE %s",
                (sub, prefix + "%"))
    inbox_rows, max_attempts, unprocessed, batches, passes = cur.fetchone()
    return {"n": n, "baseline": base, "achieved_rate": base["achieved_rate"],
            "handled": latency_stats(float(r[0]) for r in rows),
            "committed": latency_stats(float(r[1]) for r in rows) if track else None,
            "batch_start": latency_stats(float(r[2]) for r in rows),
            "inbox_rows": inbox_rows, "max_attempts": max_attempts, "unprocessed": unprocessed,
            "batches": batches, "passes": passes}


def section_e2e(env, cur, args, tmpdir, res):
    """Producer at args.e2e_rate msg/s for args.e2e_seconds; each payload carries its send time
    (wall clock); the handler records clock_timestamp(), and the commit time comes from
    pg_xact_commit_timestamp() (track_commit_timestamp = on). A plain consumer with the ingest
    consumer's fetch.wait.max.ms reads the same messages meanwhile: the baseline. Two phases:
    'fresh' right after the subscription is created on an emptied inbox (the workers plan their
    statements on an empty table), then 'steady' after the inbox was given 50000 processed rows
    and ANALYZEd (as autovacuum does in time), which makes the workers plan again."""
    setup_handler_objects(cur)
    fetch_ms = ingest_fetch_wait_ms() or 100
    sub = topic = "bench_e2e"
    cur.execute("TRUNCATE eventbox.inbox, public.bench_e2e")
    env.broker.create_topic(topic, PARTITIONS)
    cur.execute("SELECT eventbox.create_subscription(%s, ARRAY[%s])", (sub, topic))
    cur.execute("SELECT eventbox.register_handler(%s, 'public.bench_on_e2e(eventbox.inbox)'"
                "::regprocedure, run_as => %s)", (sub, HANDLER_ROLE))
    track = q1(cur, "SHOW track_commit_timestamp") == "on"
    p = Producer({"bootstrap.servers": env.bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5})
    # Warm-up (also of the producer, whose first messages wait for its metadata and producer
    # id): one message per partition, until the consumer is assigned and handled them all.
    for part in range(PARTITIONS):
        p.produce(topic, json.dumps({"id": 0, "ts": time.time()}).encode(), partition=part,
                  headers=[("event_type", EVENT_TYPE), ("message_id", "warm-%d" % part)])
    p.flush(30)
    deadline = time.monotonic() + 120
    while q1(cur, "SELECT count(*) FROM public.bench_e2e") < PARTITIONS:
        if time.monotonic() > deadline:
            raise B.BenchError("e2e warm-up: messages not handled within 120 s")
        time.sleep(0.1)
    out = res["e2e"] = {"fetch_wait_ms": fetch_ms, "track_commit_timestamp": track}
    log("e2e fresh inbox: %d msg/s for %ds, plain consumer with fetch.wait.max.ms=%d alongside"
        % (args.e2e_rate, args.e2e_seconds, fetch_ms))
    out["fresh"] = e2e_phase(env, cur, args, tmpdir, p, sub, "F", fetch_ms, track)
    # Steady state: a representative inbox, analyzed.
    msgs = Messages(50000, 200, seed=0x6000)
    copy_rows(cur, copy_buffer(sub, topic, msgs, status="processed"))
    cur.execute("ANALYZE eventbox.inbox")
    time.sleep(1.5)
    log("e2e steady (inbox of 50000 processed rows, ANALYZEd): %d msg/s for %ds"
        % (args.e2e_rate, args.e2e_seconds))
    out["steady"] = e2e_phase(env, cur, args, tmpdir, p, sub, "S", fetch_ms, track)
    set_enabled(cur, sub, False)
    for phase in ("fresh", "steady"):
        x = out[phase]
        lat = x["committed"] or x["handled"]
        log("  %s: eventbox p50 %.1f p99 %.1f ms; plain consumer p50 %.1f p99 %.1f ms"
            % (phase, lat["p50"], lat["p99"], x["baseline"]["p50"], x["baseline"]["p99"]))


# ---------------------------------------------------------------------------------------------
# table and notes


def best(runs, key="rate"):
    return max(runs, key=lambda r: r[key])


def us_per_msg(runs, key):
    return sum(r["cpu"][key] for r in runs) / sum(r["n"] for r in runs) * 1e6


def table_rows(res, ROW):
    rows = []
    ing = res.get("ingest")
    if ing:
        for size, per in ing["sizes"].items():
            i, c = best(per["ingest"]), best(per["copy"])
            r = i["rate"] / c["rate"]
            # DESIGN.md section 7: >= 0.8 at 200 B, >= 1.0 at 1 KiB.
            want = 0.8 if size.startswith("200") else 1.0
            rows.append(ROW % ("ingest %s (msg/s)" % size, "%.0f" % i["rate"],
                               "COPY binary %.0f" % c["rate"], "%.2f" % r,
                               ">= %.1f " % want + ("ok" if r >= want else "BELOW")))
            st = max((x["steady_rate"] or 0) for x in per["ingest"])
            rows.append(ROW % ("  after 1st batch %s (msg/s)" % size, "%.0f" % st,
                               "COPY binary %.0f" % c["rate"], "%.2f" % (st / c["rate"]),
                               "info (from 1st batch)"))
            i2 = best(per["ingest2"])
            r2 = i2["rate"] / c["rate"]
            rows.append(ROW % ("  2 ingest workers %s (msg/s)" % size, "%.0f" % i2["rate"],
                               "COPY binary %.0f" % c["rate"], "%.2f" % r2,
                               ">= 0.5 " + ("ok" if r2 >= 0.5 else "BELOW")))
        for size, per in ing["sizes"].items():
            i = best(per["ingest"])
            nv = per["naive"][0]
            r = i["rate"] / nv["rate"]
            rows.append(ROW % ("ingest vs naive %s (msg/s)" % size, "%.0f" % i["rate"],
                               "naive %.0f" % nv["rate"], "%.1f" % r,
                               ">= 50 " + ("ok" if r >= 50 else "BELOW")))
            na = per["naive"][1]
            rows.append(ROW % ("  naive, synchronous_commit=off", "%.0f" % i["rate"],
                               "naive %.0f" % na["rate"], "%.1f" % (i["rate"] / na["rate"]),
                               "info"))
            i2 = best(per["ingest2"])
            r2 = i2["rate"] / nv["rate"]
            rows.append(ROW % ("  2 ingest workers vs naive %s" % size, "%.0f" % i2["rate"],
                               "naive %.0f" % nv["rate"], "%.1f" % r2,
                               ">= 50 " + ("ok" if r2 >= 50 else "BELOW")))
        for size, per in ing["sizes"].items():
            rp = best(per["replay"])
            fresh = max((x["steady_rate"] or 0) for x in per["ingest"])
            r = rp["rate"] / fresh if fresh else 0
            rows.append(ROW % ("replay, all duplicates %s (msg/s)" % size, "%.0f" % rp["rate"],
                               "fresh, 1st batch on %.0f" % fresh, "%.2f" % r,
                               ">= 1.0 " + ("ok" if r >= 1.0 else "BELOW")))
            growth = [(x["rows_delta"], x["heap_delta"], x["index_delta"])
                      for x in per["replay"]]
            worst = max(growth, key=lambda g: (abs(g[0]), abs(g[1]) + abs(g[2])))
            flat = all(g == (0, 0, 0) for g in growth)
            rows.append(ROW % ("  replay() calls x%d %s (s)" % (PARTITIONS, size),
                               "/".join("%.2f" % x["call_s"] for x in per["replay"]), "-", "-",
                               "info (before the clock)"))
            rows.append(ROW % ("  replay growth %s rows/heap/idx" % size,
                               "%+d/%+dB/%+dB" % worst, "-", "-",
                               "none " + ("ok" if flat else "GROWN")))
        rows.append(ROW % ("cpu/msg box, ingest %s (us)" % "/".join(ing["sizes"]),
                           "/".join("%.1f" % us_per_msg(per["ingest"], "box_s")
                                    for per in ing["sizes"].values()),
                           "COPY %s" % "/".join("%.1f" % us_per_msg(per["copy"], "box_s")
                                               for per in ing["sizes"].values()),
                           "-", "info"))
        rows.append(ROW % ("  ingest worker/handlers/broker (us)",
                           "; ".join("%.1f/%.1f/%.1f" % (us_per_msg(per["ingest"], "ingest_s"),
                                                         us_per_msg(per["ingest"], "handlers_s"),
                                                         us_per_msg(per["ingest"], "broker_s"))
                                     for per in ing["sizes"].values()), "-", "-", "info"))
    hd = res.get("handlers")
    if hd:
        for size, runs in hd["sizes"].items():
            h = best(runs)
            v = best(runs, "values_rate")["values_rate"]
            sel = best(runs, "select_rate")["select_rate"]
            r = h["rate"] / v
            rows.append(ROW % ("handler INSERT %s (msg/s)" % size, "%.0f" % h["rate"],
                               "multi-row INSERT %.0f" % v, "%.3f" % r,
                               ">= 0.4 " + ("ok" if r >= 0.4 else "BELOW")))
            rows.append(ROW % ("  vs INSERT..SELECT %s" % size, "%.0f" % h["rate"],
                               "INSERT..SELECT %.0f" % sel, "%.3f" % (h["rate"] / sel),
                               "info (stricter)"))
            st = max(x["n"] / x["span_s"] for x in runs if x["span_s"] > 0)
            rows.append(ROW % ("  1st to last commit %s (msg/s)" % size, "%.0f" % st,
                               "multi-row INSERT %.0f" % v,
                               "%.3f" % (st / v), "info (no start delay)"))
            rows.append(ROW % ("  vs fn per row, 1 stmt %s" % size, "%.0f" % h["rate"],
                               "fn/row %.0f" % best(runs, "fn_rate")["fn_rate"],
                               "%.3f" % (h["rate"] / best(runs, "fn_rate")["fn_rate"]), "info"))
            rows.append(ROW % ("  vs fn + subxact per row %s" % size, "%.0f" % h["rate"],
                               "fn+subxact/row %.0f" % best(runs, "subxact_rate")["subxact_rate"],
                               "%.3f" % (h["rate"] / best(runs, "subxact_rate")["subxact_rate"]),
                               "info"))
        rows.append(ROW % ("cpu/msg box, handlers %s (us)" % "/".join(hd["sizes"]),
                           "/".join("%.1f" % us_per_msg(runs, "box_s")
                                    for runs in hd["sizes"].values()),
                           "workers %s" % "/".join("%.1f" % us_per_msg(runs, "handlers_s")
                                                   for runs in hd["sizes"].values()),
                           "-", "info"))
        worst = max(us_per_msg(runs, "handlers_s") for runs in hd["sizes"].values())
        rows.append(ROW % ("cpu/msg handler workers (us)",
                           "/".join("%.1f" % us_per_msg(runs, "handlers_s")
                                    for runs in hd["sizes"].values()),
                           "-", "-", "<= 10 " + ("ok" if worst <= 10 else "ABOVE")))
    e = res.get("e2e")
    if e:
        for phase, label in (("steady", "e2e Kafka->handler commit @%.0f/s"),
                             ("fresh", "  same, fresh inbox @%.0f/s")):
            x = e[phase]
            lat = x["committed"] or x["handled"]
            b = x["baseline"]
            rows.append(ROW % (label % x["achieved_rate"],
                               "%.1f/%.1f ms" % (lat["p50"], lat["p99"]),
                               "consumer %.1f/%.1f ms" % (b["p50"], b["p99"]),
                               "%.2f" % (lat["p99"] / b["p99"]),
                               "info (p50/p99; p99 ratio)" if phase == "steady"
                               else "info (plans from empty table)"))
        x = e["steady"]
        rows.append(ROW % ("  steady: handler ran p50/p99 (ms)",
                           "%.1f/%.1f" % (x["handled"]["p50"], x["handled"]["p99"]),
                           "ingest batch start %.1f/%.1f" % (x["batch_start"]["p50"],
                                                             x["batch_start"]["p99"]), "-",
                           "info (fetch.wait.max.ms=%d)" % e["fetch_wait_ms"]))
    return rows


def notes(res, args):
    out = []
    ing = res.get("ingest")
    if ing:
        per0 = next(iter(ing["sizes"].values()))
        out.append(
            "ingest: %d messages per run (~%s JSON payloads, headers event_type + message_id, "
            "%d keys) produced beforehand to a fresh topic of %d partitions; subscription "
            "created disabled (unhandled => 'keep', no handler: the handler workers wake per "
            "batch but run nothing), clock from alter_subscription(enabled => true) to the "
            "stored offsets adding up to N; every column of the first run's rows is checked "
            "against the expected rows. "
            "Best of %d runs. The clock includes the consumer's start (assignment, first "
            "fetch); 'after 1st batch' counts from the ingest worker's first committed batch "
            "(seen by polling its message counter every 20 ms) instead"
            % (ing["n"], "/".join("%.0f B" % p["avg_payload"] for p in ing["sizes"].values()),
               B.DISTINCT_KEYS, PARTITIONS, args.repeat))
        out.append("COPY: one COPY eventbox.inbox (%s) FROM STDIN (FORMAT binary) of the same "
                   "rows (another subscription name) into the emptied table, data built "
                   "beforehand in Python, COPY + commit timed" % INBOX_COLUMNS)
        for size, per in ing["sizes"].items():
            out.append("%s runs (msg/s): COPY %s; ingest %s (first batch seen after %s s; "
                       "after it %s); replay %s"
                       % (size, " ".join("%.0f" % x["rate"] for x in per["copy"]),
                          " ".join("%.0f" % x["rate"] for x in per["ingest"]),
                          "/".join("%.2f" % (x["first_s"] or -1) for x in per["ingest"]),
                          " ".join("%.0f" % (x["steady_rate"] or 0) for x in per["ingest"]),
                          " ".join("%.0f" % x["rate"] for x in per["replay"])))
            out.append("%s runs with eventbox.ingest_workers = 2 (a reload before each, 1 "
                       "again after; the partitions dealt out between the two workers, each its "
                       "own consumer and transactions): %s msg/s"
                       % (size, " ".join("%.0f" % x["rate"] for x in per["ingest2"])))
            out.append("%s ingest batches per run %s (avg %s rows); waits for Kafka (> 50 ms "
                       "between batch starts): %s"
                       % (size, "/".join(str(x["batches"]) for x in per["ingest"]),
                          "/".join("%.0f" % x["avg_batch"] for x in per["ingest"]),
                          "; ".join("%d, %.2f s of %.2f s" % (x["stalls"], x["stall_s"],
                                                              x["elapsed"])
                                    for x in per["ingest"])))
        out.append("ingest consumer: queued.max.messages.kbytes=%s, fetch.wait.max.ms=%s "
                   "(src/kafka/consumer.cpp); with librdkafka 2.0.2 a consumer whose prefetch "
                   "queue hit that size fetches again only ~0.5 s later, so the waits above "
                   "appear once the worker drains the queue faster than that"
                   % (ingest_consumer_setting("queued.max.messages.kbytes"),
                      ingest_consumer_setting("fetch.wait.max.ms")))
        nv = per0["naive"]
        out.append("naive: confluent_kafka consumer assigned to all partitions at offset 0 (no "
                   "group join), per message INSERT ... ON CONFLICT DO NOTHING into "
                   "eventbox.inbox + offset upsert into bench_naive_offsets + COMMIT; %d "
                   "messages, clock from the first message received; the ingest worker commits "
                   "with synchronous_commit = off (lost batches are read again)" % nv[0]["n"])
        wk = [x["workaround"] for per in ing["sizes"].values() for x in per["replay"]
              if x["workaround"]]
        out.append("replay: eventbox.replay(sub, topic, p, 0) for all %d partitions in one "
                   "transaction, clock from its commit (the running consumer seeks: no group "
                   "join; the calls' own time is the 'replay() calls' line: each counts its "
                   "partition's rows still in the inbox through inbox_pkey, a walk of the "
                   "subscription's rows) to the stored offsets back at N, compared with the "
                   "fresh ingest's "
                   "rate after its first batch; table growth measured "
                   "on the main forks of the heap and its indexes; duplicates counted by the "
                   "ingest worker: %s"
                   % (PARTITIONS, "/".join(str(x["duplicates"]) for per in
                                           ing["sizes"].values() for x in per["replay"])))
        if wk:
            out.append("BUG replay: %s (%d of %d runs)"
                       % (wk[0], len(wk), sum(len(p["replay"]) for p in ing["sizes"].values())))
        runs = [x for per in ing["sizes"].values() for x in per["ingest"]]
        out.append("pg_stat_user_tables during the fresh ingest runs: eventbox.inbox n_tup_ins "
                   "+%s for %d rows inserted, eventbox.offsets n_tup_ins+n_tup_upd +%s%s"
                   % ("/".join(str(x["stat_inbox_ins"]) for x in runs), ing["n"],
                      "/".join(str(x["stat_offsets_mod"]) for x in runs),
                      " -- WARNING: the ingest worker's writes never reach the statistics "
                      "(autovacuum and autoanalyze cannot see them)"
                      if any(x["stat_inbox_ins"] == 0 for x in runs) else ""))
        errs = sum(x["errors"] for per in ing["sizes"].values() for x in per["ingest"])
        if errs:
            out.append("ingest worker recorded %d error(s); last: %s" % (
                errs, per0["ingest"][-1]["last_error"]))
    hd = res.get("handlers")
    if hd:
        runs = [x for r in hd["sizes"].values() for x in r]
        out.append(
            "handlers: %d inbox rows ('received', %d lanes = partitions, event type %s) "
            "COPYed, with the offsets rows the ingest worker would write, for a disabled "
            "subscription with public.bench_on_msg (PL/pgSQL, one INSERT "
            "into bench_sink(id text PK, v bigint)) registered, run_as %s; eventbox.handler_"
            "workers = %d, passes of up to 256 messages run 64 per transaction; clock from "
            "alter_subscription(enabled => true) until the handler workers' handled counter "
            "(eventbox.workers) grew by the row count, then every row checked 'processed'. "
            "Baseline (the figure's, DESIGN.md section 7: the same INSERTs as one multi-row "
            "statement): INSERT INTO bench_sink2 (id, v) VALUES (message id, payload id), ... "
            "with every message, built before the clock starts, sent by the client; stricter "
            "(info): INSERT INTO bench_sink2 SELECT message_id, (payload->>'id')::bigint FROM "
            "eventbox.inbox WHERE subscription = ... (nothing to send or parse); both into a "
            "table of the sink's shape, timed just before. First commit after %s s; %s distinct "
            "processed_at (transactions) per run; max attempts %d"
            % (hd["n"], PARTITIONS, EVENT_TYPE, HANDLER_ROLE, hd["workers"],
               "/".join("%.2f" % x["first_s"] for x in runs),
               "/".join(str(x["passes"]) for x in runs), max(x["max_attempts"] for x in runs)))
        out.append("handler info baselines, same rows and sink, timed after the others: "
                   "'fn/row' = SELECT count(public.bench_on_msg(i)) FROM eventbox.inbox i WHERE "
                   "..., one statement; 'fn+subxact/row' = a DO block looping over the rows, "
                   "PERFORM bench_on_msg(r) inside BEGIN ... EXCEPTION (a subtransaction per "
                   "row), the floor of running each message in its own subtransaction")
        for size, r in hd["sizes"].items():
            out.append("%s runs (msg/s): handler %s; multi-row INSERT %s; INSERT ... SELECT "
                       "%s; fn/row %s; fn+subxact/row %s" % (
                           size, " ".join("%.0f" % x["rate"] for x in r),
                           " ".join("%.0f" % x["values_rate"] for x in r),
                           " ".join("%.0f" % x["select_rate"] for x in r),
                           " ".join("%.0f" % x["fn_rate"] for x in r),
                           " ".join("%.0f" % x["subxact_rate"] for x in r)))
    e = res.get("e2e")
    if e:
        st, fr = e["steady"], e["fresh"]
        out.append(
            "e2e: %d messages per phase at ~%.0f/s (confluent_kafka producer, acks=all, "
            "idempotence, linger.ms=5; send time = wall clock in the payload, taken just before "
            "produce()), 32 partitions, 1 subscription, handler public.bench_on_e2e records "
            "clock_timestamp(); 'commit' = pg_xact_commit_timestamp(xmin) of its row (%s). "
            "Phase 'fresh': right after create_subscription on an emptied inbox (warm-up of one "
            "message per partition first); phase 'steady': then 50000 processed rows COPYed in "
            "and ANALYZE eventbox.inbox (what autovacuum does in time; the workers re-plan). "
            "The ingest consumer sets fetch.wait.max.ms=%d and the mock broker does not answer "
            "a waiting fetch early when data arrives (real Kafka does), so up to that much is "
            "broker wait here; the baseline is a plain consumer with the same fetch.wait.max.ms "
            "reading the same messages meanwhile"
            % (st["n"], st["achieved_rate"], "track_commit_timestamp = on"
               if e["track_commit_timestamp"] else "off: handler time used",
               e["fetch_wait_ms"]))
        for name, x in (("steady", st), ("fresh", fr)):
            lat = x["committed"] or x["handled"]
            out.append("e2e %s: commit latency min %.1f mean %.1f max %.1f ms; handler ran "
                       "p50/p99 %.1f/%.1f; ingest batch start p50/p99 %.1f/%.1f; plain consumer "
                       "min/mean/max %.1f/%.1f/%.1f; %d ingest batches, %d handler passes; "
                       "%d rows, %d not processed, max attempts %s"
                       % (name, lat["min"], lat["mean"], lat["max"], x["handled"]["p50"],
                          x["handled"]["p99"], x["batch_start"]["p50"], x["batch_start"]["p99"],
                          x["baseline"]["min"], x["baseline"]["mean"], x["baseline"]["max"],
                          x["batches"], x["passes"], x["inbox_rows"], x["unprocessed"],
                          x["max_attempts"]))
    return out
