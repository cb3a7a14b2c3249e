"""Section ingest_dup: what producer duplicates cost the ingest worker (issue 31). The same N
messages (~200 B and 1 KiB JSON, 32 partitions) produced twice to topics of their own: once as
they are, once with 5% of them sent again a few records later in the same partition (message i
with i % 20 == 0 again after 1 to 8 more of its partition's records, same key, payload and
headers: what a producer's retry makes). One ingest worker; subscriptions created disabled,
clock from enabling one to its stored offsets reaching the records produced; runs without and
with duplicates interleaved into an emptied inbox. Figure: the ingest worker's CPU time
(utime + stime from /proc) per record read, with duplicates / without, target <= 1.2x; the
rows stored are checked (N, each once) and the duplicates counted by the worker (N / 20)."""

import time

from lib.common import BenchError, log
from lib.eventbox import (create_disabled_subscription, ingest_counters, set_enabled,
                          wait_offsets, worker_pids)
from lib.kafka import produce
from lib.messages import (DUP_EVERY, DUP_LATER, PARTITIONS, SIZES, Messages,
                          with_duplicates)
from lib.proc import TICKS, proc_cpu
from lib.table import ROW

TARGET = 1.2


def run_one(cur, msgs, sub, topic, records, dups):
    cur.execute("TRUNCATE eventbox.inbox")
    create_disabled_subscription(cur, sub, topic)
    cur.execute("CHECKPOINT")
    time.sleep(0.3)
    pids = worker_pids(cur, "ingest")
    if len(pids) != 1:
        raise BenchError("ingest_dup: %d ingest workers, expected 1" % len(pids))
    base = ingest_counters(cur)
    cpu0 = proc_cpu(pids[0])
    t0 = time.monotonic()
    set_enabled(cur, sub, True)
    elapsed, _, _ = wait_offsets(cur, sub, records, t0, base[0],
                                 timeout=max(120, records / 200))
    cpu1 = proc_cpu(pids[0])
    set_enabled(cur, sub, False)
    # The worker counts a batch just after committing it: give the last count a moment.
    settle = time.monotonic() + 2
    after = ingest_counters(cur)
    while after[0] - base[0] < records and time.monotonic() < settle:
        time.sleep(0.02)
        after = ingest_counters(cur)
    cur.execute("SELECT count(*), count(DISTINCT message_id) FROM eventbox.inbox "
                "WHERE subscription = %s", (sub,))
    rows, distinct = cur.fetchone()
    cur.execute("SELECT count(*) FROM eventbox.conflicts WHERE subscription = %s", (sub,))
    conflicts = cur.fetchone()[0]
    counted = after[1] - base[1]
    if rows != msgs.n or distinct != msgs.n or counted != dups or conflicts:
        raise BenchError("ingest_dup %s: %d rows (%d distinct ids), expected %d; %d duplicates "
                         "counted, expected %d; %d conflicts" % (sub, rows, distinct, msgs.n,
                                                                 counted, dups, conflicts))
    cur.execute("SELECT eventbox.drop_subscription(%s)", (sub,))
    cpu_s = (cpu1 - cpu0) / TICKS
    return {"records": records, "elapsed": elapsed, "rate": records / elapsed, "cpu_s": cpu_s,
            "us_per_record": cpu_s / records * 1e6, "duplicates": counted}


def run(ctx):
    env, cur, args, res = ctx.env, ctx.cur, ctx.args, ctx.res
    n = args.ingest_messages
    out = res["ingest_dup"] = {"n": n, "sizes": {}}
    for size in SIZES:
        msgs = Messages(n, SIZES[size], seed=0x3100)
        plain = list(msgs.records())
        with_dups, dups = with_duplicates(plain, seed=0x3100 + SIZES[size])
        topic_p, topic_d = "bench_dup_%s_plain" % size.lower(), "bench_dup_%s_dups" % size.lower()
        produce(env, topic_p, PARTITIONS, plain, flush_s=60)
        produce(env, topic_d, PARTITIONS, with_dups, flush_s=60)
        log("ingest_dup %s: %d messages produced, and %d with %d duplicates"
            % (size, n, len(with_dups), dups))
        per = out["sizes"][size] = {"plain": [], "dups": [], "avg_payload": msgs.avg_payload}
        for rep in range(args.repeat):
            for side, topic, records, d in (("plain", topic_p, n, 0),
                                            ("dups", topic_d, len(with_dups), dups)):
                sub = "bench_dup_%s_%s_%d" % (size.lower(), side, rep)
                x = run_one(cur, msgs, sub, topic, records, d)
                per[side].append(x)
                log("  %s: %.0f records/s in %.2fs, ingest worker %.1f us/record"
                    % (side, x["rate"], x["elapsed"], x["us_per_record"]))
        cur.execute("TRUNCATE eventbox.inbox")
        cur.execute("TRUNCATE eventbox.conflicts")


def table_rows(res):
    dup = res.get("ingest_dup")
    if not dup:
        return []
    rows = []
    for size, per in dup["sizes"].items():
        d = min(x["us_per_record"] for x in per["dups"])
        p = min(x["us_per_record"] for x in per["plain"])
        r = d / p
        rows.append(ROW % ("ingest 5%% dups %s, worker CPU (us/rec)" % size, "%.1f" % d,
                           "no dups %.1f" % p, "%.2f" % r,
                           "<= %.1f " % TARGET + ("ok" if r <= TARGET else "BELOW")))
    return rows


def notes(res, args):
    dup = res.get("ingest_dup")
    if not dup:
        return []
    out = ["ingest_dup: %d messages (%s JSON payloads) on %d partitions, and the same with "
           "every %dth message sent again %d-%d records of its partition later (same key, "
           "payload, headers); one ingest worker; subscriptions created disabled, clock from "
           "enabling to the stored offsets adding up to the records produced; runs without and "
           "with duplicates interleaved, %d each; figure: the ingest worker's utime+stime per "
           "record read (lowest of the runs), with / without"
           % (dup["n"], "/".join("%.0f B" % p["avg_payload"] for p in dup["sizes"].values()),
              PARTITIONS, DUP_EVERY, DUP_LATER[0], DUP_LATER[1], args.repeat)]
    for size, per in dup["sizes"].items():
        out.append("%s runs: without %s us/record (%s rec/s); with %s us/record (%s rec/s), "
                   "duplicates counted %s"
                   % (size, " ".join("%.1f" % x["us_per_record"] for x in per["plain"]),
                      " ".join("%.0f" % x["rate"] for x in per["plain"]),
                      " ".join("%.1f" % x["us_per_record"] for x in per["dups"]),
                      " ".join("%.0f" % x["rate"] for x in per["dups"]),
                      "/".join(str(x["duplicates"]) for x in per["dups"])))
    return out
