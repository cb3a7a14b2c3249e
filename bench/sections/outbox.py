"""Section outbox: the outbox over cycles of send() and relay with eventbox.outbox_retention on,
as it runs for months. Nothing is asserted on time, and nothing VACUUMs: autovacuum runs with
its defaults.

  cycles  BENCH_OUTBOX_CYCLES cycles of BENCH_OUTBOX_MESSAGES send() calls (~200 B JSON, 1000
          keys, 10,000 per transaction, one session), published by the relay to one topic of 32
          partitions with eventbox.outbox_retention = BENCH_OUTBOX_RETENTION seconds. A cycle
          ends when the relay acknowledged its messages and no table behind the outbox holds a
          row of the cycles before it any more (they go with the truncate of their rotated
          table, docs/design/outbox-rotation.md); then the size of the tables behind the outbox
          (heap, TOAST, free space and visibility maps, indexes) is read. Figure: the
          largest of those sizes against the first cycle's (target <= 1.2x; the last cycle's
          is printed too: with rotation it depends on where the rotations fell). Also printed:
          n_dead_tup of those tables then, the WAL written per message over a cycle (send,
          relay, truncate of the earlier cycles' rows: every process, pg_current_wal_lsn()
          before and after), the send() transactions' wall time per message and the relay
          process's CPU per message.

The dev broker keeps at most ~5 MiB per partition and drops the oldest beyond that: the figures
count what the relay acknowledged (eventbox.workers.messages), not what the topic holds."""

import time

from lib.cluster import q1
from lib.common import BenchError, log
from lib.eventbox import outbox_sizes, outbox_stat, relay_info, relay_pid, set_conf
from lib.proc import TICKS, proc_cpu
from lib.table import ROW, mib, ok

PARTITIONS = 32
PER_TRANSACTION = 10000
TARGET = 1.2
RUN = "%x" % int(time.time())  # a cluster kept from an earlier run (BENCH_KEEP) has old topics


def lsn(cur):
    return int(q1(cur, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


def send_cycle(env, topic, first, n):
    """Sends ids first .. first + n - 1 with eventbox.send(), PER_TRANSACTION per transaction;
    returns the seconds spent in the transactions (COMMIT included)."""
    conn = env.connect(autocommit=False)
    c2 = conn.cursor()
    spent = 0.0
    for lo in range(first, first + n, PER_TRANSACTION):
        hi = min(first + n - 1, lo + PER_TRANSACTION - 1)
        t0 = time.monotonic()
        c2.execute("SELECT count(eventbox.send(%s, jsonb_build_object('id', g, 'pad', "
                   "repeat('x', 150)), key => 'customer-' || (g %% 1000)::text)) "
                   "FROM generate_series(%s::int8, %s::int8) g", (topic, lo, hi))
        c2.fetchone()
        conn.commit()
        spent += time.monotonic() - t0
    conn.close()
    return spent


def wait_until(cur, what, check, timeout):
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise BenchError("outbox: %s not within %d s; relay: %r"
                             % (what, timeout, relay_info(cur)))
        time.sleep(0.1)
    return time.monotonic() - t0


def run(ctx):
    env, cur, args, res = ctx.env, ctx.cur, ctx.args, ctx.res
    n, cycles, retention = args.outbox_messages, args.outbox_cycles, args.outbox_retention
    if q1(cur, "SELECT count(*) FROM eventbox.outbox") != 0:
        raise BenchError("eventbox.outbox is not empty before the outbox section")
    # A fresh outbox: what earlier sections left (dead rows, a grown heap) must not pad cycle 1.
    cur.execute("SELECT eventbox.truncate_outbox()")
    topic = "bench_outbox_" + RUN
    env.broker.create_topic(topic, PARTITIONS)
    out = res["outbox"] = {"n": n, "cycles": cycles, "retention_s": retention, "runs": []}
    set_conf(cur, "eventbox.outbox_retention", "%ds" % retention)
    try:
        pid = relay_pid(cur)
        first = 1
        for k in range(1, cycles + 1):
            # Every row up to here belongs to earlier cycles.
            before = q1(cur, "SELECT coalesce(max(id), 0) FROM eventbox._outbox_rows")
            base = relay_info(cur)[2]
            w0, r0 = lsn(cur), proc_cpu(pid)
            t0 = time.monotonic()
            send_s = send_cycle(env, topic, first, n)
            first += n
            wait_until(cur, "cycle %d acknowledged" % k,
                       lambda: relay_info(cur)[2] - base >= n, max(600, n / 200))
            relay_s = time.monotonic() - t0
            wait_until(cur, "the rows before cycle %d truncated" % k,
                       lambda: not q1(cur, "SELECT EXISTS (SELECT 1 FROM eventbox._outbox_rows "
                                           "WHERE id <= %s)", (before,)),
                       max(600, retention * 4 + n / 1000))
            if relay_pid(cur) != pid:
                raise BenchError("outbox: the relay process changed during cycle %d" % k)
            wal = lsn(cur) - w0
            relay_cpu = (proc_cpu(pid) - r0) / TICKS
            cur.execute("SELECT pg_stat_force_next_flush()")
            size = outbox_sizes(cur)
            dead, autovacuums = outbox_stat(cur, "n_dead_tup"), outbox_stat(cur, "autovacuum_count")
            run_ = {"send_s": send_s, "relay_s": relay_s, "cycle_s": time.monotonic() - t0,
                    "wal_b": wal / n, "relay_cpu_s": relay_cpu, "size": size, "dead": dead,
                    "autovacuums": autovacuums,
                    "rows": q1(cur, "SELECT count(*) FROM eventbox._outbox_rows")}
            out["runs"].append(run_)
            log("outbox: cycle %d: %.1f s (send %.1f s); %.1f MiB (heap %.1f), %d rows kept, "
                "n_dead_tup %d, %.0f B WAL/msg" % (k, run_["cycle_s"], send_s,
                                                   mib(size["total"]), mib(size["heap"]),
                                                   run_["rows"], dead, run_["wal_b"]))
    finally:
        set_conf(cur, "eventbox.outbox_retention", None)


def table_rows(res):
    o = res.get("outbox")
    if not o or not o["runs"]:
        return []
    first, last = o["runs"][0], o["runs"][-1]
    # The largest after any cycle: with rotated tables the size after a cycle depends on where
    # the rotations fell (a cycle whose rows were truncated with the earlier cycles' reads
    # almost 0), so the last cycle alone could hide a growth.
    k, top = max(enumerate(o["runs"], 1), key=lambda kr: kr[1]["size"]["total"])
    r = top["size"]["total"] / first["size"]["total"]
    return [
        ROW % ("outbox largest after a cycle (MiB)",
               "%.1f (cycle %d)" % (mib(top["size"]["total"]), k),
               "cycle 1 %.1f" % mib(first["size"]["total"]),
               "%.2f" % r, "<= %.1f %s" % (TARGET, ok(r <= TARGET, bad="ABOVE"))),
        ROW % ("  outbox heap+idx after cycle %d (MiB)" % len(o["runs"]),
               "%.1f" % mib(last["size"]["total"]), "cycle 1 %.1f" % mib(first["size"]["total"]),
               "%.2f" % (last["size"]["total"] / first["size"]["total"]), "info"),
        ROW % ("  outbox n_dead_tup after cycle %d" % len(o["runs"]), "%d" % last["dead"],
               "cycle 1 %d" % first["dead"], "-", "info"),
        ROW % ("  WAL per outbox message (B)", "%.0f" % last["wal_b"],
               "cycle 1 %.0f" % first["wal_b"], "-", "info"),
    ]


def notes(res, args):
    o = res.get("outbox")
    if not o:
        return []
    out = ["outbox: %d cycles of %d send() calls (~200 B JSON, 1000 keys, %d per transaction) "
           "relayed to %d partitions with eventbox.outbox_retention = %d s; a cycle ends when "
           "its rows are acknowledged and the earlier cycles' rows truncated; autovacuum at its "
           "defaults, no VACUUM" % (o["cycles"], o["n"], PER_TRANSACTION, PARTITIONS,
                                    o["retention_s"])]
    for k, r in enumerate(o["runs"], 1):
        s = r["size"]
        out.append("outbox cycle %d: %.1f s (send() %.2f us/msg wall, relay CPU %.2f us/msg); "
                   "heap %.1f + indexes %.1f MiB (table with fsm/vm/toast %.1f), %d rows kept, "
                   "n_dead_tup %d, autovacuums so far %d; WAL %.0f B/msg"
                   % (k, r["cycle_s"], r["send_s"] / o["n"] * 1e6,
                      r["relay_cpu_s"] / o["n"] * 1e6, mib(s["heap"]), mib(s["indexes"]),
                      mib(s["table"]), r["rows"], r["dead"], r["autovacuums"], r["wal_b"]))
    return out
