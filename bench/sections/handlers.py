"""Section handlers: a trivial INSERT handler over N pre-loaded inbox rows, clock from enabling
the subscription to no row left to handle; baseline: the same INSERTs as one multi-row
statement (and, stricter, as one INSERT ... SELECT from the inbox). Then the same INSERT as a
batch handler (one INSERT ... SELECT per chunk) over the same rows, against the same baseline."""

import json
import time

from lib.cluster import q1
from lib.common import BenchError, log
from lib.eventbox import (HANDLER_ROLE, create_disabled_subscription, set_enabled,
                          setup_handler_objects, worker_pids)
from lib.messages import EVENT_TYPE, PARTITIONS, SIZES, Messages, copy_buffer, copy_rows
from lib.proc import CpuMeter
from lib.table import ROW, best, per_msg_faults, per_msg_us


def multi_row_insert(msgs):
    """The handler's INSERTs as one multi-row statement: INSERT INTO bench_sink2 (id, v) VALUES
    (message id, payload id), ... for every message, as a client would send it."""
    return ("INSERT INTO public.bench_sink2 (id, v) VALUES "
            + ", ".join("('%s', %d)" % (mid, json.loads(payload)["id"])
                        for mid, _p, _o, _k, payload in msgs.items))


def load_backlog(env, cur, msgs, sub, batch=False):
    """msgs as inbox rows ('received', PARTITIONS lanes) of a new disabled subscription `sub` with
    the handler (with batch: the batch handler) registered, with their stored offsets."""
    cur.execute("TRUNCATE eventbox.inbox, public.bench_sink, public.bench_sink2")
    env.broker.create_topic(sub, PARTITIONS)
    if batch:
        create_disabled_subscription(cur, sub, sub, handler="public.bench_on_msgs(eventbox.inbox[])",
                                     batch=True)
    else:
        create_disabled_subscription(cur, sub, sub, handler="public.bench_on_msg(eventbox.inbox)")
    copy_rows(cur, copy_buffer(sub, sub, msgs))
    # The stored offsets the ingest worker writes with its rows: the handler workers take their
    # lanes from them (rows without are found by a slower plain walk: docs/design/handlers.md).
    cur.execute("INSERT INTO eventbox.offsets (subscription, topic, \"partition\", next_offset) "
                "SELECT subscription, topic, \"partition\", max(\"offset\") + 1 "
                "FROM eventbox.inbox WHERE subscription = %s GROUP BY 1, 2, 3", (sub,))
    # No VACUUM, no ANALYZE: the workers meet the backlog as a user's would (whatever
    # autovacuum managed meanwhile); their plans must not depend on statistics.
    cur.execute("CHECKPOINT")


def run_baselines(cur, msgs, sub):
    """The same INSERTs as one multi-row statement (the figure's baseline), then as one
    INSERT ... SELECT from the inbox (stricter: nothing to parse or send), then the handler
    function per row (info); their rates."""
    values_sql = multi_row_insert(msgs)
    t0 = time.monotonic()
    cur.execute(values_sql)
    values_elapsed = time.monotonic() - t0
    if cur.rowcount != msgs.n:
        raise BenchError("the multi-row INSERT inserted %d rows, expected %d"
                         % (cur.rowcount, msgs.n))
    cur.execute("TRUNCATE public.bench_sink2")
    cur.execute("CHECKPOINT")
    t0 = time.monotonic()
    cur.execute("INSERT INTO public.bench_sink2 (id, v) SELECT message_id, "
                "(payload->>'id')::bigint FROM eventbox.inbox WHERE subscription = %s", (sub,))
    select_elapsed = time.monotonic() - t0
    if cur.rowcount != msgs.n:
        raise BenchError("INSERT ... SELECT inserted %d rows, expected %d"
                         % (cur.rowcount, msgs.n))
    cur.execute("SELECT count(*) FROM public.bench_sink2 s JOIN eventbox.inbox i "
                "ON i.subscription = %s AND i.message_id = s.id "
                "AND (i.payload->>'id')::bigint = s.v", (sub,))
    if cur.fetchone()[0] != msgs.n:
        raise BenchError("INSERT ... SELECT rows differ from the messages")
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
        raise BenchError("handler function baselines did not insert %d rows" % msgs.n)
    cur.execute("TRUNCATE public.bench_sink")
    return {"values_rate": msgs.n / values_elapsed, "select_rate": msgs.n / select_elapsed,
            "fn_rate": msgs.n / fn_elapsed, "subxact_rate": msgs.n / subxact_elapsed}


def run_handlers(env, cur, msgs, sub, pg_groups, batch=False):
    """The backlog loaded, the baselines run on it, then the clock from enabling the
    subscription until no row is left to handle (with batch: by the batch handler)."""
    load_backlog(env, cur, msgs, sub, batch)
    res = run_baselines(cur, msgs, sub)
    cur.execute("CHECKPOINT")
    time.sleep(0.3)
    handler_pids = worker_pids(cur, "handler")
    # Polled: the handler workers' counter of handled messages (shared memory, moved after each
    # commit). A count(*) over the inbox while its rows are being updated took up to 50 ms a
    # call here, a quarter of a core taken from the workers being measured.
    counted = "SELECT coalesce(sum(messages), 0) FROM eventbox.workers WHERE role = 'handler'"
    base_count = int(q1(cur, counted))
    meter = CpuMeter(dict(pg_groups, handlers=lambda: handler_pids))
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
            raise BenchError("handlers: %d of %d rows still to handle after %.0fs"
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
        raise BenchError("handlers: statuses %r, bench_sink %d rows, expected %d processed; "
                         "an error: %r" % (statuses, sunk, msgs.n, err))
    cur.execute("SELECT extract(epoch FROM min(processed_at) - %s), "
                "extract(epoch FROM max(processed_at) - min(processed_at)), "
                "max(attempts), count(DISTINCT processed_at) "
                "FROM eventbox.inbox WHERE subscription = %s", (db_t0, sub))
    first, span, max_attempts, passes = cur.fetchone()
    res.update({"n": msgs.n, "elapsed": elapsed, "rate": msgs.n / elapsed, "cpu": cpu,
                "first_s": float(first), "span_s": float(span), "max_attempts": max_attempts,
                "passes": passes})
    return res


def run(ctx):
    env, cur, args, pg_groups, res = ctx.env, ctx.cur, ctx.args, ctx.pg_groups, ctx.res
    setup_handler_objects(cur)
    n = args.handler_messages
    out = res["handlers"] = {"n": n, "sizes": {}, "batch_sizes": {},
                             "workers": int(q1(cur, "SHOW eventbox.handler_workers")),
                             "timeout": q1(cur, "SHOW eventbox.handler_timeout")}
    for size in SIZES:
        msgs = Messages(n, SIZES[size], seed=0x2000)
        out["sizes"][size] = []
        out["batch_sizes"][size] = []
        for rep in range(args.repeat):
            for batch in (False, True):
                sub = "bench_h%s_%s_%d" % ("b" if batch else "", size.lower(), rep + 1)
                log("handlers %s: %d rows%s" % (sub, n, ", batch handler" if batch else ""))
                x = run_handlers(env, cur, msgs, sub, pg_groups, batch)
                out["batch_sizes" if batch else "sizes"][size].append(x)
                log("  handler %.0f msg/s in %.2fs (first after %.2fs); multi-row INSERT %.0f "
                    "rows/s, INSERT ... SELECT %.0f rows/s"
                    % (x["rate"], x["elapsed"], x["first_s"], x["values_rate"],
                       x["select_rate"]))
    cur.execute("TRUNCATE eventbox.inbox, public.bench_sink, public.bench_sink2")
    cur.execute("VACUUM eventbox.inbox")


def table_rows(res):
    hd = res.get("handlers")
    if not hd:
        return []
    rows = []
    for size, runs in hd["sizes"].items():
        h = best(runs)
        v = best(runs, "values_rate")["values_rate"]
        sel = best(runs, "select_rate")["select_rate"]
        r = h["rate"] / v
        rows.append(ROW % ("handler INSERT %s (msg/s)" % size, "%.0f" % h["rate"],
                           "multi-row INSERT %.0f" % v, "%.3f" % r,
                           ">= 0.5 " + ("ok" if r >= 0.5 else "BELOW")))
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
    for size, runs in hd.get("batch_sizes", {}).items():
        if not runs:
            continue
        h = best(runs)
        # The baseline: the best multi-row INSERT of the size, over both kinds of runs.
        v = best(runs + hd["sizes"][size], "values_rate")["values_rate"]
        r = h["rate"] / v
        rows.append(ROW % ("handler batch INSERT %s (msg/s)" % size, "%.0f" % h["rate"],
                           "multi-row INSERT %.0f" % v, "%.3f" % r,
                           ">= 1 " + ("ok" if r >= 1 else "BELOW")))
        rows.append(ROW % ("  cpu/msg batch handler workers %s (us)" % size,
                           "%.1f" % per_msg_us(runs, "handlers_s"), "-", "-", "info"))
        rows.append(ROW % ("  page faults/msg batch workers %s" % size,
                           "%.3f" % per_msg_faults(runs, "handlers_faults"), "-", "-", "info"))
    rows.append(ROW % ("cpu/msg box, handlers %s (us)" % "/".join(hd["sizes"]),
                       "/".join("%.1f" % per_msg_us(runs, "box_s")
                                for runs in hd["sizes"].values()),
                       "workers %s" % "/".join("%.1f" % per_msg_us(runs, "handlers_s")
                                               for runs in hd["sizes"].values()),
                       "-", "info"))
    rows.append(ROW % ("  page faults/msg handler workers",
                       "/".join("%.3f" % per_msg_faults(runs, "handlers_faults")
                                for runs in hd["sizes"].values()),
                       "-", "-", "info"))
    worst = max(per_msg_us(runs, "handlers_s") for runs in hd["sizes"].values())
    rows.append(ROW % ("cpu/msg handler workers (us)",
                       "/".join("%.1f" % per_msg_us(runs, "handlers_s")
                                for runs in hd["sizes"].values()),
                       "-", "-", "<= 10 " + ("ok" if worst <= 10 else "ABOVE")))
    return rows


def notes(res, args):
    hd = res.get("handlers")
    if not hd:
        return []
    out = []
    runs = [x for r in hd["sizes"].values() for x in r]
    out.append(
        "handlers: %d inbox rows ('received', %d lanes = partitions, event type %s) "
        "COPYed, with the offsets rows the ingest worker would write, for a disabled "
        "subscription with public.bench_on_msg (PL/pgSQL, one INSERT "
        "into bench_sink(id text PK, v bigint)) registered, run_as %s; eventbox.handler_"
        "workers = %d, passes of up to 1,024 messages run 64 per transaction (256 with a "
        "batch handler); clock from "
        "alter_subscription(enabled => true) until the handler workers' handled counter "
        "(eventbox.workers) grew by the row count, then every row checked 'processed'. "
        "Baseline (the figure's, bench/README, 'Targets': the same INSERTs as one multi-row "
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
    if any(hd.get("batch_sizes", {}).values()):
        out.append("handler batch: the same rows for another disabled subscription with "
                   "public.bench_on_msgs(eventbox.inbox[]) registered with batch => true (PL/"
                   "pgSQL, INSERT INTO bench_sink SELECT message_id, (payload->>'id')::bigint "
                   "FROM unnest(ms): one call per chunk of up to 256 messages of a lane (a run "
                   "transaction)), run "
                   "after the per-message run of each repetition, same clock and checks; "
                   "baseline: the best multi-row INSERT of that size in this run. Runs (msg/s): "
                   + "; ".join("%s %s" % (size, " ".join("%.0f" % x["rate"] for x in r))
                               for size, r in hd["batch_sizes"].items()))
    for size, r in hd["sizes"].items():
        out.append("%s runs (msg/s): handler %s; multi-row INSERT %s; INSERT ... SELECT "
                   "%s; fn/row %s; fn+subxact/row %s" % (
                       size, " ".join("%.0f" % x["rate"] for x in r),
                       " ".join("%.0f" % x["values_rate"] for x in r),
                       " ".join("%.0f" % x["select_rate"] for x in r),
                       " ".join("%.0f" % x["fn_rate"] for x in r),
                       " ".join("%.0f" % x["subxact_rate"] for x in r)))
    return out
