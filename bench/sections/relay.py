"""Section relay: outbox -> Kafka throughput against kcat -P of the same payloads (backlog and
burst), commit -> broker latency at 1k msg/s against a plain librdkafka producer, CPU per
message and the relay's memory."""

import json
import os
import statistics
import subprocess
import time

from confluent_kafka import Producer

from lib.cluster import q1
from lib.common import BenchError, log
from lib.eventbox import (outbox_sizes, outbox_stat, relay_info, relay_pid, set_brokers,
                          vacuum_outbox)
from lib.kafka import watermarks
from lib.latency import paced_latency
from lib.messages import DISTINCT_KEYS, PARTITIONS, SIZES, make_payloads
from lib.proc import TICKS, CpuMeter, proc_cpu, proc_status
from lib.table import ROW, best, mib, per_msg_us

HEADER_NAME, HEADER_VALUE = "event_type", "OrderCreated"
HEADERS_JSON = json.dumps({HEADER_NAME: HEADER_VALUE})
# kcat gets a constant header of the same name and length as the relay's message_id header, so
# both put the same bytes on the wire.
KCAT_MESSAGE_ID = "00000000-0000-7000-8000-000000000000"
LATENCY_RATE = 1000  # msg/s of the latency runs
FETCH_WAIT_MS = 1  # the latency consumer's fetch.wait.max.ms


def write_files(payloads, tmpdir, tag):
    kcat_path = os.path.join(tmpdir, "kcat_%s.txt" % tag)
    copy_path = os.path.join(tmpdir, "copy_%s.txt" % tag)
    with open(kcat_path, "w") as fk, open(copy_path, "w") as fc:
        for i, (key, payload) in enumerate(payloads):
            assert "\t" not in payload and "\\" not in payload and "\n" not in payload
            fk.write("%s\t%s\n" % (key, payload))
            fc.write("%d\t%s\t%s\n" % (i + 1, key, payload))
    return kcat_path, copy_path


def delivered(env, topic, n, who):
    """The topic's high watermarks added up, at least n."""
    hw = watermarks(env, topic, PARTITIONS)[1]
    if hw < n:
        raise BenchError("%s: topic %s has %d messages, expected %d" % (who, topic, hw, n))
    return hw


def run_kcat(env, topic, kcat_path, n, pg_groups):
    env.broker.create_topic(topic, PARTITIONS)
    cmd = ["kcat", "-P", "-q", "-b", env.bootstrap, "-t", topic, "-K", "\\t",
           "-H", "%s=%s" % (HEADER_NAME, HEADER_VALUE), "-H", "message_id=%s" % KCAT_MESSAGE_ID,
           "-X", "acks=all", "-X", "enable.idempotence=true", "-X", "linger.ms=5",
           "-X", "topic.partitioner=murmur2_random", "-l", kcat_path]
    kcat_pids = []
    meter = CpuMeter(dict(pg_groups, kcat=lambda: list(kcat_pids)))
    meter.start()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    kcat_pids.append(proc.pid)
    # Sample kcat's own CPU just before it is reaped (a reaped pid has no /proc entry).
    last = 0
    while proc.poll() is None:
        t = proc_cpu(proc.pid)
        last = t if t is not None else last
        time.sleep(0.01)
    elapsed = time.monotonic() - t0
    kcat_pids.clear()
    cpu = meter.stop()
    cpu["kcat_s"] = last / TICKS  # lower bound (last sample before exit)
    err = proc.stderr.read().decode(errors="replace")
    if proc.returncode != 0:
        raise BenchError("kcat failed (rc=%d): %s" % (proc.returncode, err[-2000:]))
    hw = delivered(env, topic, n, "kcat")
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "cpu": cpu, "delivered": hw}


def stage(cur, copy_path):
    """Loads the payloads (the kcat input, numbered) into the table bench_staging."""
    cur.execute("DROP TABLE IF EXISTS bench_staging")
    cur.execute("CREATE UNLOGGED TABLE bench_staging (n int PRIMARY KEY, key text, payload text)")
    with open(copy_path) as f:
        cur.copy_expert("COPY bench_staging (n, key, payload) FROM STDIN", f)
    cur.execute("ANALYZE bench_staging")


def send_staged(env, topic, n, txns):
    """Sends the n staged payloads with eventbox.send() in `txns` transactions; returns the
    seconds spent in them (COMMIT included)."""
    conn = env.connect(autocommit=False)
    c2 = conn.cursor()
    per = (n + txns - 1) // txns
    spent = 0.0
    for lo in range(1, n + 1, per):
        hi = min(n, lo + per - 1)
        t0 = time.monotonic()
        c2.execute("SELECT count(eventbox.send(%s, s.payload::jsonb, s.key, %s::jsonb)) "
                   "FROM (SELECT * FROM bench_staging WHERE n BETWEEN %s AND %s ORDER BY n) s",
                   (topic, HEADERS_JSON, lo, hi))
        got = c2.fetchone()[0]
        conn.commit()
        spent += time.monotonic() - t0
        if got != hi - lo + 1:
            raise BenchError("send() returned %d rows, expected %d" % (got, hi - lo + 1))
    conn.close()
    return spent


def check_outbox_matches(cur, n):
    """The outbox holds exactly the staged rows (the kcat input), byte for byte."""
    cur.execute("SELECT count(*), sum(length(o.payload)), "
                "count(*) FILTER (WHERE convert_from(o.payload, 'UTF8') = s.payload "
                "                   AND convert_from(o.key, 'UTF8') = s.key) "
                "FROM (SELECT row_number() OVER (ORDER BY id) AS n, key, payload "
                "      FROM eventbox.outbox) o JOIN bench_staging s USING (n)")
    rows, total_bytes, same = cur.fetchone()
    if rows != n or same != n:
        raise BenchError("outbox holds %d rows, %d identical to the kcat input (expected %d)"
                         % (rows, same, n))
    return total_bytes / n


def wait_drained(cur, pid, base, n, t0):
    """Waits until the relay counted n more acknowledged messages and the outbox is empty;
    returns the elapsed time since t0 and the relay's row of eventbox.workers."""
    deadline = t0 + max(300.0, n / 500.0)
    while True:
        time.sleep(0.02)
        info = relay_info(cur)
        if info is None or info[0] != pid:
            raise BenchError("the relay process changed during the run: %r -> %r" % (pid, info))
        if info[2] - base >= n and q1(cur, "SELECT NOT EXISTS (SELECT 1 FROM eventbox.outbox)"):
            return time.monotonic() - t0, info
        if time.monotonic() > deadline:
            left = q1(cur, "SELECT count(*) FROM eventbox.outbox")
            raise BenchError("relay: %d of %d rows still in the outbox after %.0fs; relay: %r"
                             % (left, n, deadline - t0, info))


def check_outbox_empty(cur):
    if q1(cur, "SELECT count(*) FROM eventbox.outbox") != 0:
        raise BenchError("eventbox.outbox is not empty before the run")


def poll_interval_ms(cur):
    return int(q1(cur, "SELECT setting FROM pg_settings "
                       "WHERE name = 'eventbox.relay_poll_interval'"))


def idle_polls(poll_ms):
    """Lets the idle relay run a few of its polls on the empty table."""
    time.sleep(min(2.0 * poll_ms / 1000.0 + 0.2, 5.0))


def run_relay(env, cur, topic, n, pg_groups, check=True):
    """Backlog: n rows sent while the relay is idle, then the relay is given the broker."""
    env.broker.create_topic(topic, PARTITIONS)
    set_brokers(cur, "", "idle: no brokers")
    check_outbox_empty(cur)
    vacuum_outbox(cur)  # each run starts from a clean table
    insert_s = send_staged(env, topic, n, txns=4)
    avg_payload = check_outbox_matches(cur, n) if check else None
    cur.execute("CHECKPOINT")
    pid = relay_pid(cur)
    info0 = relay_info(cur)
    meter = CpuMeter(dict(pg_groups, relay=lambda: [pid]))
    meter.start()
    t0 = time.monotonic()
    set_brokers(cur, env.bootstrap, None)
    elapsed, info = wait_drained(cur, pid, info0[2], n, t0)
    cpu = meter.stop()
    hw = delivered(env, topic, n, "relay")
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "cpu": cpu, "delivered": hw,
            "errors": info[3] - info0[3], "last_error": info[4], "pid": pid,
            "insert_rate": n / insert_s, "avg_payload": avg_payload}


def run_burst(env, cur, topic, n, pg_groups):
    """Burst: the relay is running on an empty, freshly vacuumed outbox (its steady state), and
    one transaction sends n rows; clock from that COMMIT to the outbox being empty."""
    env.broker.create_topic(topic, PARTITIONS)
    set_brokers(cur, env.bootstrap, "running")
    check_outbox_empty(cur)
    # What autovacuum does to an outbox that keeps being emptied; then let the idle relay run a
    # few of its polls on the empty table.
    vacuum_outbox(cur)
    idle_polls(poll_interval_ms(cur))
    cur.execute("CHECKPOINT")
    pid = relay_pid(cur)
    info0 = relay_info(cur)
    meter = CpuMeter(dict(pg_groups, relay=lambda: [pid]))
    insert_s = send_staged(env, topic, n, txns=1)
    meter.start()
    t0 = time.monotonic()
    elapsed, info = wait_drained(cur, pid, info0[2], n, t0)
    cpu = meter.stop()
    hw = delivered(env, topic, n, "relay burst")
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "cpu": cpu, "delivered": hw,
            "errors": info[3] - info0[3], "last_error": info[4], "pid": pid,
            "insert_rate": n / insert_s}


def run_latency(env, cur, tmpdir, seconds, dump_prefix, topic="bench_latency_relay",
                vacuum=True):
    """COMMIT of a one-message transaction -> consumer receive, through the relay. With vacuum,
    the (empty) outbox is vacuumed first, as autovacuum eventually does: the steady state."""
    env.broker.create_topic(topic, PARTITIONS)
    set_brokers(cur, env.bootstrap, "running")
    poll_ms = poll_interval_ms(cur)
    heap_mib = outbox_sizes(cur)["table"] / 1048576.0
    if vacuum:
        vacuum_outbox(cur)
        idle_polls(poll_ms)
    # Warm the relay's producer for this topic (metadata) so the first message is not an outlier.
    cur.execute("SELECT eventbox.send(%s, '{}'::jsonb)", (topic,))
    deadline = time.monotonic() + 30
    while q1(cur, "SELECT count(*) FROM eventbox.outbox") != 0:
        if time.monotonic() > deadline:
            raise BenchError("latency warm-up message not relayed within 30 s")
        time.sleep(0.05)
    payloads = make_payloads(1000, 200, seed=7)
    conn = env.connect(autocommit=True)
    c = conn.cursor()

    def send(i):
        key, payload = payloads[i % len(payloads)]
        # autocommit: the statement is its own transaction; it returns after the COMMIT.
        c.execute("SELECT eventbox.send(%s, %s::jsonb, %s, %s::jsonb)",
                  (topic, payload, key, HEADERS_JSON))
        return c.fetchone()[0]

    # The relay's CPU over the run: at this rate of one-row commits its passes, not its
    # messages, are what it spends (docs/design/relay.md, "Passes are paced").
    pid = relay_pid(cur)
    meter = CpuMeter({"relay": lambda: [pid]})
    meter.start()
    try:
        res = paced_latency(env, tmpdir, topic, LATENCY_RATE, seconds, FETCH_WAIT_MS, send,
                            dump_prefix)
    finally:
        conn.close()
    cpu = meter.stop()
    res["relay_cpu_s"] = cpu["relay_s"]
    res["poll_ms"] = poll_ms
    res["outbox_mib"] = float(heap_mib)
    return res


def run_kafka_latency(env, tmpdir, seconds, dump_prefix):
    """Baseline: a plain librdkafka producer with the relay's settings (acks=all, idempotence,
    linger.ms=5, murmur2_random), produce() -> consumer receive, same broker and consumer."""
    topic = "bench_latency_kafka"
    env.broker.create_topic(topic, PARTITIONS)
    p = Producer({"bootstrap.servers": env.bootstrap, "acks": "all",
                  "enable.idempotence": True, "linger.ms": 5,
                  "partitioner": "murmur2_random"})
    p.produce(topic, b"{}", key=b"warm-up")
    if p.flush(30) != 0:
        raise BenchError("kafka latency baseline: warm-up message not delivered")
    payloads = make_payloads(1000, 200, seed=7)
    failed = []

    def on_delivery(err, msg):
        if err is not None:
            failed.append(err)

    def send(i):
        key, payload = payloads[i % len(payloads)]
        mid = "%08x-0000-7000-8000-%012x" % (i >> 48, i & 0xffffffffffff)
        p.produce(topic, payload.encode(), key=key.encode(),
                  headers=[(HEADER_NAME, HEADER_VALUE), ("message_id", mid)],
                  on_delivery=on_delivery)
        p.poll(0)
        return mid

    res = paced_latency(env, tmpdir, topic, LATENCY_RATE, seconds, FETCH_WAIT_MS, send,
                        dump_prefix)
    if p.flush(30) != 0 or failed:
        raise BenchError("kafka latency baseline: %d delivery failures" % len(failed))
    return res


def run(ctx):
    env, cur, args, pg_groups, res = ctx.env, ctx.cur, ctx.args, ctx.pg_groups, ctx.res
    n = args.messages
    pid = relay_pid(cur)
    res.update({"memory": [("start", proc_status(pid))], "relay": {}, "kcat": {}})
    for size in SIZES:
        log("generating %d payloads of ~%s" % (n, size))
        payloads = make_payloads(n, SIZES[size], seed=SIZES[size])
        kcat_path, copy_path = write_files(payloads, ctx.tmpdir, size)
        del payloads
        stage(cur, copy_path)
        res["relay"][size], res["kcat"][size] = [], []
        for rep in range(args.repeat):
            tag = "%s_%d" % (size, rep + 1)
            log("kcat %s" % tag)
            x = run_kcat(env, "bench_kcat_" + tag, kcat_path, n, pg_groups)
            res["kcat"][size].append(x)
            log("  %.0f msg/s in %.2fs" % (x["rate"], x["elapsed"]))
            log("relay %s (backlog)" % tag)
            x = run_relay(env, cur, "bench_relay_" + tag, n, pg_groups, check=rep == 0)
            res["relay"][size].append(x)
            log("  %.0f msg/s in %.2fs (send() %.0f rows/s)"
                % (x["rate"], x["elapsed"], x["insert_rate"]))
            res["memory"].append(("after %s" % tag, proc_status(pid)))
        if args.burst:
            log("relay %s (burst, relay running)" % size)
            x = run_burst(env, cur, "bench_burst_" + size, n, pg_groups)
            res.setdefault("burst", {})[size] = x
            log("  %.0f msg/s in %.2fs" % (x["rate"], x["elapsed"]))
            res["memory"].append(("after burst %s" % size, proc_status(pid)))
        cur.execute("DROP TABLE bench_staging")
        os.unlink(kcat_path)
        os.unlink(copy_path)
    if args.latency_seconds > 0 and args.burst:
        log("latency right after the burst: relay, %d msg/s for 3s" % LATENCY_RATE)
        ab = res["latency_after_burst"] = run_latency(env, cur, ctx.tmpdir, 3, args.latency_dump,
                                                      topic="bench_latency_after_burst",
                                                      vacuum=False)
        log("  p50 %.1f ms p99 %.1f ms" % (ab["p50"], ab["p99"]))
    if args.latency_seconds > 0:
        log("latency: relay, %d msg/s for %ds" % (LATENCY_RATE, args.latency_seconds))
        lat = res["latency"] = run_latency(env, cur, ctx.tmpdir, args.latency_seconds,
                                           args.latency_dump)
        log("  p50 %.1f ms p99 %.1f ms" % (lat["p50"], lat["p99"]))
        res["memory"].append(("after latency", proc_status(pid)))
        log("latency baseline: plain producer, %d msg/s for %ds"
            % (LATENCY_RATE, args.latency_seconds))
        klat = res["latency_kafka"] = run_kafka_latency(env, ctx.tmpdir, args.latency_seconds,
                                                        args.latency_dump)
        log("  p50 %.1f ms p99 %.1f ms" % (klat["p50"], klat["p99"]))
    if relay_pid(cur) != pid:
        raise BenchError("the relay process was restarted during the bench")
    res["relayed"] = relay_info(cur)[2]
    cur.execute("SELECT pg_stat_force_next_flush()")
    res["outbox_stats"] = (outbox_stat(cur, "n_tup_ins"), outbox_stat(cur, "n_tup_del"))


def table_rows(res):
    if "relay" not in res:
        return []
    rows = []
    for size in SIZES:
        r, k = best(res["relay"][size]), best(res["kcat"][size])
        ratio = r["rate"] / k["rate"]
        rows.append(ROW % ("relay %s (msg/s)" % size, "%.0f" % r["rate"], "kcat %.0f" % k["rate"],
                           "%.2f" % ratio, ">= 0.6 " + ("ok" if ratio >= 0.6 else "BELOW")))
    for size in SIZES if res.get("burst") else ():
        r, k = res["burst"][size], best(res["kcat"][size])
        ratio = r["rate"] / k["rate"]
        rows.append(ROW % ("relay %s burst, running (msg/s)" % size, "%.0f" % r["rate"],
                           "kcat %.0f" % k["rate"], "%.2f" % ratio,
                           ">= 0.5 " + ("ok" if ratio >= 0.5 else "BELOW")))
    rows.append(ROW % ("  send() insert %s (rows/s)" % "/".join(SIZES),
                       "/".join("%.0f" % statistics.median(x["insert_rate"]
                                                           for x in res["relay"][size])
                                for size in SIZES), "-", "-", "info"))
    lat, klat = res.get("latency"), res.get("latency_kafka")
    if lat:
        ratio = lat["p99"] / lat["poll_ms"]
        rows.append(ROW % ("latency p50/p99 ms @%.0f/s" % lat["achieved_rate"],
                           "%.1f/%.1f" % (lat["p50"], lat["p99"]), "poll %d ms" % lat["poll_ms"],
                           "%.3f" % ratio, "p99 < 0.1 " + ("ok" if ratio < 0.1 else "ABOVE")))
    if lat and "relay_cpu_s" in lat:
        rows.append(ROW % ("  relay cpu/msg @%.0f/s, 1-row commits (us)" % lat["achieved_rate"],
                           "%.1f" % (1e6 * lat["relay_cpu_s"] / lat["n"]),
                           "%.1f%% of a core" % (100.0 * lat["relay_cpu_s"] * lat["achieved_rate"]
                                                 / lat["n"]),
                           "-", "info"))
    if lat and klat:
        rows.append(ROW % ("  p50/p99/max ms vs plain producer",
                           "%.1f/%.1f/%.1f" % (lat["p50"], lat["p99"], lat["max"]),
                           "librdkafka %.1f/%.1f/%.1f" % (klat["p50"], klat["p99"], klat["max"]),
                           "%.2f" % (lat["p99"] / klat["p99"]), "info (p99 ratio)"))
    ab = res.get("latency_after_burst")
    if ab:
        rows.append(ROW % ("  p50/p99 ms right after burst",
                           "%.1f/%.1f" % (ab["p50"], ab["p99"]),
                           "outbox %.0f MiB, no VACUUM" % ab["outbox_mib"],
                           "%.3f" % (ab["p99"] / ab["poll_ms"]), "info (vs poll)"))
    for size in SIZES:
        box = per_msg_us(res["relay"][size], "box_s")
        kbox = per_msg_us(res["kcat"][size], "box_s")
        rows.append(ROW % ("cpu/msg whole box %s (us)" % size, "%.1f" % box, "kcat %.1f" % kbox,
                           "%.2f" % (box / kbox) if kbox else "-",
                           "<= 50 " + ("ok" if box <= 50 else "ABOVE")))
    if res.get("burst"):
        rows.append(ROW % ("cpu/msg box, burst %s (us)" % "/".join(SIZES),
                           "/".join("%.1f" % per_msg_us([res["burst"][sz]], "box_s")
                                    for sz in SIZES), "-", "-",
                           "<= 50 " + ("ok" if all(per_msg_us([res["burst"][sz]], "box_s") <= 50
                                                   for sz in SIZES) else "ABOVE")))
    rows.append(ROW % ("  relay process %s (us)" % "/".join(SIZES),
                       "/".join("%.1f" % per_msg_us(res["relay"][s], "relay_s") for s in SIZES),
                       "kcat process %s" % "/".join("%.1f" % per_msg_us(res["kcat"][s], "kcat_s")
                                                    for s in SIZES), "-", "info"))
    rows.append(ROW % ("  postgres+broker %s (us)" % "/".join(SIZES),
                       "; ".join("%.1f+%.1f" % (per_msg_us(res["relay"][s], "postgres_s"),
                                                per_msg_us(res["relay"][s], "broker_s"))
                                 for s in SIZES),
                       "broker %s" % "/".join("%.1f" % per_msg_us(res["kcat"][s], "broker_s")
                                              for s in SIZES), "-", "info (postgres incl. relay)"))
    m = res["memory"]
    first, last = m[0][1], m[-1][1]
    rows.append(ROW % ("relay RSS before/after (MiB)",
                       "%.1f/%.1f" % (kib_mib(first["VmRSS"]), kib_mib(last["VmRSS"])), "-", "-",
                       "info (incl. shared_buffers)"))
    # Private memory is what could leak. It swings with what is in flight (up to
    # eventbox.relay_max_in_flight messages in librdkafka) and with glibc's heap, so the test is
    # on its trend: at the end (after the latency runs, little in flight) it must not exceed the
    # peak seen after the throughput runs, plus 10%.
    peak = max(st["RssAnon"] for name, st in m[1:-1]) if len(m) > 2 else first["RssAnon"]
    bounded = last["RssAnon"] <= peak * 1.1
    rows.append(ROW % ("relay private RssAnon peak/end (MiB)",
                       "%.1f/%.1f" % (kib_mib(peak), kib_mib(last["RssAnon"])),
                       "after %.2fM msgs" % (res["relayed"] / 1e6),
                       "%.2f" % (last["RssAnon"] / peak),
                       "end <= peak " + ("ok" if bounded else "GROWING")))
    return rows


def kib_mib(kb):
    """kB of /proc/PID/status in MiB."""
    return mib(kb * 1024)


def notes(res, args):
    if "relay" not in res:
        return []
    n = args.messages
    r = res["relay"]
    k = res["kcat"]
    out = [
        "%d messages per throughput run, best of %d runs per side (interleaved kcat/relay); "
        "payloads ~%s JSON, %d keys, header %s + message_id; topics of %d partitions on the "
        "librdkafka mock cluster (eventbox-devbroker)"
        % (n, args.repeat, "/".join("%.0f B" % r[s][0]["avg_payload"] for s in SIZES),
           DISTINCT_KEYS, HEADER_NAME, PARTITIONS),
        "relay: rows sent with eventbox.send() while eventbox.brokers = '', CHECKPOINT, clock "
        "from setting eventbox.brokers to the outbox being empty. kcat -P -K '\\t' -l FILE, "
        "acks=all, idempotence, linger.ms=5, murmur2_random, whole command timed",
    ]
    for s in SIZES:
        out.append("%s runs (msg/s): relay %s; kcat %s; delivered relay %s kcat %s" % (
            s, " ".join("%.0f" % x["rate"] for x in r[s]),
            " ".join("%.0f" % x["rate"] for x in k[s]),
            "/".join(str(x["delivered"]) for x in r[s]),
            "/".join(str(x["delivered"]) for x in k[s])))
    busy = [100.0 * x["cpu"]["box_s"] / max(x["cpu"]["box_total_s"], 1e-9)
            for s in SIZES for x in r[s]]
    out.append("whole-box CPU counts every process on the machine (other users too); the box "
               "was %.0f-%.0f%% busy during relay runs" % (min(busy), max(busy)))
    if res.get("burst"):
        out.append("burst: relay running with eventbox.brokers set, outbox emptied and VACUUMed "
                   "(as autovacuum does), two idle relay polls, then ONE transaction sends the N "
                   "rows; clock from its COMMIT to the outbox being empty; %s"
                   % ("; ".join("%s %.2fs, relay CPU %.1f us/msg" % (
                       sz, b["elapsed"], b["cpu"]["relay_s"] / b["n"] * 1e6)
                       for sz, b in res["burst"].items())))
    out.append("relay VmRSS/RssAnon/RssShmem (MiB): " + ", ".join(
        "%s %.1f/%.1f/%.1f" % (name, kib_mib(st["VmRSS"]), kib_mib(st["RssAnon"]),
                               kib_mib(st["RssShmem"]))
        for name, st in res["memory"]))
    lat = res.get("latency")
    if lat:
        out.append("latency: client time after COMMIT returned (one send() per transaction) -> "
                   "consumer receive (fetch.wait.max.ms=%d), %d msgs: an upper bound of "
                   "commit -> broker ack; min %.1f mean %.1f ms, %d duplicates, %d sends late "
                   ">50 ms" % (lat["fetch_wait_ms"], lat["n"], lat["min"], lat["mean"],
                               lat["dups"], lat["late_sends"]))
        if lat["stalls"]:
            out.append("latency stalls (messages > 25 ms; at second: count, worst ms): " +
                       ", ".join("%.1fs: %d, %.0f ms" % x for x in lat["stalls"][:8]) +
                       (" ..." if len(lat["stalls"]) > 8 else ""))
        out.append("latency baseline: plain librdkafka producer (relay settings), produce() "
                   "-> same consumer")
    ins, dels = res["outbox_stats"]
    out.append("pg_stat_user_tables summed over the tables behind eventbox.outbox: n_tup_ins "
               "%d, n_tup_del %d (relay acknowledged %d; it settles rows by position and "
               "deletes only held rows, docs/design/outbox-rotation.md)"
               % (ins, dels, res["relayed"]))
    errs = sum(x.get("errors", 0) for s in SIZES for x in r[s])
    if errs:
        out.append("relay recorded %d error(s) during the runs; last: %s"
                   % (errs, r[list(SIZES)[-1]][-1]["last_error"]))
    return out
