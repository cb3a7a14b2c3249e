"""Section e2e_peer: Kafka (orders, 5% of them sent twice as a producer's retry does) -> inbox
-> handler (INSERT a row + send one message) -> outbox -> Kafka, clock until every outgoing
message is acknowledged by the broker (the output topic's high watermarks add up to N), against
bench/peer.py (one process, two processes with the partitions split, and the batch variant) on
the same input topic; pg_eventbox runs once with a per-message handler and once with a batch
handler doing the batch peer's logic (one INSERT ... SELECT per chunk).
  Kill test: one SIGKILL in the middle of each side, lost and duplicated outgoing messages.
  Backlog scaling: the extension's rate with 10k, 100k (and 1M) orders queued in Kafka.

The section runs on the cluster as it is (fresh from run.sh, stock settings): nothing here runs
ANALYZE or VACUUM; tables are emptied with TRUNCATE between runs."""

import json
import os
import signal
import subprocess
import sys
import time

from confluent_kafka import Consumer, TopicPartition

from lib.cluster import q1
from lib.common import REPO, BenchError, log
from lib.eventbox import HANDLER_ROLE, create_disabled_subscription, create_handler_role
from lib.kafka import Watermarks, produce, watermarks
from lib.messages import DUP_EVERY, DUP_LATER, make_payloads, with_duplicates
from lib.proc import TICKS, CpuMeter, proc_cpu
from lib.table import ROW, best, per_msg_us, steady_rate

PARTITIONS = 8             # input and output topics of the e2e figures
BACKLOG_PARTITIONS = 128   # backlog runs: 1M orders must fit the mock's ~5 MiB per partition
PEER = os.path.join(REPO, "bench", "peer.py")
PEERS = (("peer1", "row", 1, "peer, 1 process"), ("peer2", "row", 2, "peer, 2 processes"),
         ("peerb", "batch", 1, "batch peer"))


def setup(cur):
    create_handler_role(cur)
    cur.execute("GRANT USAGE ON SCHEMA eventbox TO %s" % HANDLER_ROLE)
    cur.execute("GRANT EXECUTE ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid) TO %s"
                % HANDLER_ROLE)
    # The same business tables on both sides: the extension's handler writes bench_orders, the
    # peer its own inbox, peer_orders and its offsets.
    for t in ("bench_orders", "peer_orders"):
        cur.execute("CREATE TABLE IF NOT EXISTS public.%s (order_id bigint PRIMARY KEY, "
                    "message_id text NOT NULL, customer text, amount bigint)" % t)
    cur.execute("GRANT INSERT ON public.bench_orders TO %s" % HANDLER_ROLE)
    cur.execute('CREATE TABLE IF NOT EXISTS public.peer_inbox (message_id text PRIMARY KEY, '
                'topic text NOT NULL, "partition" int NOT NULL, "offset" bigint NOT NULL, '
                'key bytea, payload jsonb, event_type text, '
                'received_at timestamptz NOT NULL DEFAULT now())')
    cur.execute('CREATE TABLE IF NOT EXISTS public.peer_offsets (consumer text, topic text, '
                '"partition" int, next_offset bigint NOT NULL, '
                'PRIMARY KEY (consumer, topic, "partition"))')


def handler_sql(fn, out_topic):
    """The extension's handler: the peer's per-row logic (one INSERT, one outgoing message)."""
    return """
        CREATE OR REPLACE FUNCTION public.%s(m eventbox.inbox) RETURNS void
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.bench_orders (order_id, message_id, customer, amount)
            VALUES ((m.payload->>'id')::bigint, m.message_id, m.payload->>'customer',
                    (m.payload->>'amount')::bigint);
            PERFORM eventbox.send('%s',
                jsonb_build_object('order_id', (m.payload->>'id')::bigint,
                                   'customer', m.payload->>'customer', 'status', 'accepted'),
                convert_from(m.key, 'UTF8'), '{"event_type": "OrderAccepted"}');
        END $$""" % (fn, out_topic)


def batch_handler_sql(fn, out_topic):
    """The extension's batch handler: the batch peer's logic, once per chunk of a lane."""
    return """
        CREATE OR REPLACE FUNCTION public.%s(ms eventbox.inbox[]) RETURNS void
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.bench_orders (order_id, message_id, customer, amount)
            SELECT (m.payload->>'id')::bigint, m.message_id, m.payload->>'customer',
                   (m.payload->>'amount')::bigint
            FROM unnest(ms) m;
            PERFORM eventbox.send('%s',
                jsonb_build_object('order_id', (m.payload->>'id')::bigint,
                                   'customer', m.payload->>'customer', 'status', 'accepted'),
                convert_from(m.key, 'UTF8'), '{"event_type": "OrderAccepted"}')
            FROM unnest(ms) m;
        END $$""" % (fn, out_topic)


def produce_orders(env, topic, n, partitions):
    """n orders (the ~200 B JSON payloads of lib/messages.py, "id" 1..n) to a fresh topic, order
    i in partition i % partitions, 5% of them again 1-8 records of their partition later (a
    producer's retry: same key, payload and headers); checks the broker kept all of them.
    Returns the records produced."""
    payloads = make_payloads(n, 200, seed=200)
    records, _dups = with_duplicates((
        (payload.encode(), key.encode(), i % partitions,
         [("event_type", "OrderCreated"),
          ("message_id", "0000e2e0-%04x-7000-8000-%012x" % (partitions, i))])
        for i, (key, payload) in enumerate(payloads)), seed=201)
    produce(env, topic, partitions, records)
    return len(records)


def read_back(env, topic, partitions, n):
    """Every outgoing message: counts per order id, and whether the copies of a duplicated order
    carry one message_id header. Returns {lost, dups, dup_orders, dup_same_id, total,
    foreign}."""
    _lo, hi = watermarks(env, topic, partitions)
    c = Consumer({"bootstrap.servers": env.bootstrap, "group.id": "bench-e2e-readback",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    ids = {}
    got = eof = 0
    deadline = time.monotonic() + 120 + hi / 5000
    try:
        while got < hi and time.monotonic() < deadline:
            for m in c.consume(10000, timeout=1):
                if m.error():
                    eof += 1
                    continue
                got += 1
                order = json.loads(m.value())["order_id"]
                mid = dict(m.headers() or []).get("message_id")
                ids.setdefault(order, []).append(mid)
    finally:
        c.close()
    if got < hi:
        raise BenchError("read back %d of %d messages of %s" % (got, hi, topic))
    wanted = set(range(1, n + 1))
    dup_orders = {o: m for o, m in ids.items() if len(m) > 1}
    return {"total": got, "lost": len(wanted - set(ids)), "foreign": len(set(ids) - wanted),
            "dups": got - len(ids), "dup_orders": len(dup_orders),
            "dup_same_id": all(len(set(m)) == 1 and m[0] is not None
                               for m in dup_orders.values())}


def worker_pid(cur, role, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        cur.execute("SELECT pid FROM eventbox.workers WHERE role = %s AND state <> 'starting' "
                    "ORDER BY pid LIMIT 1", (role,))
        row = cur.fetchone()
        if row:
            return row[0]
        if time.monotonic() > deadline:
            raise BenchError("no %s worker in eventbox.workers after %ds" % (role, timeout))
        time.sleep(0.1)


def run_ext(env, in_topic, n, partitions, tag, pg_groups, kill=None, batch=False):
    """Subscription on in_topic created disabled with the handler registered (batch: the batch
    handler), clock from enabling it until the output topic's high watermarks add up to n (every
    outgoing message acknowledged). kill='relay' | 'handler': SIGKILL that worker once half the
    messages are out, then wait for everything to be processed and the outbox empty."""
    conn, cur = env.connect_retrying()
    out_topic, sub, fn = "bench_out_ext_" + tag, "bench_ext_" + tag, "bench_on_order_" + tag
    env.broker.create_topic(out_topic, partitions)
    cur.execute("TRUNCATE eventbox.inbox, public.bench_orders")
    cur.execute((batch_handler_sql if batch else handler_sql)(fn, out_topic))
    create_disabled_subscription(cur, sub, in_topic, unhandled=None, batch=batch,
                                 handler="public.%s(eventbox.inbox%s)" % (fn, "[]" if batch
                                                                          else ""))
    time.sleep(0.3)
    wm = Watermarks(env, out_topic, partitions)
    killed = None
    roles = {}
    cur.execute("SELECT role, array_agg(pid) FROM eventbox.workers GROUP BY role")
    for role, pids in cur.fetchall():
        roles[role] = list(pids)
    meter = CpuMeter(dict(pg_groups, ingest=lambda: roles.get("ingest", []),
                          handlers=lambda: roles.get("handler", []),
                          relay=lambda: roles.get("relay", [])))
    meter.start()
    t0 = time.monotonic()
    cur.execute("SELECT eventbox.alter_subscription(%s, enabled => true)", (sub,))
    first = None
    deadline = t0 + max(300, n / 200)
    while True:
        time.sleep(0.05)
        high = wm.high()
        now = time.monotonic()
        if first is None and high > 0:
            first, first_count = now - t0, high
        if kill and killed is None and high >= n // 2:
            killed = worker_pid(cur, kill)
            os.kill(killed, signal.SIGKILL)
            with open(env.vals["EVENTBOX_KILLED_PIDS"], "a") as f:
                f.write("%d\n" % killed)
            log("  SIGKILL %s worker %d with %d of %d messages out" % (kill, killed, high, n))
            time.sleep(0.5)
            conn.close()
            conn, cur = env.connect_retrying()
        if not kill and high >= n:
            break
        if kill and killed and high >= n:
            # Duplicates count in the watermarks: done when every order went through.
            cur.execute("SELECT (SELECT count(*) FROM eventbox.inbox WHERE subscription = %s "
                        "AND status = 'processed'), NOT EXISTS (SELECT 1 FROM eventbox.outbox)",
                        (sub,))
            done, empty = cur.fetchone()
            if done == n and empty:
                break
        if now > deadline:
            raise BenchError("e2e %s: %d of %d outgoing messages after %.0fs"
                             % (sub, high, n, now - t0))
    elapsed = time.monotonic() - t0
    cpu = meter.stop()
    wm.close()
    cur.execute("SELECT eventbox.alter_subscription(%s, enabled => false)", (sub,))
    rows = q1(cur, "SELECT count(*) FROM public.bench_orders")
    conn.close()
    check = read_back(env, out_topic, partitions, n)
    if rows != n or check["lost"] or check["foreign"] or (not kill and check["dups"]):
        raise BenchError("e2e %s: %d orders stored, output %r (expected %d, none lost)"
                         % (sub, rows, check, n))
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "cpu": cpu, "first_s": first,
            "steady_rate": steady_rate(n, elapsed, first, first_count if first else 0),
            "check": check, "killed": killed}


def start_peer(env, in_topic, out_topic, parts, name, mode, linger, pause_at=0,
               pause_file=None):
    cmd = [sys.executable, PEER, "--dsn", env.dsn, "--bootstrap", env.bootstrap,
           "--in-topic", in_topic, "--out-topic", out_topic, "--name", name, "--mode", mode,
           "--partitions", ",".join(str(p) for p in parts), "--linger-ms", str(linger)]
    if pause_at:
        cmd += ["--pause-after-commit", str(pause_at), "--pause-file", pause_file]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        raise BenchError("peer did not start: %r (rc %s)" % (line, proc.wait()))
    return proc


def finish_peer(proc):
    out = proc.stdout.read().strip()
    rc = proc.wait(60)
    if rc != 0 or not out.startswith("done"):
        raise BenchError("peer exited with %d: %r" % (rc, out))
    return [int(x) for x in out.split()[1:]]


def run_peer(env, in_topic, n, partitions, tag, mode, procs, linger, pg_groups, tmpdir,
             kill=False):
    """procs peer processes (partitions dealt out round robin), started and connected before
    the clock; clock from telling them to go until the output topic's high watermarks add up
    to n. kill: one process, paused after the commit of the batch that brings it past n/2
    messages, SIGKILLed there, then a fresh process finishes the run."""
    conn, cur = env.connect_retrying()
    out_topic, name = "bench_out_%s" % tag, "peer_" + tag
    env.broker.create_topic(out_topic, partitions)
    cur.execute("TRUNCATE public.peer_inbox, public.peer_orders, public.peer_offsets")
    cur.execute("CHECKPOINT")
    pause_file = os.path.join(tmpdir, "peer_paused_" + tag)
    splits = [[p for p in range(partitions) if p % procs == i] for i in range(procs)]
    pids = []
    meter = CpuMeter(dict(pg_groups, peer=lambda: list(pids)))
    ps = [start_peer(env, in_topic, out_topic, s, name, mode, linger,
                     pause_at=n // 2 if kill else 0, pause_file=pause_file) for s in splits]
    pids.extend(p.pid for p in ps)
    wm = Watermarks(env, out_topic, partitions)
    meter.start()
    t0 = time.monotonic()
    for p in ps:
        p.stdin.write("go\n")
        p.stdin.flush()
    first = None
    paused = None
    deadline = t0 + max(300, n / 100)
    last_cpu = {}
    while True:
        time.sleep(0.05)
        for p in ps:  # a process' CPU is gone from /proc once reaped: keep its last sample
            t = proc_cpu(p.pid)
            if t is not None:
                last_cpu[p.pid] = t
        high = wm.high()
        now = time.monotonic()
        if first is None and high > 0:
            first, first_count = now - t0, high
        if kill and paused is None and os.path.exists(pause_file):
            with open(pause_file) as f:
                consumed, lost_batch = (int(x) for x in f.read().split())
            os.kill(ps[0].pid, signal.SIGKILL)
            ps[0].wait()
            paused = {"consumed": consumed, "batch_out": lost_batch}
            log("  SIGKILL peer %d after its commit of %d messages, before producing the "
                "batch's %d outgoing messages" % (ps[0].pid, consumed, lost_batch))
            ps = [start_peer(env, in_topic, out_topic, splits[0], name, mode, linger)]
            pids.append(ps[0].pid)
            ps[0].stdin.write("go\n")
            ps[0].stdin.flush()
        if high >= n:
            break
        if kill and paused and ps[0].poll() is not None:
            break  # the restarted peer finished: what is missing stays missing
        if any(p.poll() not in (None, 0) for p in ps):
            raise BenchError("peer %s exited with %s" % (tag, [p.poll() for p in ps]))
        if now > deadline:
            raise BenchError("peer %s: %d of %d outgoing messages after %.0fs"
                             % (tag, high, n, now - t0))
    elapsed = time.monotonic() - t0
    cpu = meter.stop()
    cpu["peer_s"] = sum(last_cpu.values()) / TICKS
    wm.close()
    stats = [finish_peer(p) for p in ps]
    rows = q1(cur, "SELECT count(*) FROM public.peer_orders")
    conn.close()
    check = read_back(env, out_topic, partitions, n)
    if rows != n or check["foreign"] or (not kill and (check["lost"] or check["dups"])):
        raise BenchError("peer %s: %d orders stored, output %r (expected %d)"
                         % (tag, rows, check, n))
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "cpu": cpu, "first_s": first,
            "steady_rate": steady_rate(n, elapsed, first, first_count if first else 0),
            "check": check, "paused": paused, "batches": sum(s[2] for s in stats)}


def run(ctx):
    env, args, pg_groups, res, tmpdir = ctx.env, ctx.args, ctx.pg_groups, ctx.res, ctx.tmpdir
    ctx.conn.close()  # the kill test restarts every backend
    conn, cur = env.connect_retrying()
    setup(cur)
    linger = 5  # librdkafka's default linger.ms: the peers' producers as their authors start them
    stats = q1(cur, "SELECT count(*) FROM pg_stats WHERE schemaname = 'eventbox'")
    conn.close()
    n = args.e2e_orders
    out = res["e2e_peer"] = {"n": n, "runs": {}, "linger": linger, "stats_before": stats,
                             "other_sections": [s for s in res["sections"] if s != "e2e_peer"]}
    in_topic = "bench_orders_in"
    log("e2e_peer: %d orders to %s (%d partitions)" % (n, in_topic, PARTITIONS))
    out["records"] = produce_orders(env, in_topic, n, PARTITIONS)
    for rep in range(args.e2e_repeat):
        sides = [("ext", None), ("extb", None)] + [(p[0], p) for p in PEERS]
        for name, peer in sides:
            tag = "%s_%d" % (name, rep + 1)
            if peer is None:
                log("e2e_peer %s: pg_eventbox%s" % (tag, ", batch handler" if name == "extb"
                                                     else ""))
                x = run_ext(env, in_topic, n, PARTITIONS, tag, pg_groups, batch=name == "extb")
            else:
                log("e2e_peer %s: %s" % (tag, peer[3]))
                x = run_peer(env, in_topic, n, PARTITIONS, tag, peer[1], peer[2], linger,
                             pg_groups, tmpdir)
            out["runs"].setdefault(name, []).append(x)
            log("  %.0f msg/s in %.2fs (first out after %.2fs), box CPU %.1f us/msg"
                % (x["rate"], x["elapsed"], x["first_s"] or -1, x["cpu"]["box_s"] / n * 1e6))
    if args.e2e_kill_orders > 0:
        k = args.e2e_kill_orders
        kin = "bench_orders_kill"
        log("e2e_peer kill test: %d orders to %s" % (k, kin))
        produce_orders(env, kin, k, PARTITIONS)
        x = run_ext(env, kin, k, PARTITIONS, "kill", pg_groups, kill=args.e2e_kill)
        out["kill_ext"] = x
        log("  pg_eventbox: lost %d, duplicated %d (%d orders; same message_id: %s)"
            % (x["check"]["lost"], x["check"]["dups"], x["check"]["dup_orders"],
               x["check"]["dup_same_id"]))
        x = run_peer(env, kin, k, PARTITIONS, "peerkill", "row", 1, linger, pg_groups, tmpdir,
                     kill=True)
        out["kill_peer"] = x
        log("  peer: lost %d, duplicated %d" % (x["check"]["lost"], x["check"]["dups"]))
    out["backlog"] = []
    for size in args.backlog_sizes:
        topic = "bench_backlog_%d" % size
        log("e2e_peer backlog: %d orders to %s (%d partitions)" % (size, topic,
                                                                   BACKLOG_PARTITIONS))
        produce_orders(env, topic, size, BACKLOG_PARTITIONS)
        x = run_ext(env, topic, size, BACKLOG_PARTITIONS, "backlog_%d" % size, pg_groups)
        out["backlog"].append(x)
        log("  %.0f msg/s in %.2fs; after the first outgoing message %.0f msg/s"
            % (x["rate"], x["elapsed"], x["steady_rate"] or 0))
    conn, cur = env.connect_retrying()
    cur.execute("TRUNCATE eventbox.inbox, public.bench_orders, public.peer_inbox, "
                "public.peer_orders, public.peer_offsets")
    conn.close()


def table_rows(res):
    e = res.get("e2e_peer")
    if not e:
        return []
    rows = []
    runs = e["runs"]
    ext = best(runs["ext"])
    for name, target, label in (("peer1", 4.0, "peer 1 proc"), ("peer2", 2.5, "peer 2 procs"),
                                ("peerb", 1.5, "batch peer")):
        b = best(runs[name])
        r = ext["rate"] / b["rate"]
        rows.append(ROW % ("e2e orders vs %s (msg/s)" % label, "%.0f" % ext["rate"],
                           "%s %.0f" % (label, b["rate"]), "%.2f" % r,
                           ">= %g %s" % (target, "ok" if r >= target else "BELOW")))
    b, peerb = best(runs["extb"]), best(runs["peerb"])
    r = b["rate"] / peerb["rate"]
    rows.append(ROW % ("e2e batch handler vs batch peer", "%.0f" % b["rate"],
                       "batch peer %.0f" % peerb["rate"], "%.2f" % r,
                       ">= 2.5 " + ("ok" if r >= 2.5 else "BELOW")))

    def mean_us(name):
        return sum(box_us(x) for x in runs[name]) / len(runs[name])
    e_us, p_us = mean_us("ext"), mean_us("peerb")
    rows.append(ROW % ("  cpu/msg whole box (us)", "%.1f" % e_us, "batch peer %.1f" % p_us,
                       "%.2f" % (e_us / p_us),
                       "<= 1 " + ("ok" if e_us <= p_us else "ABOVE")))
    rows.append(ROW % ("  cpu/msg box, others (us)", "batch handler %.1f" % mean_us("extb"),
                       "1 proc %.1f, 2 procs %.1f" % (mean_us("peer1"), mean_us("peer2")), "-",
                       "info"))
    ke, kp = e.get("kill_ext"), e.get("kill_peer")
    if ke and kp:
        c, d = ke["check"], kp["check"]
        rows.append(ROW % ("  SIGKILL mid-run: lost/duplicated", "%d/%d%s" % (
            c["lost"], c["dups"], " same id" if c["dups"] and c["dup_same_id"] else ""),
            "peer %d/%d" % (d["lost"], d["dups"]), "-",
            "0 lost, dups same id " + ("ok" if c["lost"] == 0 and (
                not c["dups"] or c["dup_same_id"]) else "BROKEN")))
    bl = e.get("backlog") or []
    if len(bl) >= 2:
        small, large = bl[0], bl[-1]
        rs, rl = small["steady_rate"] or small["rate"], large["steady_rate"] or large["rate"]
        r = rl / rs
        rows.append(ROW % ("e2e rate %dk vs %dk queued (msg/s)" % (large["n"] // 1000,
                                                                   small["n"] // 1000),
                           "%.0f" % rl, "%dk %.0f" % (small["n"] // 1000, rs), "%.2f" % r,
                           ">= 0.9 " + ("ok" if r >= 0.9 else "BELOW")))
        rows.append(ROW % ("  cpu/msg box per backlog (us)",
                           "/".join("%.1f" % box_us(x) for x in bl),
                           "/".join("%dk" % (x["n"] // 1000) for x in bl), "-", "info"))
    return rows


def notes(res, args):
    e = res.get("e2e_peer")
    if not e:
        return []
    out = [
        "e2e_peer: %d orders (~200 B JSON, headers event_type + message_id, 1000 keys) produced "
        "beforehand to a topic of %d partitions as %d records (every %dth order again %d-%d "
        "records of its partition later: a producer's retry), read by each side in turn; "
        "output topics of %d partitions. pg_eventbox: subscription created disabled with the "
        "handler registered (PL/pgSQL, run_as %s: INSERT INTO bench_orders + PERFORM "
        "eventbox.send(...) of one ~80 B JSON message; the batch handler: one INSERT ... SELECT "
        "FROM unnest(ms) and one PERFORM eventbox.send(...) FROM unnest(ms) per chunk), clock "
        "from enabling it until the output topic's high watermarks "
        "add up to N (polled every 50 ms), stock settings. Peer (bench/peer.py): "
        "confluent_kafka consumer assigned at the offsets in its table, batches of up to 1000: "
        "execute_values INSERT ... ON CONFLICT DO NOTHING RETURNING into peer_inbox, per new "
        "row one INSERT INTO peer_orders (batch peer: one WITH statement for the whole batch), "
        "offsets upserted, COMMIT, then the outgoing messages produced (acks=all, idempotence, "
        "linger.ms=%d, librdkafka's default) and flushed; started and connected before the clock, "
        "clock from 'go' to the same high watermarks. Runs per side: %s. Whole-box CPU from "
        "/proc/stat busy ticks / N (every process on the machine)"
        % (e["n"], PARTITIONS, e["records"], DUP_EVERY, DUP_LATER[0], DUP_LATER[1], PARTITIONS,
           HANDLER_ROLE, e["linger"], len(e["runs"]["ext"]))]
    if e["other_sections"] or e["stats_before"]:
        out.append("e2e_peer: NOTE the sections %s ran before in this cluster (%d pg_stats rows "
                   "on eventbox tables): not a fresh cluster; run BENCH_SECTIONS=e2e_peer alone "
                   "for the figure" % (",".join(e["other_sections"]), e["stats_before"]))
    for name, runs in e["runs"].items():
        out.append("e2e_peer %s runs: %s" % (name, "; ".join(
            "%.0f msg/s, %.2fs, first out after %.2fs, box %.1f us/msg%s" % (
                x["rate"], x["elapsed"], x["first_s"] or -1, box_us(x),
                (", peer processes %.1f us/msg, %d batches" % (
                    x["cpu"]["peer_s"] / x["n"] * 1e6, x["batches"])) if "batches" in x else
                (", postgres %.1f us/msg (ingest %.1f, handlers %.1f, relay %.1f)" % tuple(
                    x["cpu"][k] / x["n"] * 1e6 for k in ("postgres_s", "ingest_s", "handlers_s",
                                                         "relay_s"))))
            for x in runs)))
    ke, kp = e.get("kill_ext"), e.get("kill_peer")
    if ke and kp:
        out.append(
            "kill test, %d orders: pg_eventbox: SIGKILL of the %s worker (pid %d) once half the "
            "outgoing messages were acknowledged (the postmaster restarts every backend), then "
            "until every order is processed and the outbox empty: %d outgoing messages read "
            "back, %d lost, %d duplicates of %d orders (all copies with one message_id header: "
            "%s). Peer (1 process): paused after the COMMIT of the batch that took it past %d "
            "messages, SIGKILLed before producing that batch's %d messages, restarted from its "
            "offsets: %d read back, %d lost, %d duplicates"
            % (ke["n"], args.e2e_kill, ke["killed"], ke["check"]["total"], ke["check"]["lost"],
               ke["check"]["dups"], ke["check"]["dup_orders"], ke["check"]["dup_same_id"],
               kp["n"] // 2, kp["paused"]["batch_out"], kp["check"]["total"],
               kp["check"]["lost"], kp["check"]["dups"]))
    if e.get("backlog"):
        out.append("backlog: pg_eventbox alone, N orders queued in a topic of %d partitions "
                   "(the mock keeps ~5 MiB per partition) before the subscription is enabled; "
                   "the figure's rate counts from the first outgoing message seen to the last "
                   "(consumer start left out): %s" % (BACKLOG_PARTITIONS, "; ".join(
                       "%d: %.0f msg/s (whole run %.0f msg/s, %.2fs; CPU us/msg: box %.1f, "
                       "ingest %.1f, handlers %.1f, relay %.1f)" % (
                           x["n"], x["steady_rate"] or 0, x["rate"], x["elapsed"], box_us(x),
                           x["cpu"]["ingest_s"] / x["n"] * 1e6,
                           x["cpu"]["handlers_s"] / x["n"] * 1e6,
                           x["cpu"]["relay_s"] / x["n"] * 1e6)
                       for x in e["backlog"])))
    return out


def box_us(x):
    """Whole-box CPU per message of one run, in microseconds."""
    return per_msg_us([x], "box_s")
