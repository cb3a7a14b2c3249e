"""Section ingest: Kafka -> eventbox.inbox committed (dedupe + offsets), clock from enabling the
subscription (N messages produced beforehand) to the stored offsets reaching N; baselines:
binary COPY of the same rows into eventbox.inbox, a naive client (one INSERT ... ON CONFLICT DO
NOTHING + offset upsert + COMMIT per message), and a full replay of the same messages (all
duplicates: no table growth); also the same ingest with two ingest workers."""

import json
import time

import psycopg2
from confluent_kafka import Consumer, TopicPartition

from lib.cluster import q1
from lib.common import BenchError, log
from lib.eventbox import (create_disabled_subscription, ingest_consumer_setting, ingest_counters,
                          offsets_sum, set_enabled, set_ingest_workers, wait_offsets,
                          worker_pids)
from lib.kafka import produce
from lib.messages import (DISTINCT_KEYS, INBOX_COLUMNS, NO_INBOX_TRIGGERS, PARTITIONS, SIZES,
                          Messages, copy_buffer, copy_rows)
from lib.proc import CpuMeter
from lib.table import ROW, best, per_msg_faults, per_msg_us, steady_rate

# A replay the running consumer has not picked up after this many seconds is done again with a
# group_id change.
REPLAY_STALL_S = 20


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


def run_copy(cur, msgs, sub, topic, pg_groups):
    buf = copy_buffer(sub, topic, msgs)
    cur.execute("CHECKPOINT")
    meter = CpuMeter(pg_groups)
    meter.start()
    t0 = time.monotonic()
    copy_rows(cur, buf)  # autocommit: COPY is its own transaction, committed when it returns
    elapsed = time.monotonic() - t0
    cpu = meter.stop()
    got = q1(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s", (sub,))
    if got != msgs.n:
        raise BenchError("COPY stored %d rows, expected %d" % (got, msgs.n))
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
        raise BenchError("ingest of %s: %d rows (expected %d), %d differ from the expected "
                         "rows, %d expected rows missing, %d received_at outside the run; "
                         "e.g. %s" % (sub, rows, msgs.n, unexpected, missing, bad_time, sample))
    cur.execute("DROP TABLE pg_temp.bench_expect")


def run_ingest(cur, msgs, sub, topic, pg_groups, check):
    """Fresh ingest: subscription created disabled, clock from enabling it to its offsets
    reaching N (the rows commit with the offsets)."""
    create_disabled_subscription(cur, sub, topic)
    cur.execute("CHECKPOINT")
    time.sleep(0.3)
    ingest_pid = worker_pids(cur, "ingest")
    handler_pids = worker_pids(cur, "handler")
    base = ingest_counters(cur)
    stats0 = table_stats(cur)
    meter = CpuMeter(dict(pg_groups, ingest=lambda: ingest_pid,
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
        raise BenchError("ingest of %s: %d inbox rows, expected %d" % (sub, rows, msgs.n))
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
        log("  every column of the %d rows checked in %.1fs"
            % (msgs.n, time.monotonic() - t_check))
    return {"stat_inbox_ins": stats1[0] - stats0[0], "stat_offsets_mod": stats1[1] - stats0[1],
            "batches": batches, "avg_batch": float(avg_batch), "stalls": stalls,
            "stall_s": float(stall_s), "n": msgs.n, "elapsed": elapsed,
            "rate": msgs.n / elapsed, "first_s": first, "first_count": first_count,
            "steady_rate": steady_rate(msgs.n, elapsed, first, first_count),
            "cpu": cpu, "errors": after[2] - base[2],
            "last_error": after[3], "duplicates": after[1] - base[1]}


def run_replay(cur, msgs, sub, topic, pg_groups, stall_s):
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
    meter = CpuMeter(dict(pg_groups, ingest=lambda: ingest_pid,
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
    cur.execute(NO_INBOX_TRIGGERS)
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
                raise BenchError("naive consumer: %d of %d messages after 120 s" % (done, n))
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


def run(ctx):
    env, cur, args, pg_groups, res = ctx.env, ctx.cur, ctx.args, ctx.pg_groups, ctx.res
    n = args.ingest_messages
    out = res["ingest"] = {"n": n, "sizes": {}}
    for size in SIZES:
        log("ingest %s: generating %d messages" % (size, n))
        per = out["sizes"][size] = {"copy": [], "ingest": [], "replay": []}
        for rep in range(args.repeat):
            tag = "%s_%d" % (size.lower(), rep + 1)
            msgs = Messages(n, SIZES[size], seed=0x1000 + rep)
            per["avg_payload"] = msgs.avg_payload
            topic, sub = "bench_in_" + tag, "bench_in_" + tag
            produce_s = produce(env, topic, PARTITIONS, msgs.records(), flush_s=60)
            log("ingest %s: %d messages produced to %s in %.1fs" % (tag, n, topic, produce_s))
            cur.execute("TRUNCATE eventbox.inbox")
            x = run_copy(cur, msgs, "bench_copy_" + tag, topic, pg_groups)
            per["copy"].append(x)
            log("  COPY binary: %.0f rows/s in %.2fs" % (x["rate"], x["elapsed"]))
            cur.execute("TRUNCATE eventbox.inbox")
            x = run_ingest(cur, msgs, sub, topic, pg_groups, check=rep == 0)
            per["ingest"].append(x)
            log("  ingest: %.0f msg/s in %.2fs (first batch after %.2fs; %.0f msg/s after it)"
                % (x["rate"], x["elapsed"], x["first_s"] or -1, x["steady_rate"] or 0))
            x = run_replay(cur, msgs, sub, topic, pg_groups, REPLAY_STALL_S)
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
                x = run_ingest(cur, msgs, "bench_in2_" + tag, topic, pg_groups,
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


def table_rows(res):
    ing = res.get("ingest")
    if not ing:
        return []
    rows = []
    for size, per in ing["sizes"].items():
        i, c = best(per["ingest"]), best(per["copy"])
        r = i["rate"] / c["rate"]
        # The target (bench/README.md, "Targets"): >= 1.0 at 200 B, >= 1.2 at 1 KiB.
        want = 1.0 if size.startswith("200") else 1.2
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
                       "/".join("%.1f" % per_msg_us(per["ingest"], "box_s")
                                for per in ing["sizes"].values()),
                       "COPY %s" % "/".join("%.1f" % per_msg_us(per["copy"], "box_s")
                                            for per in ing["sizes"].values()),
                       "-", "info"))
    rows.append(ROW % ("  ingest worker/handlers/broker (us)",
                       "; ".join("%.1f/%.1f/%.1f" % (per_msg_us(per["ingest"], "ingest_s"),
                                                     per_msg_us(per["ingest"], "handlers_s"),
                                                     per_msg_us(per["ingest"], "broker_s"))
                                 for per in ing["sizes"].values()), "-", "-", "info"))
    rows.append(ROW % ("  page faults/msg ingest worker",
                       "/".join("%.3f" % per_msg_faults(per["ingest"], "ingest_faults")
                                for per in ing["sizes"].values()), "-", "-", "info"))
    return rows


def notes(res, args):
    ing = res.get("ingest")
    if not ing:
        return []
    out = []
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
           DISTINCT_KEYS, PARTITIONS, args.repeat))
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
    return out
