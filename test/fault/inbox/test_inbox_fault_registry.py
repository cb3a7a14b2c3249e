"""SIGKILL of the ingest worker of a value_format 'registry' subscription (docs/guide/formats.md)
while its records wait for their schema from a slow Schema Registry, and again while it stores
a batch; then the registry goes down and comes back. Afterwards every Avro record (written by
python3-avro, an encoder independent of the extension) is in the inbox exactly once with its
decoded payload and its bytes; the outage paused the subscription (eventbox.subscription_errors)
and marked no record unparsable; a JSON subscription on the same server went on ingesting.

The schema cache is the worker's memory: every restarted worker fetches the schema again, so
each kill also tests that a fetch lost with its worker is asked again. Each SIGKILL makes the
postmaster restart the server; the killed pids are recorded in $EVENTBOX_KILLED_PIDS for the
run's log scan."""
import json
import time
import uuid

from inbox_streams import PacedStream
from inbox_kafka import end_offsets, json_value, produce
from inbox_support import LogWatch, poll, report, sigkill, unique_name
from schema_registry import avro_encode, wire

PARTITIONS = 3
WAITING_N = 1_500        # records produced before the first kill, all waiting for the schema
STREAM_N = 12_000        # records streamed while the worker is killed in the middle of storing
OUTAGE_N = 600           # records written with a schema version first seen during the outage
CHUNK = 250
PACE_S = 0.2             # ~1250 records/s: a stream of ~10 s
STREAM_KILLS = 2
SLOW_FETCH_S = 6.0       # the slow registry: below the 10 s default request.timeout.ms
HANGING_S = 30.0         # the hanging registry: above it, every fetch times out (an outage)
RECOVERY_BOUND_S = 60    # wait for ingestion to resume after a kill (crash restart, group rejoin)
# The JSON subscription's records must be stored within this while the registry is down or
# hangs. A worker that waited for the registry in its loop would miss it: a hanging fetch takes
# the 10 s request timeout, and the refused phase lasts longer than the bound. 8 s is four
# times the 2 s of the slow-registry integration test (test_inbox_registry_failures.py), for a
# loaded machine.
OTHER_BOUND_S = 8.0
OUTAGE_BURSTS = 3        # JSON bursts in each outage phase (refused, hanging)
BURST_N = 200

READING = json.dumps({
    "type": "record", "name": "Reading", "namespace": "com.example.fault",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "i", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "amount", "type": "double"},
        {"name": "body", "type": "string"},
    ]})
# Version 2 of the subject (a field with a default): its id is first used during the outage.
READING_V2 = json.dumps(dict(json.loads(READING), fields=json.loads(READING)["fields"] + [
    {"name": "channel", "type": "string", "default": "web"}]))


def datum(i, v2=False):
    d = {"id": "r-%d" % i, "i": i, "note": None if i % 3 else "n%d" % i, "amount": i * 0.25,
         "body": "x" * (i % 64)}
    if v2:
        d["channel"] = "app%d" % (i % 7)
    return d


def expected_payload(i, v2=False):
    return datum(i, v2)  # the JSON mapping of these types is the value itself


def test_sigkill_and_outage_of_registry_subscription_lose_and_duplicate_nothing(
        ib_db, ib_topic, ib_producer, ib_subscriptions, registry):
    topic, json_topic = ib_topic("regfault", PARTITIONS), ib_topic("regfault_json", 2)
    sid = registry.register(topic + "-value", READING)
    sid2 = registry.register(topic + "-value", READING_V2)
    run = uuid.uuid4().hex[:8]
    log = LogWatch()
    since = ib_db.value("SELECT clock_timestamp()")
    sub = ib_subscriptions(unique_name("regfault"), [topic], value_format="registry")
    other = ib_subscriptions(unique_name("regfault_json"), [json_topic])
    ib_db.wait_worker_reloaded(since)
    pid = ib_db.wait_ingest_worker(timeout=60)

    sent = {}  # message id -> (value bytes, expected payload)

    def record(i, v2=False):
        mid = "%s-%06d" % (run, i)
        value = wire(sid2 if v2 else sid, avro_encode(READING_V2 if v2 else READING,
                                                      datum(i, v2)))
        sent[mid] = (value, expected_payload(i, v2))
        return mid, value, b"k%d" % (i % 50)

    def rows():
        return ib_db.value_retry("SELECT count(*) FROM eventbox.inbox WHERE subscription = %s",
                                 (sub,))

    def fetches(schema_id):
        return registry.count("/schemas/ids/%d" % schema_id)

    def wait_rows_at_least(n, timeout):
        deadline = time.monotonic() + timeout
        while True:
            have = rows()
            if have >= n:
                return have
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    killed, kills = [], []

    def kill(what):
        nonlocal pid
        at = rows()
        killed.append(pid)
        sigkill(pid)
        t = time.monotonic()
        pid = ib_db.wait_ingest_worker(timeout=120, not_pid=pid)
        kills.append({"what": what, "rows": at, "rows_after_restart": rows(), "t": t})

    # ---- 1. The worker killed while the records wait for their schema (a slow registry).
    registry.delay = SLOW_FETCH_S
    waiting = [record(i) for i in range(WAITING_N)]
    produce(ib_producer, topic, [{"value": v, "key": k, "headers": [("message_id", m.encode())]}
                                 for m, v, k in waiting])
    poll(lambda: fetches(sid) >= 1, 60, "the fetch of schema id %d" % sid)
    waiting_at_kill = rows()
    assert waiting_at_kill == 0, "records stored before their schema arrived"
    kill("waiting for the schema")
    n = wait_rows_at_least(WAITING_N, RECOVERY_BOUND_S + SLOW_FETCH_S)
    assert n is not None, "the waiting records were not stored within %d s of the kill (have %d)" \
        % (RECOVERY_BOUND_S + SLOW_FETCH_S, rows())
    first_resumed_s = round(time.monotonic() - kills[-1]["t"], 1)
    fetches_after_first_kill = fetches(sid)

    # ---- 2. The worker killed while it stores batches of a stream (each new worker fetches the
    # schema again: a shorter delay keeps the stream flowing).
    registry.delay = 0.5
    stream = PacedStream(topic, [record(i) for i in range(WAITING_N, WAITING_N + STREAM_N)],
                         CHUNK, PACE_S, name="registry-fault-producer")
    stream.start()
    resumed = []
    for k in range(STREAM_KILLS):
        base = rows()
        # Storing: 500 more rows since the last look, with the stream still flowing.
        n = wait_rows_at_least(base + 500, RECOVERY_BOUND_S)
        assert n is not None, "the worker stored nothing for %d s (kill %d of the stream)" % (
            RECOVERY_BOUND_S, k + 1)
        if k > 0:
            resumed.append(round(time.monotonic() - kills[-1]["t"], 1))
        kill("storing a batch")
    stream.join(timeout=180)
    assert not stream.is_alive(), "producer still running"
    if stream.error is not None:
        raise stream.error
    n = wait_rows_at_least(kills[-1]["rows_after_restart"] + 1, RECOVERY_BOUND_S)
    assert n is not None, "ingestion did not resume within %d s of the last kill" \
        % RECOVERY_BOUND_S
    resumed.append(round(time.monotonic() - kills[-1]["t"], 1))
    ib_db.wait_caught_up(sub, end_offsets(topic, PARTITIONS), timeout=180)

    # ---- 3. The registry down (refused connections), then hanging (every fetch times out),
    # while records of a schema version the worker has not seen arrive; a JSON subscription
    # goes on meanwhile.
    registry.delay = 0.0
    registry.stop()
    outage_start = time.monotonic()
    outage = [record(i, v2=True) for i in range(WAITING_N + STREAM_N,
                                                  WAITING_N + STREAM_N + OUTAGE_N)]
    produce(ib_producer, topic, [{"value": v, "key": k, "headers": [("message_id", m.encode())]}
                                 for m, v, k in outage])
    error = poll(lambda: ib_db.value(
        "SELECT error FROM eventbox.subscription_errors WHERE subscription = %s", (sub,)),
        60, "the registry error of " + sub)
    assert registry.url in error and "schema id %d" % sid2 in error, error

    other_latencies, other_sent = [], 0

    def json_burst():
        nonlocal other_sent
        start = time.monotonic()
        produce(ib_producer, json_topic, [{"value": json_value({"n": other_sent + j})}
                                          for j in range(BURST_N)])
        other_sent += BURST_N
        ib_db.wait_rows(other, other_sent, timeout=OTHER_BOUND_S)
        other_latencies.append(time.monotonic() - start)

    def outage_phase():
        for _ in range(OUTAGE_BURSTS):
            json_burst()
            assert rows() == WAITING_N + STREAM_N, "a record stored during the outage"
            time.sleep(3)

    outage_phase()  # refused
    fetches_before_hanging = fetches(sid2)
    registry.delay = HANGING_S
    registry.start()  # on the same port, but every answer comes after the request timeout
    hanging_start = time.monotonic()
    poll(lambda: fetches(sid2) > fetches_before_hanging, 90,
         "a fetch of schema id %d from the hanging registry" % sid2)
    outage_phase()  # hanging
    # Wait until the hanging fetch timed out (10 s), to see the subscription still paused.
    time.sleep(max(0.0, 11.0 - (time.monotonic() - hanging_start)))
    still_error = ib_db.value(
        "SELECT error FROM eventbox.subscription_errors WHERE subscription = %s", (sub,))
    hanging_fetches = fetches(sid2) - fetches_before_hanging
    registry.delay = 0.0  # back
    back = time.monotonic()
    outage_s = round(back - outage_start, 1)
    n = wait_rows_at_least(WAITING_N + STREAM_N + OUTAGE_N, 150)
    assert n is not None, "the outage's records were not stored within 150 s (have %d)" % rows()
    stored_after_back_s = round(time.monotonic() - back, 1)
    ends = end_offsets(topic, PARTITIONS)
    ib_db.wait_caught_up(sub, ends, timeout=60)
    poll(lambda: ib_db.value(
        "SELECT count(*) = 0 FROM eventbox.subscription_errors WHERE subscription = %s", (sub,)),
        90, "the error of %s to clear" % sub)

    # ---- The verdict.
    stored = {}
    duplicated, unexpected, wrong, statuses = 0, [], [], {}
    for r in ib_db.inbox_rows(sub, "message_id, status, payload, raw_payload, last_error"):
        mid = r["message_id"]
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        if mid in stored:
            duplicated += 1
            continue
        stored[mid] = r
        if mid not in sent:
            unexpected.append(mid)
            continue
        value, payload = sent[mid]
        if (r["status"] != "received" or r["payload"] != payload
                or r["raw_payload"] is None or bytes(r["raw_payload"]) != value):
            wrong.append((mid, r["status"], r["last_error"]))
    lost = sorted(set(sent) - set(stored))
    unparsable = statuses.get("unparsable", 0)
    report("fault_registry_ingest", records=len(sent), kills=len(kills), lost=len(lost),
           duplicated=duplicated, unexpected=len(unexpected), wrong_payload=len(wrong),
           unparsable=unparsable,
           rows_at_kills="/".join(str(x["rows"]) for x in kills),
           resumed_after_s="%s/%s" % (first_resumed_s, "/".join(str(r) for r in resumed)),
           fetches_of_schema=fetches(sid), fetches_after_first_kill=fetches_after_first_kill,
           outage_s=outage_s, hanging_fetches=hanging_fetches,
           stored_after_back_s=stored_after_back_s,
           json_latency_max_s="%.2f" % max(other_latencies),
           json_latencies_s="/".join("%.2f" % x for x in other_latencies))
    assert lost == [], "%d record(s) lost, e.g. %r" % (len(lost), lost[:5])
    assert duplicated == 0 and unexpected == [], (duplicated, unexpected[:5])
    assert unparsable == 0 and wrong == [], (statuses, wrong[:5])
    assert len(stored) == WAITING_N + STREAM_N + OUTAGE_N
    assert sum(ends.values()) == len(sent), ends
    assert ib_db.stored_offsets(sub) == ends
    assert still_error is not None, "the subscription was not paused while the registry hung"
    assert ib_db.inbox_count(other) == other_sent

    crashes = log.crash_lines(allowed_pids=killed)
    assert not crashes, "unexpected crash lines:\n" + "\n".join(crashes)
    assert len(log.crash_lines()) >= len(kills), "the kills do not show in the server log"
    assert len(stream.where) == STREAM_N
    # The fetch lost with the first killed worker was asked again by its successor.
    assert fetches_after_first_kill >= 2, fetches_after_first_kill
