"""Section ops: running pg_eventbox for months. Every figure is a ratio against a baseline
measured in the same invocation; nothing is asserted on time.

  metrics  relay and ingest throughput with GET /metrics scraped every second vs not scraped,
           interleaved runs, best of BENCH_OPS_REPEAT each (target >= 0.98x);
  purge    ingest + handlers at full rate (BENCH_OPS_PURGE_MESSAGES produced beforehand) while
           BENCH_OPS_PURGE_ROWS aged processed rows are purged, vs the same run without a purge
           (target >= 0.9x); lock waits over 100 ms logged meanwhile (log_lock_waits,
           deadlock_timeout = 100ms; target 0 lines);
  cycles   BENCH_OPS_CYCLES cycles of ingest BENCH_OPS_CYCLE_ROWS -> process -> age past
           retention -> purge -> autovacuum; the inbox's largest heap + index size over the
           cycles (measured processed, before each purge) vs the first cycle's (target <= 1.2x).

The dev broker keeps at most ~5 MiB or 100k message sets per partition and drops the oldest
beyond that (an earlier version of this bench produced 100000 records of ~300 B on the wire
through the relay into an auto-created topic of 4 partitions: the broker dropped the first ~10k
of two partitions and the ingest never reached 100000). Topics here are created with enough
partitions for their size, and every produce is checked: low watermarks 0, high watermarks
adding up to the count."""


import time

from lib.cluster import q1
from lib.common import BenchError
from lib.eventbox import setup_handler_objects
from sections.ops_metrics import metrics_notes, metrics_rows, section_metrics
from sections.ops_retention import (cycles_notes, cycles_rows, purge_notes, purge_rows,
                                    section_cycles, section_purge)
from lib.messages import DISTINCT_KEYS


def run(ctx):
    env, cur, args, pg_groups, res = ctx.env, ctx.cur, ctx.args, ctx.pg_groups, ctx.res
    address = q1(cur, "SHOW eventbox.metrics_address")
    if not address:
        raise BenchError("section ops needs eventbox.metrics_address (bench/run.sh sets it)")
    for name, want in (("log_lock_waits", "on"), ("deadlock_timeout", "100ms")):
        if q1(cur, "SHOW %s" % name) != want:
            raise BenchError("section ops needs %s = %s (bench/run.sh sets it)" % (name, want))
    setup_handler_objects(cur)
    cur.execute("TRUNCATE eventbox.inbox")
    out = res["ops"] = {"address": address,
                        "handler_workers": int(q1(cur, "SHOW eventbox.handler_workers"))}
    part = args.ops_part
    for name, fn in (("metrics", section_metrics), ("purge", section_purge),
                     ("cycles", section_cycles)):
        if part == "all" or part.split("_")[0] == name:
            t0 = time.monotonic()
            fn(env, cur, args, pg_groups, out)
            out[name + "_s"] = time.monotonic() - t0


def table_rows(res):
    o = res.get("ops")
    if not o:
        return []
    rows = []
    if "metrics" in o:
        rows.extend(metrics_rows(o["metrics"]))
    if "purge" in o:
        rows.extend(purge_rows(o["purge"]))
    if "cycles" in o:
        rows.extend(cycles_rows(o["cycles"]))
    return rows


def notes(res, args):
    o = res.get("ops")
    if not o:
        return []
    parts = [k for k in ("metrics", "purge", "cycles") if k in o]
    out = ["ops: %.0f s in all (%s); payloads ~%.0f B JSON, %d keys; "
           "eventbox.handler_workers = %d"
           % (sum(o[k + "_s"] for k in parts),
              ", ".join("%s %.0f s" % (k, o[k + "_s"]) for k in parts),
              o.get("metrics", {}).get("avg_payload", 200), DISTINCT_KEYS,
              o["handler_workers"])]
    if "metrics" in o:
        out.extend(metrics_notes(o, o["metrics"]))
    if "purge" in o:
        out.extend(purge_notes(o["purge"]))
    if "cycles" in o:
        out.extend(cycles_notes(o["cycles"]))
    return out
