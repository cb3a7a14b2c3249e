#!/usr/bin/python3
"""pg_eventbox benchmarks (run by bench/run.sh; see bench/README.md).

Every figure is a ratio against a baseline measured in the same invocation, on the same broker
and the same payloads; absolute numbers are printed for information only. The process exits 0
unless something is functionally broken (messages missing, relay stuck, ...).

Usage (normally through run.sh, which sources the cluster's env file first):
    bench.py run --env-dir DIR --messages N --out FILE
    bench.py consume ...        (internal: the latency consumer, a separate process)
"""

import argparse
import json
import os
import random
import statistics
import string
import subprocess
import sys
import tempfile
import time

import psycopg2
from confluent_kafka import Consumer, TopicPartition

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "test", "lib"))
from devbroker import DevBroker  # noqa: E402

PARTITIONS = 32
SIZES = {"200B": 200, "1KiB": 1024}  # payload sizes of the throughput runs
DISTINCT_KEYS = 1000
HEADER_NAME, HEADER_VALUE = "event_type", "OrderCreated"
HEADERS_JSON = json.dumps({HEADER_NAME: HEADER_VALUE})
# kcat gets a constant header of the same name and length as the relay's message_id header, so
# both put the same bytes on the wire.
KCAT_MESSAGE_ID = "00000000-0000-7000-8000-000000000000"
TICKS = os.sysconf("SC_CLK_TCK")


class BenchError(Exception):
    """Something is functionally broken: the bench fails (exit 1)."""


T_START = time.monotonic()


def log(msg):
    print("bench: [%5.1fs] %s" % (time.monotonic() - T_START, msg), file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# /proc helpers


def box_cpu():
    """(busy_ticks, total_ticks) of the whole box from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest* are in user/nice.
    total = sum(fields[:8])
    idle = fields[3] + fields[4]
    return total - idle, total


def proc_cpu(pid):
    """utime+stime ticks of a process (all its threads), or None if it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rindex(")") + 2:].split()
    return int(rest[11]) + int(rest[12])


def proc_status(pid):
    out = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                    out[k] = int(v.split()[0])  # kB
    except OSError:
        return None
    return out


def children_of(ppid):
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rindex(")") + 2:].split()
        if int(rest[1]) == ppid:
            pids.append(int(name))
    return pids


class CpuMeter:
    """CPU used between start() and stop(): whole box, and named process groups."""

    def __init__(self, groups):
        self.groups = groups  # name -> callable returning a list of pids

    def _sample(self):
        per_pid = {}
        for name, pids_fn in self.groups.items():
            for pid in pids_fn():
                t = proc_cpu(pid)
                if t is not None:
                    per_pid[(name, pid)] = t
        return box_cpu(), per_pid

    def start(self):
        self.t0 = time.monotonic()
        self.s0 = self._sample()

    def stop(self):
        s1 = self._sample()
        self.elapsed = time.monotonic() - self.t0
        (b0, tot0), p0 = self.s0
        (b1, tot1), p1 = s1
        res = {"box_s": (b1 - b0) / TICKS, "box_total_s": (tot1 - tot0) / TICKS,
               "wall_s": self.elapsed}
        for name in self.groups:
            used = 0
            for (n, pid), t in p1.items():
                if n == name:
                    used += t - p0.get((n, pid), 0)  # processes born mid-run count from 0
            res[name + "_s"] = used / TICKS
        return res


# ---------------------------------------------------------------------------------------------
# environment


class Env:
    def __init__(self, env_dir):
        self.dir = env_dir
        vals = {}
        with open(os.path.join(env_dir, "env")) as f:
            for line in f:
                line = line.strip()
                if line.startswith("export "):
                    k, _, v = line[len("export "):].partition("=")
                    vals[k] = v.strip("'\"")
        self.vals = vals
        self.bootstrap = vals["EVENTBOX_BOOTSTRAP"]
        self.dsn = "host=%s port=%s user=%s dbname=%s" % (
            vals["PGHOST"], vals["PGPORT"], vals["PGUSER"], vals["PGDATABASE"])
        self.broker = DevBroker(vals["EVENTBOX_CONTROL_HOST"], vals["EVENTBOX_CONTROL_PORT"])
        with open(os.path.join(env_dir, "broker.pid")) as f:
            self.broker_pid = int(f.readline())
        with open(os.path.join(vals["EVENTBOX_DATADIR"], "postmaster.pid")) as f:
            self.postmaster_pid = int(f.readline())

    def connect(self, autocommit=True):
        conn = psycopg2.connect(self.dsn, application_name="eventbox-bench")
        conn.autocommit = autocommit
        return conn

    def pg_pids(self):
        return [self.postmaster_pid] + children_of(self.postmaster_pid)


def q1(cur, sql, args=None):
    cur.execute(sql, args)
    row = cur.fetchone()
    return row[0] if row else None


def relay_info(cur):
    cur.execute("SELECT pid, state, messages, errors, last_error FROM eventbox.workers "
                "WHERE role = 'relay'")
    return cur.fetchone()


def relay_pid(cur, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        pid = q1(cur, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventbox relay'")
        if pid:
            return pid
        if time.monotonic() > deadline:
            raise BenchError("no 'eventbox relay' in pg_stat_activity after %ds" % timeout)
        time.sleep(0.1)


def set_brokers(cur, value, want_state, timeout=30):
    cur.execute("ALTER SYSTEM SET eventbox.brokers = %s", (value,))
    cur.execute("SELECT pg_reload_conf()")
    if want_state is None:
        return
    deadline = time.monotonic() + timeout
    while True:
        info = relay_info(cur)
        if info and info[1] == want_state:
            return
        if time.monotonic() > deadline:
            raise BenchError("relay did not reach state %r within %ds (now: %r)"
                             % (want_state, timeout, info))
        time.sleep(0.02)


def high_watermarks(bootstrap, topic, partitions=PARTITIONS):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "eventbox-bench-wm",
                  "enable.auto.commit": False})
    try:
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in range(partitions))
    finally:
        c.close()


# ---------------------------------------------------------------------------------------------
# payloads


def make_payloads(n, size, seed):
    """n (key, payload) pairs. Payloads are JSON written the way jsonb prints it (keys ordered by
    length then bytes, ", " and ": " separators), so the text send() stores and the relay
    publishes is byte-for-byte the kcat input."""
    rnd = random.Random(seed)
    alphabet = string.ascii_letters + string.digits
    # A pool of random strings; each payload takes a slice at a rotating offset.
    pool = ["".join(rnd.choice(alphabet) for _ in range(size + 64)) for _ in range(64)]
    res = []
    for i in range(n):
        key = "customer-%04d" % (i % DISTINCT_KEYS)
        head = '{"id": %d, "pad": "' % (i + 1)
        tail = ('", "sku": "SKU-%05d", "type": "OrderCreated", "amount": %d, "currency": "EUR", '
                '"customer": "%s"}' % (rnd.randrange(100000), rnd.randrange(1, 10 ** 6), key))
        pad_len = max(1, size - len(head) - len(tail))
        off = (i // 64) % 64
        res.append((key, head + pool[i % 64][off:off + pad_len] + tail))
    return res


def write_files(payloads, tmpdir, tag):
    kcat_path = os.path.join(tmpdir, "kcat_%s.txt" % tag)
    copy_path = os.path.join(tmpdir, "copy_%s.txt" % tag)
    with open(kcat_path, "w") as fk, open(copy_path, "w") as fc:
        for i, (key, payload) in enumerate(payloads):
            assert "\t" not in payload and "\\" not in payload and "\n" not in payload
            fk.write("%s\t%s\n" % (key, payload))
            fc.write("%d\t%s\t%s\n" % (i + 1, key, payload))
    return kcat_path, copy_path


# ---------------------------------------------------------------------------------------------
# figure 1 + 3 + 4: relay throughput vs kcat


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
    hw = high_watermarks(env.bootstrap, topic)
    if hw < n:
        raise BenchError("kcat: topic %s has %d messages, expected %d" % (topic, hw, n))
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


def wait_drained(env, cur, pid, base, n, t0, topic):
    """Waits until the relay counted n more acknowledged messages and the outbox is empty;
    returns the elapsed time since t0."""
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


def run_relay(env, cur, topic, n, pg_groups, check=True):
    """Backlog: n rows sent while the relay is idle, then the relay is given the broker."""
    env.broker.create_topic(topic, PARTITIONS)
    set_brokers(cur, "", "idle: no brokers")
    if q1(cur, "SELECT count(*) FROM eventbox.outbox") != 0:
        raise BenchError("eventbox.outbox is not empty before the run")
    cur.execute("VACUUM eventbox.outbox")  # each run starts from a clean table
    insert_s = send_staged(env, topic, n, txns=4)
    avg_payload = check_outbox_matches(cur, n) if check else None
    cur.execute("CHECKPOINT")
    pid = relay_pid(cur)
    info0 = relay_info(cur)
    meter = CpuMeter(dict(pg_groups, relay=lambda: [pid]))
    meter.start()
    t0 = time.monotonic()
    set_brokers(cur, env.bootstrap, None)
    elapsed, info = wait_drained(env, cur, pid, info0[2], n, t0, topic)
    cpu = meter.stop()
    hw = high_watermarks(env.bootstrap, topic)
    if hw < n:
        raise BenchError("relay: topic %s has %d messages, expected %d" % (topic, hw, n))
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "cpu": cpu, "delivered": hw,
            "errors": info[3] - info0[3], "last_error": info[4], "pid": pid,
            "insert_rate": n / insert_s, "avg_payload": avg_payload}


def run_burst(env, cur, topic, n, pg_groups):
    """Burst: the relay is running on an empty, freshly vacuumed outbox (its steady state), and
    one transaction sends n rows; clock from that COMMIT to the outbox being empty."""
    env.broker.create_topic(topic, PARTITIONS)
    set_brokers(cur, env.bootstrap, "running")
    if q1(cur, "SELECT count(*) FROM eventbox.outbox") != 0:
        raise BenchError("eventbox.outbox is not empty before the run")
    # What autovacuum does to an outbox that keeps being emptied; then let the idle relay run a
    # few of its polls on the empty table.
    cur.execute("VACUUM eventbox.outbox")
    poll_ms = int(q1(cur, "SELECT setting FROM pg_settings "
                          "WHERE name = 'eventbox.relay_poll_interval'"))
    time.sleep(min(2.0 * poll_ms / 1000.0 + 0.2, 5.0))
    cur.execute("CHECKPOINT")
    pid = relay_pid(cur)
    info0 = relay_info(cur)
    meter = CpuMeter(dict(pg_groups, relay=lambda: [pid]))
    insert_s = send_staged(env, topic, n, txns=1)
    meter.start()
    t0 = time.monotonic()
    elapsed, info = wait_drained(env, cur, pid, info0[2], n, t0, topic)
    cpu = meter.stop()
    hw = high_watermarks(env.bootstrap, topic)
    if hw < n:
        raise BenchError("relay burst: topic %s has %d messages, expected %d" % (topic, hw, n))
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "cpu": cpu, "delivered": hw,
            "errors": info[3] - info0[3], "last_error": info[4], "pid": pid,
            "insert_rate": n / insert_s}


# ---------------------------------------------------------------------------------------------
# figure 2: latency


def consume_main(args):
    """Latency consumer: assigned to every partition at its end offset; writes
    {message_id: receive time (CLOCK_MONOTONIC)} to args.out."""
    c = Consumer({"bootstrap.servers": args.bootstrap, "group.id": "eventbox-bench-latency",
                  "enable.auto.commit": False, "fetch.wait.max.ms": args.fetch_wait_ms,
                  "fetch.error.backoff.ms": 1, "enable.partition.eof": False})
    tps = []
    for p in range(args.partitions):
        lo, hi = c.get_watermark_offsets(TopicPartition(args.topic, p), timeout=10)
        tps.append(TopicPartition(args.topic, p, hi))
    c.assign(tps)
    # Make sure fetching has started before telling the producer to go.
    t_end = time.monotonic() + 2.0
    while time.monotonic() < t_end:
        c.poll(0.05)
    print("READY", flush=True)
    seen = {}
    dups = 0
    idle_deadline = None
    while True:
        # poll(), not consume(): consume() waits for a full batch or its timeout, which would
        # add up to that timeout to every receive time.
        m = c.poll(0.05)
        now = time.monotonic()
        if m is not None and not m.error():
            mid = None
            for k, v in m.headers() or []:
                if k == "message_id":
                    mid = v.decode()
            if mid is not None and mid in seen:
                dups += 1
            elif mid is not None:
                seen[mid] = now
        if idle_deadline is None and os.path.exists(args.stop_file):
            with open(args.stop_file) as f:
                expected = int(f.read().strip() or "0")
            idle_deadline = time.monotonic() + args.drain_s
        if idle_deadline is not None and (len(seen) >= expected
                                          or time.monotonic() > idle_deadline):
            break
    c.close()
    with open(args.out, "w") as f:
        json.dump({"seen": seen, "dups": dups}, f)


def paced_latency(env, tmpdir, topic, rate, seconds, fetch_wait_ms, send):
    """Calls send(i) -> message_id at `rate` per second for `seconds`, recording the client time
    when it returned, while a consumer (a separate process, started first, assigned to every
    partition of `topic` at its end offset) records when each message_id arrives."""
    out = os.path.join(tmpdir, topic + ".json")
    stop_file = os.path.join(tmpdir, topic + ".stop")
    cons = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "consume", "--bootstrap", env.bootstrap,
         "--topic", topic, "--partitions", str(PARTITIONS), "--out", out,
         "--stop-file", stop_file, "--fetch-wait-ms", str(fetch_wait_ms), "--drain-s", "15"],
        stdout=subprocess.PIPE)
    try:
        if cons.stdout.readline().strip() != b"READY":
            raise BenchError("latency consumer failed to start")
        n = int(rate * seconds)
        sent = {}
        late = 0
        t0 = time.monotonic()
        for i in range(n):
            target = t0 + i / rate
            now = time.monotonic()
            if target > now:
                time.sleep(target - now)
            elif now - target > 0.05:
                late += 1
            mid = send(i)
            sent[mid] = time.monotonic()
        produce_s = time.monotonic() - t0
        with open(stop_file + ".tmp", "w") as f:
            f.write(str(n))
        os.rename(stop_file + ".tmp", stop_file)
        if cons.wait(60) != 0:
            raise BenchError("latency consumer exited with %d" % cons.returncode)
    finally:
        if cons.poll() is None:
            cons.kill()
            cons.wait()
    with open(out) as f:
        got = json.load(f)
    seen = got["seen"]
    series = sorted((t - t0, (seen[m] - t) * 1000.0) for m, t in sent.items() if m in seen)
    lat = sorted(x[1] for x in series)
    missing = n - len(lat)
    if os.environ.get("BENCH_LATENCY_DUMP"):
        with open("%s.%s.json" % (os.environ["BENCH_LATENCY_DUMP"], topic), "w") as f:
            json.dump(series, f)
    # Stalls: runs of messages slower than 25 ms, as (offset s, messages, worst ms).
    stalls = []
    for off, ms in series:
        if ms < 25.0:
            continue
        if stalls and off - stalls[-1][0] - stalls[-1][3] < 0.1:
            st = stalls[-1]
            stalls[-1] = (st[0], st[1] + 1, max(st[2], ms), off - st[0])
        else:
            stalls.append((off, 1, ms, 0.0))
    if missing:
        raise BenchError("latency (%s): %d of %d messages never reached the consumer"
                         % (topic, missing, n))

    def pct(p):
        return lat[min(len(lat) - 1, int(round(p / 100.0 * (len(lat) - 1))))]

    return {"n": n, "achieved_rate": n / produce_s, "p50": pct(50), "p99": pct(99),
            "max": lat[-1], "min": lat[0], "mean": statistics.fmean(lat), "dups": got["dups"],
            "late_sends": late, "fetch_wait_ms": fetch_wait_ms,
            "stalls": [(round(a, 2), b, round(c, 1)) for a, b, c, _ in stalls]}


def run_latency(env, cur, tmpdir, rate, seconds, fetch_wait_ms, topic="bench_latency_relay",
                vacuum=True):
    """COMMIT of a one-message transaction -> consumer receive, through the relay. With vacuum,
    the (empty) outbox is vacuumed first, as autovacuum eventually does: the steady state."""
    env.broker.create_topic(topic, PARTITIONS)
    set_brokers(cur, env.bootstrap, "running")
    poll_ms = int(q1(cur, "SELECT setting FROM pg_settings WHERE name = "
                          "'eventbox.relay_poll_interval'"))
    heap_mib = q1(cur, "SELECT pg_table_size('eventbox.outbox') / 1048576.0")
    if vacuum:
        cur.execute("VACUUM eventbox.outbox")
        time.sleep(min(2.0 * poll_ms / 1000.0 + 0.2, 5.0))
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

    try:
        res = paced_latency(env, tmpdir, topic, rate, seconds, fetch_wait_ms, send)
    finally:
        conn.close()
    res["poll_ms"] = poll_ms
    res["outbox_mib"] = float(heap_mib)
    return res


def run_kafka_latency(env, tmpdir, rate, seconds, fetch_wait_ms):
    """Baseline: a plain librdkafka producer with the relay's settings (acks=all, idempotence,
    linger.ms=5, murmur2_random), produce() -> consumer receive, same broker and consumer."""
    from confluent_kafka import Producer
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

    res = paced_latency(env, tmpdir, topic, rate, seconds, fetch_wait_ms, send)
    if p.flush(30) != 0 or failed:
        raise BenchError("kafka latency baseline: %d delivery failures" % len(failed))
    return res


# ---------------------------------------------------------------------------------------------
# main


def mib(kb):
    return kb / 1024.0


def best(runs):
    return max(runs, key=lambda r: r["rate"])


def per_msg_us(runs, key):
    return sum(r["cpu"][key] for r in runs) / sum(r["n"] for r in runs) * 1e6


ROW = "%-36s %-20s %-26s %-7s %s"


def table(res):
    import bench_e2e
    import bench_inbox
    import bench_ops
    rows = [ROW % ("figure", "pg_eventbox", "baseline", "ratio", "target")]
    rows.append("-" * 104)
    if "relay" in res:
        rows.extend(relay_rows(res))
    rows.extend(bench_inbox.table_rows(res, ROW))
    rows.extend(bench_e2e.table_rows(res, ROW))
    rows.extend(bench_ops.table_rows(res, ROW))
    import bench_http
    rows.extend(bench_http.table_rows(res, ROW))
    return "\n".join(rows)


def relay_rows(res):
    rows = []
    for size in SIZES:
        r, k = best(res["relay"][size]), best(res["kcat"][size])
        ratio = r["rate"] / k["rate"]
        rows.append(ROW % ("relay %s (msg/s)" % size, "%.0f" % r["rate"], "kcat %.0f" % k["rate"],
                           "%.2f" % ratio, ">= 0.5 " + ("ok" if ratio >= 0.5 else "BELOW")))
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
                       "%.1f/%.1f" % (mib(first["VmRSS"]), mib(last["VmRSS"])), "-", "-",
                       "info (incl. shared_buffers)"))
    # Private memory is what could leak. It swings with what is in flight (up to
    # eventbox.relay_max_in_flight messages in librdkafka) and with glibc's heap, so the test is
    # on its trend: at the end (after the latency runs, little in flight) it must not exceed the
    # peak seen after the throughput runs, plus 10%.
    peak = max(st["RssAnon"] for name, st in m[1:-1]) if len(m) > 2 else first["RssAnon"]
    bounded = last["RssAnon"] <= peak * 1.1
    rows.append(ROW % ("relay private RssAnon peak/end (MiB)",
                       "%.1f/%.1f" % (mib(peak), mib(last["RssAnon"])),
                       "after %.2fM msgs" % (res["relayed"] / 1e6),
                       "%.2f" % (last["RssAnon"] / peak),
                       "end <= peak " + ("ok" if bounded else "GROWING")))
    return rows


def notes(res, args):
    import bench_e2e
    import bench_inbox
    import bench_ops
    out = relay_notes(res, args) if "relay" in res else []
    out.extend(bench_inbox.notes(res, args))
    out.extend(bench_e2e.notes(res, args))
    out.extend(bench_ops.notes(res, args))
    import bench_http
    out.extend(bench_http.notes(res, args))
    return "\n".join("  " + line for line in out)


def relay_notes(res, args):
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
        "%s %.1f/%.1f/%.1f" % (name, mib(st["VmRSS"]), mib(st["RssAnon"]), mib(st["RssShmem"]))
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
    out.append("pg_stat_user_tables for eventbox.outbox: n_tup_ins %d, n_tup_del %d (relay "
               "deleted %d)%s" % (ins, dels, res["relayed"],
                                  " -- WARNING: the relay's deletes never reach the statistics "
                                  "(autovacuum cannot see its dead rows)"
                                  if res["relayed"] > 0 and dels == 0 else ""))
    errs = sum(x.get("errors", 0) for s in SIZES for x in r[s])
    if errs:
        out.append("relay recorded %d error(s) during the runs; last: %s"
                   % (errs, r[SIZES[-1]][-1]["last_error"]))
    return out


SECTIONS = ("relay", "ingest", "handlers", "e2e", "ops", "e2e_peer", "http")


def run_main(args):
    import bench_inbox
    env = Env(args.env_dir)
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    unknown = [x for x in sections if x not in SECTIONS]
    if unknown or not sections:
        raise BenchError("unknown section(s) %s; known: %s" % (unknown, ",".join(SECTIONS)))
    conn = env.connect()
    cur = conn.cursor()
    cur.execute("CREATE EXTENSION IF NOT EXISTS pg_eventbox")
    relay_pid(cur)
    set_brokers(cur, env.bootstrap, "running")
    pg_groups = {"postgres": env.pg_pids, "broker": lambda: [env.broker_pid]}
    res = {"sections": sections}
    tmpdir = tempfile.mkdtemp(prefix="eventbox-bench.")
    try:
        if "relay" in sections:
            run_relay_section(env, cur, args, pg_groups, res, tmpdir)
        if "ingest" in sections:
            bench_inbox.section_ingest(env, cur, args, pg_groups, res)
        if "handlers" in sections:
            bench_inbox.section_handlers(env, cur, args, pg_groups, res)
        if "e2e" in sections and args.e2e_seconds > 0:
            bench_inbox.section_e2e(env, cur, args, tmpdir, res)
        if "ops" in sections:
            import bench_ops
            bench_ops.section(env, cur, args, pg_groups, res)
        if "http" in sections:
            import bench_http
            bench_http.section(env, cur, args, res, tmpdir)
        if "e2e_peer" in sections:
            import bench_e2e
            conn.close()  # the kill test restarts every backend
            bench_e2e.section(env, args, pg_groups, res, tmpdir)
    finally:
        for name in os.listdir(tmpdir):
            os.unlink(os.path.join(tmpdir, name))
        os.rmdir(tmpdir)
    text = "pg_eventbox bench  %s  (%d CPUs; sections %s)%s\n%s\n\nnotes:\n%s\n" % (
        time.strftime("%Y-%m-%d %H:%M:%S"), os.cpu_count(), ",".join(sections),
        "\nbuild: " + args.build if args.build else "", table(res), notes(res, args))
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)


def run_relay_section(env, cur, args, pg_groups, res, tmpdir):
    n = args.messages
    pid = relay_pid(cur)
    res.update({"memory": [("start", proc_status(pid))], "relay": {}, "kcat": {}})
    for size in SIZES:
        log("generating %d payloads of ~%s" % (n, size))
        payloads = make_payloads(n, SIZES[size], seed=SIZES[size])
        kcat_path, copy_path = write_files(payloads, tmpdir, size)
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
        log("latency right after the burst: relay, %d msg/s for 3s" % args.latency_rate)
        res["latency_after_burst"] = run_latency(env, cur, tmpdir, args.latency_rate, 3,
                                                 args.fetch_wait_ms,
                                                 topic="bench_latency_after_burst",
                                                 vacuum=False)
        log("  p50 %.1f ms p99 %.1f ms" % (res["latency_after_burst"]["p50"],
                                           res["latency_after_burst"]["p99"]))
    if args.latency_seconds > 0:
        log("latency: relay, %d msg/s for %ds" % (args.latency_rate, args.latency_seconds))
        res["latency"] = run_latency(env, cur, tmpdir, args.latency_rate,
                                     args.latency_seconds, args.fetch_wait_ms)
        log("  p50 %.1f ms p99 %.1f ms" % (res["latency"]["p50"], res["latency"]["p99"]))
        res["memory"].append(("after latency", proc_status(pid)))
        log("latency baseline: plain producer, %d msg/s for %ds"
            % (args.latency_rate, args.latency_seconds))
        res["latency_kafka"] = run_kafka_latency(env, tmpdir, args.latency_rate,
                                                 args.latency_seconds, args.fetch_wait_ms)
        log("  p50 %.1f ms p99 %.1f ms" % (res["latency_kafka"]["p50"],
                                           res["latency_kafka"]["p99"]))
    if relay_pid(cur) != pid:
        raise BenchError("the relay process was restarted during the bench")
    res["relayed"] = relay_info(cur)[2]
    cur.execute("SELECT n_tup_ins, n_tup_del FROM pg_stat_user_tables "
                "WHERE relid = 'eventbox.outbox'::regclass")
    res["outbox_stats"] = cur.fetchone()


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--env-dir", required=True)
    r.add_argument("--messages", type=int, default=300000)
    r.add_argument("--repeat", type=int, default=3)
    r.add_argument("--burst", type=int, default=1)
    r.add_argument("--latency-rate", type=int, default=1000)
    r.add_argument("--latency-seconds", type=int, default=10)
    r.add_argument("--fetch-wait-ms", type=int, default=1)
    r.add_argument("--sections", default=",".join(SECTIONS))
    r.add_argument("--build", default="")
    r.add_argument("--ingest-messages", type=int, default=100000)
    r.add_argument("--naive-messages", type=int, default=5000)
    r.add_argument("--replay-stall-s", type=float, default=20)
    r.add_argument("--handler-messages", type=int, default=50000)
    r.add_argument("--e2e-rate", type=int, default=1000)
    r.add_argument("--e2e-seconds", type=int, default=10)
    r.add_argument("--e2e-orders", type=int, default=50000)
    r.add_argument("--e2e-repeat", type=int, default=1)
    r.add_argument("--e2e-kill-orders", type=int, default=20000)
    r.add_argument("--e2e-kill", choices=("relay", "handler"), default="relay")
    r.add_argument("--backlog-sizes", default="10000,100000",
                   type=lambda s: [int(x) for x in s.split(",") if x])
    r.add_argument("--ops-messages", type=int, default=300000)
    r.add_argument("--ops-repeat", type=int, default=6)
    r.add_argument("--ops-purge-rows", type=int, default=1000000)
    r.add_argument("--ops-purge-messages", type=int, default=600000)
    r.add_argument("--ops-purge-repeat", type=int, default=2)
    r.add_argument("--ops-cycles", type=int, default=5)
    r.add_argument("--ops-cycle-rows", type=int, default=200000)
    r.add_argument("--http-messages", type=int, default=100000)
    r.add_argument("--http-repeat", type=int, default=1)
    r.add_argument("--http-port", type=int, default=54336)
    r.add_argument("--out")
    r.add_argument("--json")
    c = sub.add_parser("consume")
    c.add_argument("--bootstrap", required=True)
    c.add_argument("--topic", required=True)
    c.add_argument("--partitions", type=int, required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--stop-file", required=True)
    c.add_argument("--fetch-wait-ms", type=int, default=1)
    c.add_argument("--drain-s", type=float, default=15)
    args = ap.parse_args()
    # bench_inbox imports this file as `bench`: let it find this very module (one BenchError).
    sys.modules.setdefault("bench", sys.modules[__name__])
    try:
        if args.cmd == "run":
            run_main(args)
        else:
            consume_main(args)
    except BenchError as e:
        print("bench: FAILED: %s" % e, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
