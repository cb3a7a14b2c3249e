"""Section ingest_raw: what keeping the producer's bytes costs (issue 28). The same N messages
(~200 B and 1 KiB JSON) ingested by a subscription with keep_raw => true (every value's bytes
in raw_payload besides its jsonb; what a dead-letter topic implies) and by one without, runs
interleaved into an emptied inbox, clock from enabling the subscription to its stored offsets
reaching N. Figures: the rate ratio, and the inbox's bytes per row (heap with its TOAST table,
and the indexes) with and without. Reported, no target."""

import time

from lib.cluster import q1
from lib.common import BenchError, log
from lib.eventbox import (create_disabled_subscription, ingest_counters, set_enabled,
                          wait_offsets)
from lib.kafka import produce
from lib.messages import PARTITIONS, SIZES, Messages
from lib.table import ROW, best


def storage(cur):
    """(bytes of eventbox.inbox's heap + TOAST, bytes of its indexes)."""
    cur.execute("CHECKPOINT")
    cur.execute("SELECT pg_table_size('eventbox.inbox'), pg_indexes_size('eventbox.inbox')")
    return cur.fetchone()


def run_one(cur, msgs, sub, topic, keep_raw):
    cur.execute("TRUNCATE eventbox.inbox")
    create_disabled_subscription(cur, sub, topic)
    cur.execute("SELECT eventbox.alter_subscription(%s, keep_raw => %s)", (sub, keep_raw))
    cur.execute("CHECKPOINT")
    time.sleep(0.3)
    base = ingest_counters(cur)
    t0 = time.monotonic()
    set_enabled(cur, sub, True)
    elapsed, _, _ = wait_offsets(cur, sub, msgs.n, t0, base[0], timeout=max(120, msgs.n / 200))
    set_enabled(cur, sub, False)
    cur.execute("SELECT count(*), count(raw_payload) FROM eventbox.inbox WHERE subscription = %s",
                (sub,))
    rows, raws = cur.fetchone()
    if rows != msgs.n or raws != (msgs.n if keep_raw else 0):
        raise BenchError("ingest_raw %s: %d rows, %d with raw_payload (expected %d, %d)"
                         % (sub, rows, raws, msgs.n, msgs.n if keep_raw else 0))
    heap, index = storage(cur)
    raw_avg = q1(cur, "SELECT coalesce(avg(length(raw_payload)), 0)::float8 "
                      "FROM eventbox.inbox WHERE subscription = %s", (sub,))
    cur.execute("SELECT eventbox.drop_subscription(%s)", (sub,))
    return {"n": msgs.n, "elapsed": elapsed, "rate": msgs.n / elapsed,
            "heap_per_row": heap / msgs.n, "index_per_row": index / msgs.n, "raw_avg": raw_avg}


def run(ctx):
    env, cur, args, res = ctx.env, ctx.cur, ctx.args, ctx.res
    n = args.ingest_messages
    out = res["ingest_raw"] = {"n": n, "sizes": {}}
    for size in SIZES:
        msgs = Messages(n, SIZES[size], seed=0x2800)
        topic = "bench_raw_" + size.lower()
        produce_s = produce(env, topic, PARTITIONS, msgs.records(), flush_s=60)
        log("ingest_raw %s: %d messages produced in %.1fs" % (size, n, produce_s))
        per = out["sizes"][size] = {"plain": [], "kept": [], "avg_payload": msgs.avg_payload}
        for rep in range(args.repeat):
            for kept in (False, True):
                sub = "bench_raw_%s_%s_%d" % (size.lower(), "kept" if kept else "plain", rep)
                x = run_one(cur, msgs, sub, topic, kept)
                per["kept" if kept else "plain"].append(x)
                log("  keep_raw %s: %.0f msg/s in %.2fs; heap+TOAST %.0f B/row, indexes %.0f "
                    "B/row" % (kept, x["rate"], x["elapsed"], x["heap_per_row"],
                               x["index_per_row"]))
        cur.execute("TRUNCATE eventbox.inbox")


def table_rows(res):
    raw = res.get("ingest_raw")
    if not raw:
        return []
    rows = []
    for size, per in raw["sizes"].items():
        k, p = best(per["kept"]), best(per["plain"])
        rows.append(ROW % ("ingest, raw_payload kept %s (msg/s)" % size, "%.0f" % k["rate"],
                           "not kept %.0f" % p["rate"], "%.2f" % (k["rate"] / p["rate"]),
                           "reported"))
        kb = per["kept"][-1]["heap_per_row"] + per["kept"][-1]["index_per_row"]
        pb = per["plain"][-1]["heap_per_row"] + per["plain"][-1]["index_per_row"]
        rows.append(ROW % ("  inbox bytes/row, kept %s" % size, "%.0f" % kb,
                           "not kept %.0f" % pb, "%.2f" % (kb / pb), "reported"))
    return rows


def notes(res, args):
    raw = res.get("ingest_raw")
    if not raw:
        return []
    out = ["ingest_raw: %d messages per run (%s JSON payloads) on %d partitions; "
           "subscriptions created disabled, keep_raw set, clock from enabling to the stored "
           "offsets adding up to N; runs without and with keep_raw interleaved, %d each, best "
           "rate kept; bytes per row: pg_table_size (heap + TOAST) + pg_indexes_size of "
           "eventbox.inbox after a CHECKPOINT, the last run of each side"
           % (raw["n"], "/".join("%.0f B" % p["avg_payload"] for p in raw["sizes"].values()),
              PARTITIONS, args.repeat)]
    for size, per in raw["sizes"].items():
        out.append("%s runs (msg/s): not kept %s; kept %s; heap+TOAST B/row %s vs %s; "
                   "raw_payload avg %.0f B"
                   % (size, " ".join("%.0f" % x["rate"] for x in per["plain"]),
                      " ".join("%.0f" % x["rate"] for x in per["kept"]),
                      "/".join("%.0f" % x["heap_per_row"] for x in per["plain"]),
                      "/".join("%.0f" % x["heap_per_row"] for x in per["kept"]),
                      per["kept"][-1]["raw_avg"]))
    return out
