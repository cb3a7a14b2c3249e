"""Section ops, parts purge and cycles: ingest and handlers while the retention purge runs, and
the inbox's size over cycles of ingest, process, age, purge and autovacuum (see ops.py)."""

import os
import re
import time

from lib.cluster import q1
from lib.common import BenchError, log
from lib.eventbox import create_disabled_subscription, set_conf, set_enabled, worker_pids
from lib.kafka import produce
from lib.messages import Messages
from lib.proc import CpuMeter
from lib.table import ROW, mib, ok

from sections.ops_common import RUN, partitions_for, postgres_us, supervisor_pids

HANDLER = "public.bench_on_msg(eventbox.inbox)"
AGED_SUB = "ops_aged"
HANDLED = "SELECT coalesce(sum(messages), 0)::int8 FROM eventbox.workers WHERE role = 'handler'"


def stat(cur, column):
    """A column of pg_stat_user_tables for eventbox.inbox, as the statistics system has it now."""
    cur.execute("SELECT pg_stat_clear_snapshot()")
    return q1(cur, "SELECT %s FROM pg_stat_user_tables WHERE relid = 'eventbox.inbox'::regclass"
              % column)


def deleted_mark(cur):
    """n_tup_del of eventbox.inbox after this session's own counts were flushed. During a run
    nothing but the retention purge deletes inbox rows, so its progress is the growth of
    n_tup_del (the supervisor flushes it at most once a second). Polling the purge counter of
    eventbox.metrics instead would run the gauge queries (a count of every pending row) each
    time, in the middle of the figure."""
    cur.execute("SELECT pg_stat_force_next_flush()")
    cur.execute("SELECT 1")
    return stat(cur, "n_tup_del")


def lock_wait_lines(path, start, pids):
    """The server log's lock-wait reports (log_lock_waits: "process N still waiting for ...")
    written after byte `start`, as (lines of the processes `pids`, lines of any other)."""
    with open(path, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    mine, other = [], []
    for line in text.splitlines():
        m = re.search(r"process (\d+) still waiting for", line)
        if m:
            (mine if int(m.group(1)) in pids else other).append(line)
    return mine, other


def handled_run(env, cur, topic, sub, n, pg_groups, watch=None, before_clock=None):
    """Kafka -> inbox -> trivial INSERT handler: a disabled subscription with the handler on the
    pre-produced topic; clock from enabling it until the handler workers' counter grew by n.
    before_clock() is called just before the clock starts, watch(elapsed) about every 0.5 s
    while it runs. The result has the ingest and handler workers' lock waits logged while the
    clock ran ("lock_waits") and the other processes' ("other_waits")."""
    logfile = os.path.join(env.dir, "postgres.log")
    cur.execute("TRUNCATE public.bench_sink")
    create_disabled_subscription(cur, sub, topic, handler=HANDLER)
    cur.execute("CHECKPOINT")
    time.sleep(0.3)
    if before_clock:
        before_clock()
    pids = set(worker_pids(cur, "ingest", "handler"))
    mark = os.path.getsize(logfile)
    base = int(q1(cur, HANDLED))
    meter = CpuMeter(pg_groups)
    meter.start()
    t0 = time.monotonic()
    set_enabled(cur, sub, True)
    deadline = t0 + max(300, n / 100)
    next_watch = t0
    while True:
        time.sleep(0.02)
        now = time.monotonic()
        if int(q1(cur, HANDLED)) - base >= n:
            break
        if watch and now >= next_watch:
            watch(now - t0)
            next_watch = now + 0.5
        if now > deadline:
            raise BenchError("%s: %d of %d handled after %.0fs"
                             % (sub, int(q1(cur, HANDLED)) - base, n, now - t0))
    elapsed = time.monotonic() - t0
    cpu = meter.stop()
    waits, other = lock_wait_lines(logfile, mark, pids | set(worker_pids(cur, "ingest", "handler")))
    set_enabled(cur, sub, False)
    cur.execute("SELECT status, count(*) FROM eventbox.inbox WHERE subscription = %s "
                "GROUP BY status", (sub,))
    statuses = dict(cur.fetchall())
    sunk = q1(cur, "SELECT count(*) FROM public.bench_sink")
    if statuses != {"processed": n} or sunk != n:
        raise BenchError("%s: statuses %r, bench_sink %d rows, expected %d processed"
                         % (sub, statuses, sunk, n))
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "cpu": cpu, "lock_waits": waits,
            "other_waits": other, "log_mark": mark, "pids": pids}


def insert_aged(cur, rows):
    """`rows` processed inbox rows of the disabled subscription AGED_SUB, processed 30 days ago
    (1 ms apart), shaped like the messages (~200 B payload, headers, key), inserted directly."""
    t0 = time.monotonic()
    cur.execute(
        "INSERT INTO eventbox.inbox (subscription, message_id, topic, \"partition\", \"offset\", "
        "key, headers, payload, event_type, status, attempts, received_at, processed_at) "
        "SELECT %s, format('aged-%%s', g), 'ops_aged_none', g %% 32, g / 32, "
        "convert_to('customer-' || (g %% 1000)::text, 'UTF8'), "
        "jsonb_build_object('event_type', 'OrderCreated', 'message_id', format('aged-%%s', g)), "
        "jsonb_build_object('id', g, 'pad', repeat('x', 110), 'sku', 'SKU-00001', "
        "'type', 'OrderCreated', 'amount', g, 'currency', 'EUR', "
        "'customer', 'customer-' || (g %% 1000)::text), 'OrderCreated', 'processed', 1, "
        "now() - interval '30 days', now() - interval '30 days' + g * interval '1 ms' "
        "FROM generate_series(1, %s) g", (AGED_SUB, rows))
    took = time.monotonic() - t0
    cur.execute("VACUUM eventbox.inbox")
    cur.execute("CHECKPOINT")
    return took


def purge_run(env, cur, topic, sub, n, rows, groups):
    """One ingest + handlers run while the `rows` aged rows present are purged (retention set to
    1 day: they are 30 days old); the clock starts once the supervisor's first batch is counted.
    Afterwards waits until the purge is through."""
    seen = {}

    def start_purge():
        seen["mark"] = deleted_mark(cur)
        set_conf(cur, "eventbox.inbox_retention", "1d")
        deadline = time.monotonic() + 30
        while stat(cur, "n_tup_del") == seen["mark"]:
            if time.monotonic() > deadline:
                raise BenchError("the retention purge did not start within 30 s")
            time.sleep(0.02)
        seen["at_start"] = stat(cur, "n_tup_del") - seen["mark"]

    def watch(elapsed):
        if "done_s" not in seen and stat(cur, "n_tup_del") - seen["mark"] >= rows:
            seen["done_s"] = elapsed

    x = handled_run(env, cur, topic, sub, n, groups, watch=watch, before_clock=start_purge)
    at_end = stat(cur, "n_tup_del") - seen["mark"]
    x["purged_before"], x["purged_in_run"] = seen["at_start"], at_end - seen["at_start"]
    x["purge_done_s"] = seen.get("done_s")
    t0 = time.monotonic()
    while stat(cur, "n_tup_del") - seen["mark"] < rows:
        if time.monotonic() - t0 > 600:
            raise BenchError("the purge of %d aged rows did not finish" % rows)
        time.sleep(0.2)
    x["purge_total_s"] = x["purge_done_s"] or x["elapsed"] + (time.monotonic() - t0)
    x["lock_waits_after"] = lock_wait_lines(os.path.join(env.dir, "postgres.log"),
                                            x["log_mark"], x["pids"])[0]
    set_conf(cur, "eventbox.inbox_retention", "0")
    left = q1(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s", (AGED_SUB,))
    if left != 0:
        raise BenchError("%d aged rows left after the purge" % left)
    return x


def section_purge(env, cur, args, pg_groups, out):
    n, rows = args.ops_purge_messages, args.ops_purge_rows
    parts = partitions_for(n)
    topic = "ops_purge_" + RUN
    out["purge"] = p = {"n": n, "rows": rows, "partitions": parts, "runs": []}

    groups = dict(pg_groups, supervisor=lambda: supervisor_pids(cur))
    set_conf(cur, "eventbox.inbox_retention", "0")
    log("ops: producing %d messages to %s (%d partitions)" % (n, topic, parts))
    msgs = Messages(n, 200, seed=0x9e)
    produce(env, topic, parts, msgs.records(parts))
    del msgs
    create_disabled_subscription(cur, AGED_SUB, "ops_aged_none_" + RUN)
    k = 0
    for pair in range(args.ops_purge_repeat):
        # Pairs alternate which run goes first. Every run starts from the same table: the aged
        # rows present (inserted again after a purge), the previous run's rows dropped and
        # VACUUMed away.
        for purge in ((False, True) if pair % 2 == 0 else (True, False)):
            k += 1
            if not q1(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s",
                      (AGED_SUB,)):
                log("ops: inserting %d aged processed rows" % rows)
                p["insert_s"] = insert_aged(cur, rows)
                p["inbox_mib"] = mib(q1(cur, "SELECT pg_total_relation_size('eventbox.inbox')"))
            sub = "ops_h_%d" % k
            if purge:
                log("ops: ingest + handlers, %d messages, while %d aged rows are purged"
                    % (n, rows))
                x = purge_run(env, cur, topic, sub, n, rows, groups)
                log("ops:   %.0f msg/s in %.1fs; purged %d rows before the clock, %d during the "
                    "run%s; lock waits logged: %d" % (
                        x["rate"], x["elapsed"], x["purged_before"], x["purged_in_run"],
                        ", purge finished at %.1fs" % x["purge_done_s"]
                        if x["purge_done_s"] is not None else "", len(x["lock_waits"])))
            else:
                log("ops: ingest + handlers, %d messages, no purge" % n)
                x = handled_run(env, cur, topic, sub, n, groups)
                log("ops:   %.0f msg/s in %.1fs" % (x["rate"], x["elapsed"]))
            x["purge"] = purge
            p["runs"].append(x)
            cur.execute("SELECT eventbox.drop_subscription(%s)", (sub,))
            cur.execute("VACUUM eventbox.inbox")
            cur.execute("CHECKPOINT")
    cur.execute("SELECT eventbox.drop_subscription(%s)", (AGED_SUB,))


def sizes(cur):
    cur.execute("SELECT pg_relation_size('eventbox.inbox'), pg_table_size('eventbox.inbox'), "
                "pg_indexes_size('eventbox.inbox')")
    heap, table, indexes = cur.fetchone()
    cur.execute("SELECT c.relname, pg_relation_size(c.oid) FROM pg_index i "
                "JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE i.indrelid = 'eventbox.inbox'::regclass ORDER BY c.relname")
    return {"heap": heap, "table": table, "indexes": indexes, "total": table + indexes,
            "each": dict(cur.fetchall())}


def section_cycles(env, cur, args, pg_groups, out):
    n, cycles = args.ops_cycle_rows, args.ops_cycles
    parts = partitions_for(n)
    out["cycles"] = c = {"n": n, "cycles": cycles, "partitions": parts, "runs": []}
    # A fresh inbox: what the earlier figures left must not pad the first cycle's size.
    cur.execute("TRUNCATE eventbox.inbox")
    # Retention on but longer than a cycle (the supervisor keeps its purge rounds, and flushes
    # its statistics, once a second); set to 1 s to age a cycle's rows past it.
    set_conf(cur, "eventbox.inbox_retention", "1d")
    # Autovacuum is what gives the purged space back; look for work every second, not minute
    # (BENCH_OPS_NAPTIME=0 keeps the server's setting).
    c["naptime"] = args.ops_naptime
    if args.ops_naptime:
        set_conf(cur, "autovacuum_naptime", "%ds" % args.ops_naptime)
    log("ops: producing %d messages to ops_cycle_%s (%d partitions)" % (n, RUN, parts))
    msgs = Messages(n, 200, seed=0xc1)
    produce(env, "ops_cycle_" + RUN, parts, msgs.records(parts))
    del msgs
    try:
        for k in range(1, cycles + 1):
            sub = "ops_cycle_%d" % k
            run = handled_run(env, cur, "ops_cycle_" + RUN, sub, n, pg_groups)
            peak = sizes(cur)
            # Age past retention: retention 1 s, once the newest row is older than that.
            time.sleep(1.2)
            deleted0 = deleted_mark(cur)
            av0 = stat(cur, "autovacuum_count")
            t0 = time.monotonic()
            set_conf(cur, "eventbox.inbox_retention", "1s")
            while stat(cur, "n_tup_del") - deleted0 < n:
                if time.monotonic() - t0 > 600:
                    raise BenchError("cycle %d: the purge's deletes did not reach the "
                                     "statistics within 600 s" % k)
                time.sleep(0.1)
            purge_s = time.monotonic() - t0
            set_conf(cur, "eventbox.inbox_retention", "1d")
            left = q1(cur, "SELECT count(*) FROM eventbox.inbox")
            if left != 0:
                raise BenchError("cycle %d: %d rows left after the purge" % (k, left))
            # An autovacuum pass since the purge began that left fewer dead rows than trigger
            # the next one (autovacuum_vacuum_threshold, 50, on the emptied table): with every
            # delete in the statistics by now, that is the last one a user gets. (Requiring 0
            # waited forever when a pass ran while the purge's last deletes were in flight and
            # left those few as recently dead: n_dead_tup 18 in one run.)
            t0 = time.monotonic()
            while True:
                count, dead = stat(cur, "autovacuum_count"), stat(cur, "n_dead_tup")
                if count > av0 and dead < 50:
                    break
                if time.monotonic() - t0 > 300:
                    raise BenchError("cycle %d: no autovacuum of eventbox.inbox within 300 s "
                                     "(n_dead_tup %d)" % (k, dead))
                time.sleep(0.5)
            vacuum_s = time.monotonic() - t0
            after = sizes(cur)
            cur.execute("SELECT eventbox.drop_subscription(%s)", (sub,))
            c["runs"].append({"rate": run["rate"], "peak": peak, "after": after,
                              "purge_s": purge_s, "vacuum_s": vacuum_s})
            log("ops: cycle %d: %.0f msg/s; inbox heap+indexes %.1f MiB processed, %.1f MiB after "
                "purge (%.1fs) and autovacuum (%.1fs)"
                % (k, run["rate"], mib(peak["total"]), mib(after["total"]), purge_s,
                   vacuum_s))
    finally:
        set_conf(cur, "autovacuum_naptime", None)
        set_conf(cur, "eventbox.inbox_retention", None)


def purge_rows(p):
    rows = []
    base = max(x["rate"] for x in p["runs"] if not x["purge"])
    purging = max(x["rate"] for x in p["runs"] if x["purge"])
    r = purging / base
    rows.append(ROW % ("ingest+handlers, purging (msg/s)", "%.0f" % purging,
                       "no purge %.0f" % base, "%.3f" % r, ">= 0.9 " + ok(r >= 0.9)))
    cb = postgres_us([x for x in p["runs"] if not x["purge"]])
    cw = postgres_us([x for x in p["runs"] if x["purge"]])
    rows.append(ROW % ("  postgres CPU/msg, all runs (us)", "%.2f" % cw, "no purge %.2f" % cb,
                       "%.3f" % (cw / cb), "info (incl. the purge)"))
    waits = sum(len(x["lock_waits"]) for x in p["runs"] if x["purge"])
    rows.append(ROW % ("  ingest/handler lock waits > 100 ms", "%d" % waits,
                       "no purge %d" % sum(len(x["lock_waits"]) for x in p["runs"]
                                           if not x["purge"]), "-",
                       "0 " + ok(waits == 0, bad="ABOVE")))
    rows.append(ROW % ("  aged rows purged during the runs", "/".join(
        "%d" % x["purged_in_run"] for x in p["runs"] if x["purge"]), "of %d" % p["rows"], "-",
        "info"))
    return rows


def cycles_rows(c):
    """The inbox's largest size over the cycles, each measured processed, before its purge (what
    the disk must hold), against the first cycle's; then what stays after a purge: the indexes
    (B-tree files do not shrink) and the heap (emptied; its tail cut by autovacuum only when it
    gets the table's lock)."""
    rows = []
    first, last = c["runs"][0], c["runs"][-1]
    k, largest = max(enumerate(c["runs"], 1), key=lambda x: x[1]["peak"]["total"])
    r = largest["peak"]["total"] / first["peak"]["total"]
    rows.append(ROW % ("inbox largest of %d cycles (MiB)" % len(c["runs"]),
                       "%.1f (cycle %d)" % (mib(largest["peak"]["total"]), k),
                       "cycle 1 %.1f" % mib(first["peak"]["total"]), "%.2f" % r,
                       "<= 1.2 " + ok(r <= 1.2, bad="ABOVE")))
    r = last["after"]["indexes"] / first["after"]["indexes"]
    rows.append(ROW % ("  indexes after cycle %d's purge" % len(c["runs"]),
                       "%.1f" % mib(last["after"]["indexes"]),
                       "cycle 1 %.1f" % mib(first["after"]["indexes"]), "%.2f" % r, "info"))
    rows.append(ROW % ("  heap after each purge (MiB)",
                       "/".join("%.0f" % mib(x["after"]["heap"]) for x in c["runs"]),
                       "-", "-", "info (tail not cut)"))
    return rows


def purge_notes(p):
    out = []
    out.append("ops purge: %d messages produced beforehand (%d partitions), trivial INSERT "
               "handler (bench_on_msg, run_as bench_handler); clock from enabling the "
               "subscription to the handler workers' counter grown by N (ingest and handlers "
               "running together). %d aged rows inserted directly as 'processed' with "
               "processed_at 30 days ago (INSERT ... SELECT, %.1f s; inbox %.0f MiB then), "
               "VACUUMed. Without: eventbox.inbox_retention = 0. With: retention set to 1d and "
               "the clock started once the purge's first deletes reached the statistics "
               "(n_tup_del: flushed by the supervisor at most once a second; the purge's "
               "progress is read there, not from eventbox.metrics, whose gauge queries would "
               "count every pending row on each poll). %d pairs, "
               "alternating which goes first; after each run its rows dropped and VACUUMed, "
               "the aged rows inserted again after a purge; best run per side kept"
               % (p["n"], p["partitions"], p["rows"], p["insert_s"], p["inbox_mib"],
                  len(p["runs"]) // 2))
    for x in p["runs"]:
        line = "ops purge run %s: %.0f msg/s, %.1f s, box %.0f%% busy, postgres CPU %.1f s" % (
            "with" if x["purge"] else "without", x["rate"], x["elapsed"],
            100.0 * x["cpu"]["box_s"] / max(x["cpu"]["box_total_s"], 1e-9),
            x["cpu"]["postgres_s"])
        if x["purge"]:
            line += ("; purged %d rows before the clock, %d during the run (%s); whole purge "
                     "%.1f s; supervisor CPU in the run %.1f s"
                     % (x["purged_before"], x["purged_in_run"],
                        "finished %.1f s into it" % x["purge_done_s"]
                        if x["purge_done_s"] is not None else "still running at its end",
                        x["purge_total_s"], x["cpu"].get("supervisor_s", 0)))
        line += "; lock waits > 100 ms logged: ingest/handler workers %d%s, others %d%s" % (
            len(x["lock_waits"]),
            (" (" + x["lock_waits"][0][:300] + ")") if x["lock_waits"] else "",
            len(x["other_waits"]), (" (" + x["other_waits"][0][:300] + ")")
            if x["other_waits"] else "")
        if x["purge"] and len(x["lock_waits_after"]) > len(x["lock_waits"]):
            line += " (%d more until the purge ended)" % (len(x["lock_waits_after"]) -
                                                          len(x["lock_waits"]))
        out.append(line)
    return out


def cycles_notes(c):
    out = []
    naptime = c.get("naptime", 1)
    out.append("ops cycles: %d cycles of %d messages (one topic of %d partitions, a new "
               "subscription with the handler per cycle, dropped once empty), inbox TRUNCATEd "
               "first; aged by setting eventbox.inbox_retention = 1s once processed, back to 1d "
               "(nothing that old) when purged; autovacuum_naptime = %s during the cycles; "
               "sizes measured once a cycle's rows are processed (before its purge) and after "
               "the first autovacuum past the purge that leaves n_dead_tup < 50"
               % (c["cycles"], c["n"], c["partitions"],
                  "%ds" % naptime if naptime else "the server's"))
    for k, r in enumerate(c["runs"], 1):
        out.append("ops cycle %d: %.0f msg/s; processed: heap %.1f + indexes %.1f MiB (table "
                   "with fsm/vm/toast %.1f); after purge (%.1f s) + autovacuum (%.1f s): heap "
                   "%.1f + indexes %.1f MiB (table %.1f)"
                   % (k, r["rate"], mib(r["peak"]["heap"]), mib(r["peak"]["indexes"]),
                      mib(r["peak"]["table"]), r["purge_s"], r["vacuum_s"],
                      mib(r["after"]["heap"]), mib(r["after"]["indexes"]),
                      mib(r["after"]["table"])))
        if "each" in r["peak"]:
            out.append("  indexes processed / after (MiB): " + ", ".join(
                "%s %.1f / %.1f" % (name, mib(size), mib(r["after"]["each"].get(name, 0)))
                for name, size in sorted(r["peak"]["each"].items())))
    return out
