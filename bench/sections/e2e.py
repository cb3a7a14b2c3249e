"""Section e2e: Kafka -> handler committed at ~1k msg/s; baseline: a plain consumer with the
ingest consumer's fetch.wait.max.ms reading the same messages at the same time."""

import json
import time

from confluent_kafka import Producer

from lib.cluster import q1
from lib.common import BenchError, log
from lib.eventbox import HANDLER_ROLE, ingest_consumer_setting, set_enabled, setup_handler_objects
from lib.latency import latency_stats, paced_latency
from lib.messages import EVENT_TYPE, PARTITIONS, Messages, copy_buffer, copy_rows, make_payloads
from lib.table import ROW

E2E_RATE = 1000  # msg/s


def e2e_phase(env, cur, args, tmpdir, p, sub, tag, fetch_ms, track):
    """One paced run of the e2e figure with the (warmed-up) producer p; message ids
    'e2e<tag>-N'."""
    payloads = make_payloads(1000, 200, seed=11)
    failed = []
    prefix = "e2e%s-" % tag

    def on_delivery(err, msg):
        if err is not None:
            failed.append(err)

    def send(i):
        key, payload = payloads[i % len(payloads)]
        mid = "%s%08d" % (prefix, i)
        body = '{"ts": %.6f, %s' % (time.time(), payload[1:])
        p.produce(sub, body.encode(), key=key.encode(),
                  headers=[("event_type", EVENT_TYPE), ("message_id", mid)],
                  on_delivery=on_delivery)
        p.poll(0)
        return mid

    base = paced_latency(env, tmpdir, sub, E2E_RATE, args.e2e_seconds, fetch_ms, send,
                         args.latency_dump)
    if p.flush(30) != 0 or failed:
        raise BenchError("e2e producer: %d delivery failures" % len(failed))
    n = base["n"]
    deadline = time.monotonic() + 60
    while True:
        got = q1(cur, "SELECT count(*) FROM public.bench_e2e WHERE id LIKE %s", (prefix + "%",))
        if got >= n:
            break
        if time.monotonic() > deadline:
            raise BenchError("e2e: %d of %d messages handled 60 s after the last send"
                             % (got, n))
        time.sleep(0.1)
    cur.execute("SELECT (extract(epoch FROM e.handled) - e.sent) * 1000, "
                + ("(extract(epoch FROM pg_xact_commit_timestamp(e.xmin)) - e.sent) * 1000, "
                   if track else "NULL, ") +
                "(extract(epoch FROM i.received_at) - e.sent) * 1000 "
                "FROM public.bench_e2e e JOIN eventbox.inbox i ON i.subscription = %s "
                "AND i.message_id = e.id WHERE e.id LIKE %s", (sub, prefix + "%"))
    rows = cur.fetchall()
    cur.execute("SELECT count(*), max(attempts), count(*) FILTER (WHERE status <> 'processed'), "
                "count(DISTINCT received_at), count(DISTINCT processed_at) "
                "FROM eventbox.inbox WHERE subscription = %s AND message_id LIKE %s",
                (sub, prefix + "%"))
    inbox_rows, max_attempts, unprocessed, batches, passes = cur.fetchone()
    return {"n": n, "baseline": base, "achieved_rate": base["achieved_rate"],
            "handled": latency_stats(float(r[0]) for r in rows),
            "committed": latency_stats(float(r[1]) for r in rows) if track else None,
            "batch_start": latency_stats(float(r[2]) for r in rows),
            "inbox_rows": inbox_rows, "max_attempts": max_attempts, "unprocessed": unprocessed,
            "batches": batches, "passes": passes}


def run(ctx):
    """Producer at E2E_RATE msg/s for args.e2e_seconds; each payload carries its send time
    (wall clock); the handler records clock_timestamp(), and the commit time comes from
    pg_xact_commit_timestamp() (track_commit_timestamp = on). A plain consumer with the ingest
    consumer's fetch.wait.max.ms reads the same messages meanwhile: the baseline. Two phases:
    'fresh' right after the subscription is created on an emptied inbox (the workers plan their
    statements on an empty table), then 'steady' after the inbox was given 50000 processed rows
    and ANALYZEd (as autovacuum does in time), which makes the workers plan again."""
    env, cur, args, tmpdir, res = ctx.env, ctx.cur, ctx.args, ctx.tmpdir, ctx.res
    if args.e2e_seconds <= 0:
        return
    setup_handler_objects(cur)
    fetch_ms = ingest_consumer_setting("fetch.wait.max.ms") or 100
    sub = topic = "bench_e2e"
    cur.execute("TRUNCATE eventbox.inbox, public.bench_e2e")
    env.broker.create_topic(topic, PARTITIONS)
    cur.execute("SELECT eventbox.create_subscription(%s, ARRAY[%s])", (sub, topic))
    cur.execute("SELECT eventbox.register_handler(%s, 'public.bench_on_e2e(eventbox.inbox)'"
                "::regprocedure, run_as => %s)", (sub, HANDLER_ROLE))
    track = q1(cur, "SHOW track_commit_timestamp") == "on"
    p = Producer({"bootstrap.servers": env.bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5})
    # Warm-up (also of the producer, whose first messages wait for its metadata and producer
    # id): one message per partition, until the consumer is assigned and handled them all.
    for part in range(PARTITIONS):
        p.produce(topic, json.dumps({"id": 0, "ts": time.time()}).encode(), partition=part,
                  headers=[("event_type", EVENT_TYPE), ("message_id", "warm-%d" % part)])
    p.flush(30)
    deadline = time.monotonic() + 120
    while q1(cur, "SELECT count(*) FROM public.bench_e2e") < PARTITIONS:
        if time.monotonic() > deadline:
            raise BenchError("e2e warm-up: messages not handled within 120 s")
        time.sleep(0.1)
    out = res["e2e"] = {"fetch_wait_ms": fetch_ms, "track_commit_timestamp": track}
    log("e2e fresh inbox: %d msg/s for %ds, plain consumer with fetch.wait.max.ms=%d alongside"
        % (E2E_RATE, args.e2e_seconds, fetch_ms))
    out["fresh"] = e2e_phase(env, cur, args, tmpdir, p, sub, "F", fetch_ms, track)
    # Steady state: a representative inbox, analyzed.
    msgs = Messages(50000, 200, seed=0x6000)
    copy_rows(cur, copy_buffer(sub, topic, msgs, status="processed"))
    cur.execute("ANALYZE eventbox.inbox")
    time.sleep(1.5)
    log("e2e steady (inbox of 50000 processed rows, ANALYZEd): %d msg/s for %ds"
        % (E2E_RATE, args.e2e_seconds))
    out["steady"] = e2e_phase(env, cur, args, tmpdir, p, sub, "S", fetch_ms, track)
    set_enabled(cur, sub, False)
    for phase in ("fresh", "steady"):
        x = out[phase]
        lat = x["committed"] or x["handled"]
        log("  %s: eventbox p50 %.1f p99 %.1f ms; plain consumer p50 %.1f p99 %.1f ms"
            % (phase, lat["p50"], lat["p99"], x["baseline"]["p50"], x["baseline"]["p99"]))


def table_rows(res):
    e = res.get("e2e")
    if not e:
        return []
    rows = []
    for phase, label in (("steady", "e2e Kafka->handler commit @%.0f/s"),
                         ("fresh", "  same, fresh inbox @%.0f/s")):
        x = e[phase]
        lat = x["committed"] or x["handled"]
        b = x["baseline"]
        rows.append(ROW % (label % x["achieved_rate"],
                           "%.1f/%.1f ms" % (lat["p50"], lat["p99"]),
                           "consumer %.1f/%.1f ms" % (b["p50"], b["p99"]),
                           "%.2f" % (lat["p99"] / b["p99"]),
                           "info (p50/p99; p99 ratio)" if phase == "steady"
                           else "info (plans from empty table)"))
    x = e["steady"]
    rows.append(ROW % ("  steady: handler ran p50/p99 (ms)",
                       "%.1f/%.1f" % (x["handled"]["p50"], x["handled"]["p99"]),
                       "ingest batch start %.1f/%.1f" % (x["batch_start"]["p50"],
                                                         x["batch_start"]["p99"]), "-",
                       "info (fetch.wait.max.ms=%d)" % e["fetch_wait_ms"]))
    return rows


def notes(res, args):
    e = res.get("e2e")
    if not e:
        return []
    out = []
    st, fr = e["steady"], e["fresh"]
    out.append(
        "e2e: %d messages per phase at ~%.0f/s (confluent_kafka producer, acks=all, "
        "idempotence, linger.ms=5; send time = wall clock in the payload, taken just before "
        "produce()), 32 partitions, 1 subscription, handler public.bench_on_e2e records "
        "clock_timestamp(); 'commit' = pg_xact_commit_timestamp(xmin) of its row (%s). "
        "Phase 'fresh': right after create_subscription on an emptied inbox (warm-up of one "
        "message per partition first); phase 'steady': then 50000 processed rows COPYed in "
        "and ANALYZE eventbox.inbox (what autovacuum does in time; the workers re-plan). "
        "The ingest consumer sets fetch.wait.max.ms=%d and the mock broker does not answer "
        "a waiting fetch early when data arrives (real Kafka does), so up to that much is "
        "broker wait here; the baseline is a plain consumer with the same fetch.wait.max.ms "
        "reading the same messages meanwhile"
        % (st["n"], st["achieved_rate"], "track_commit_timestamp = on"
           if e["track_commit_timestamp"] else "off: handler time used",
           e["fetch_wait_ms"]))
    for name, x in (("steady", st), ("fresh", fr)):
        lat = x["committed"] or x["handled"]
        out.append("e2e %s: commit latency min %.1f mean %.1f max %.1f ms; handler ran "
                   "p50/p99 %.1f/%.1f; ingest batch start p50/p99 %.1f/%.1f; plain consumer "
                   "min/mean/max %.1f/%.1f/%.1f; %d ingest batches, %d handler passes; "
                   "%d rows, %d not processed, max attempts %s"
                   % (name, lat["min"], lat["mean"], lat["max"], x["handled"]["p50"],
                      x["handled"]["p99"], x["batch_start"]["p50"], x["batch_start"]["p99"],
                      x["baseline"]["min"], x["baseline"]["mean"], x["baseline"]["max"],
                      x["batches"], x["passes"], x["inbox_rows"], x["unprocessed"],
                      x["max_attempts"]))
    return out
