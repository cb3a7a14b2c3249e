"""Section formats (docs/guide/formats.md), each side against the same messages as JSON text, in
the same run:
- ingest of Schema Registry records (value_format 'registry', Avro, ~1 KiB JSON equivalent), one
  ingest worker: clock from enabling the subscription (N messages produced beforehand) to its
  stored offsets reaching N; the Avro records are written by python3-avro;
- relay encoding into Avro (eventbox.set_topic_format()): N messages sent in one transaction to
  a running relay whose subject schema is cached (one message sent and delivered first); clock
  from that COMMIT to the outbox being empty.
The registry is test/lib/schema_registry.py on loopback."""

import io
import json
import time

from lib.cluster import q1
from lib.common import BenchError, log
from lib.eventbox import (alter_system, create_disabled_subscription, ingest_counters,
                          set_enabled, vacuum_outbox, wait_offsets, worker_pids)
from lib.kafka import produce
from lib.messages import PARTITIONS, Messages
from lib.proc import CpuMeter
from lib.table import ROW, best, per_msg_us

from schema_registry import SchemaRegistry, wire  # test/lib, on the path (lib.cluster)

SIZE = 1024

# The JSON messages' fields (bench/lib/messages.py), as an Avro record.
SCHEMA = json.dumps({
    "type": "record", "name": "OrderCreated", "namespace": "bench",
    "fields": [{"name": "id", "type": "long"}, {"name": "pad", "type": "string"},
               {"name": "sku", "type": "string"}, {"name": "type", "type": "string"},
               {"name": "amount", "type": "long"}, {"name": "currency", "type": "string"},
               {"name": "customer", "type": "string"}]})


def avro_records(msgs, schema_id):
    """The messages' payloads as Avro in the wire format (python3-avro), same keys, headers and
    partitions as Messages.records()."""
    import io

    import avro.io
    import avro.schema

    writer = avro.io.DatumWriter(avro.schema.parse(SCHEMA))
    for value, key, partition, headers in msgs.records():
        out = io.BytesIO()
        writer.write(json.loads(value), avro.io.BinaryEncoder(out))
        yield wire(schema_id, out.getvalue()), key, partition, headers


def run_one(cur, sub, topic, n, registry_format, pg_groups):
    create_disabled_subscription(cur, sub, topic)
    if registry_format:
        cur.execute("SELECT eventbox.set_subscription_format(%s, 'registry')", (sub,))
    cur.execute("CHECKPOINT")
    time.sleep(0.3)
    ingest_pid = worker_pids(cur, "ingest")
    base = ingest_counters(cur)
    meter = CpuMeter(dict(pg_groups, ingest=lambda: ingest_pid))
    meter.start()
    t0 = time.monotonic()
    set_enabled(cur, sub, True)
    elapsed, _first, _count = wait_offsets(cur, sub, n, t0, base[0], timeout=max(120, n / 200))
    cpu = meter.stop()
    set_enabled(cur, sub, False)
    received = q1(cur, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s "
                       "AND status = 'received'", (sub,))
    if received != n:
        raise BenchError("formats: %s stored %d received rows, expected %d" % (sub, received, n))
    size = q1(cur, "SELECT avg(pg_column_size(payload) + coalesce(pg_column_size(raw_payload), "
                   "0))::int FROM eventbox.inbox WHERE subscription = %s", (sub,))
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "cpu": cpu, "row_bytes": size}


def drained(cur, timeout):
    """Waits until the outbox is empty; returns the seconds it took."""
    t0 = time.monotonic()
    while q1(cur, "SELECT EXISTS (SELECT 1 FROM eventbox.outbox)"):
        if time.monotonic() - t0 > timeout:
            raise BenchError("formats: the outbox is not empty after %.0fs: %r" % (
                timeout, q1(cur, "SELECT max(last_error) FROM eventbox.outbox")))
        time.sleep(0.01)
    return time.monotonic() - t0


def run_relay(env, cur, msgs, topic, registry_format, pg_groups):
    env.broker.create_topic(topic, PARTITIONS)
    if registry_format:
        cur.execute("SELECT eventbox.set_topic_format(%s, 'registry')", (topic,))
    payload0, key0 = msgs.items[0][4], msgs.items[0][3]
    cur.execute("SELECT eventbox.send(%s, %s::jsonb, %s)", (topic, payload0, key0))
    drained(cur, 60)  # the relay has the subject's schema now
    vacuum_outbox(cur)
    cur.execute("DROP TABLE IF EXISTS bench_fmt_staging")
    cur.execute("CREATE UNLOGGED TABLE bench_fmt_staging (n int PRIMARY KEY, key text, "
                "payload text)")
    buf = io.StringIO("".join("%d\t%s\t%s\n" % (i, item[3], item[4].replace("\\", "\\\\"))
                              for i, item in enumerate(msgs.items)))
    cur.copy_expert("COPY bench_fmt_staging FROM STDIN", buf)
    cur.execute("CHECKPOINT")
    relay = worker_pids(cur, "relay")
    meter = CpuMeter(dict(pg_groups, relay=lambda: relay))
    conn = env.connect(autocommit=False)
    c2 = conn.cursor()
    c2.execute("SELECT count(eventbox.send(%s, s.payload::jsonb, s.key)) "
               "FROM (SELECT * FROM bench_fmt_staging ORDER BY n) s", (topic,))
    meter.start()
    conn.commit()
    elapsed = drained(cur, max(300, msgs.n / 500))
    cpu = meter.stop()
    conn.close()
    failed = q1(cur, "SELECT count(*) FROM eventbox.outbox WHERE status = 'failed'")
    if failed:
        raise BenchError("formats: %d rows failed" % failed)
    return {"n": msgs.n, "elapsed": elapsed, "rate": msgs.n / elapsed, "cpu": cpu}


def run(ctx):
    env, cur, args, pg_groups = ctx.env, ctx.cur, ctx.args, ctx.pg_groups
    n = args.formats_messages
    out = ctx.res["formats"] = {"n": n, "json": [], "avro": [], "relay_json": [],
                                "relay_avro": []}
    registry = SchemaRegistry().start()
    try:
        alter_system(cur, "eventbox.schema_registry_url", registry.url)
        time.sleep(0.5)
        for rep in range(args.repeat):
            msgs = Messages(n, SIZE, seed=0x3000 + rep)
            tag = "%d_%d" % (rep + 1, int(time.time()) % 100000)
            sid = registry.register("bench_fmt_avro_%s-value" % tag, SCHEMA)
            t_json, t_avro = "bench_fmt_json_" + tag, "bench_fmt_avro_" + tag
            produce(env, t_json, PARTITIONS, msgs.records(), flush_s=60)
            t0 = time.monotonic()
            produce(env, t_avro, PARTITIONS, avro_records(msgs, sid), flush_s=60)
            log("formats: %d messages as JSON and as Avro (encoded and produced in %.1fs)"
                % (n, time.monotonic() - t0))
            cur.execute("TRUNCATE eventbox.inbox")
            x = run_one(cur, t_json, t_json, n, False, pg_groups)
            out["json"].append(x)
            log("  json: %.0f msg/s in %.2fs" % (x["rate"], x["elapsed"]))
            cur.execute("TRUNCATE eventbox.inbox")
            x = run_one(cur, t_avro, t_avro, n, True, pg_groups)
            out["avro"].append(x)
            log("  avro (registry): %.0f msg/s in %.2fs" % (x["rate"], x["elapsed"]))
            registry.register(t_avro + "_out-value", SCHEMA)
            x = run_relay(env, cur, msgs, t_json + "_out", False, pg_groups)
            out["relay_json"].append(x)
            log("  relay json: %.0f msg/s in %.2fs" % (x["rate"], x["elapsed"]))
            x = run_relay(env, cur, msgs, t_avro + "_out", True, pg_groups)
            out["relay_avro"].append(x)
            log("  relay avro (registry): %.0f msg/s in %.2fs" % (x["rate"], x["elapsed"]))
        cur.execute("TRUNCATE eventbox.inbox")
    finally:
        alter_system(cur, "eventbox.schema_registry_url", None)
        registry.stop()


def table_rows(res):
    f = res.get("formats")
    if not f or not f["avro"]:
        return []
    a, j = best(f["avro"]), best(f["json"])
    r = a["rate"] / j["rate"]
    return [
        ROW % ("ingest Avro, registry (msg/s)", "%.0f" % a["rate"], "same as JSON %.0f" % j["rate"],
               "%.2f" % r, ">= 0.8 " + ("ok" if r >= 0.8 else "BELOW")),
        ROW % ("  ingest worker cpu/msg avro/json (us)",
               "%.1f" % per_msg_us(f["avro"], "ingest_s"),
               "%.1f" % per_msg_us(f["json"], "ingest_s"), "-", "info"),
        ROW % ("  row bytes payload+raw avro/json", "%d" % a["row_bytes"], "%d" % j["row_bytes"],
               "-", "info (raw_payload kept)"),
    ] + relay_rows(f)


def relay_rows(f):
    if not f["relay_avro"]:
        return []
    a, j = best(f["relay_avro"]), best(f["relay_json"])
    r = a["rate"] / j["rate"]
    return [
        ROW % ("relay encoding Avro (msg/s)", "%.0f" % a["rate"], "same as JSON %.0f" % j["rate"],
               "%.2f" % r, ">= 0.8 " + ("ok" if r >= 0.8 else "BELOW")),
        ROW % ("  relay cpu/msg avro/json (us)", "%.1f" % per_msg_us(f["relay_avro"], "relay_s"),
               "%.1f" % per_msg_us(f["relay_json"], "relay_s"), "-", "info"),
    ]


def notes(res, args):
    f = res.get("formats")
    if not f or not f["avro"]:
        return []
    return ["formats: %d messages per run, the ingest section's ~1 KiB JSON payloads and the "
            "same fields as an Avro record (python3-avro, Confluent wire format, one schema id "
            "from a loopback registry); best of %d runs per side; registry records also keep "
            "their bytes in raw_payload. Relay: the same messages sent with send() in one "
            "transaction to a running relay, JSON as given against Avro encoded by the relay "
            "(the subject's schema fetched by one message before the clock)."
            % (f["n"], len(f["avro"]))]
