"""Live upgrade: a 0.1.0 schema under the current library, filled with live state, then
ALTER EXTENSION pg_eventbox UPDATE while the supervisor waits. Nothing is lost or run twice."""

import collections
import pathlib
import re
import uuid

import psycopg2
import pytest

from clusters import (HANDLER_DDL, Elapsed, duplicates, query, query_one, report,
                             wait_settled, wait_until, wait_workers, worker_counts)

# The library's version is the control file's default_version.
LIBRARY_VERSION = re.search(
    r"^default_version = '([^']+)'",
    (pathlib.Path(__file__).parents[3] / "pg_eventbox.control").read_text(), re.M).group(1)
MISMATCH = (r'WARNING:  pg_eventbox library ' + re.escape(LIBRARY_VERSION) +
            r' does not match the schema version 0\.1\.0 '
            r'installed in database "app"; its workers wait')

# The lane of the `legacy` topic as a 0.1.0 install left it: inbox rows in every status (their
# records were ingested before), in offset order. (message index, status, attempts, last_error)
LEGACY = [(0, "processed", 1, None), (1, "processed", 1, None), (2, "ignored", 0, None),
          (3, "unparsable", 0, "not JSON"), (4, "dead", 10, "boom"), (5, "dead", 10, "boom"),
          (6, "retry", 1, "transient"), (7, "retry", 1, "transient"),
          (8, "received", 0, None), (9, "received", 0, None), (10, "received", 0, None),
          (11, "received", 0, None)]
UNTOUCHED = ("processed", "ignored", "unparsable", "dead")


def test_alter_extension_update_while_workers_wait(clusters, kafka):
    cluster = clusters("live").start(db="app", brokers=kafka.bootstrap)
    c = cluster.connect()
    in_topic, legacy = kafka.topic("orders"), kafka.topic("legacy", 1)
    pre, out = kafka.topic("pre"), kafka.topic("out")

    query(c, "CREATE EXTENSION pg_eventbox VERSION '0.1.0'")
    cluster.wait_log(MISMATCH, timeout=15)
    hint = cluster.log_lines(r"HINT:  Run ALTER EXTENSION pg_eventbox UPDATE in that database\.")
    assert hint, "the mismatch WARNING has no hint"

    # Live state, all of it made under the current library against the 0.1.0 schema.
    query(c, "CREATE ROLE app_handler NOLOGIN")
    query(c, HANDLER_DDL.replace("{out}", out).replace("{role}", "app_handler"))
    query(c, "SELECT eventbox.create_subscription('orders', ARRAY[%s, %s], backoff => '100 ms', "
             "backoff_max => '1 s')", (in_topic, legacy))
    query(c, "SELECT eventbox.register_handler('orders', "
             "'shop.on_order(eventbox.inbox)'::regprocedure, run_as => 'app_handler')")
    assert query(c, "SELECT pg_typeof(handler)::text FROM eventbox.handlers") == [("regprocedure",)]
    # send() works on the old schema: the outbox did not change.
    pre_ids = [r[0] for r in query(c, "SELECT eventbox.send(%s, jsonb_build_object('n', g), "
                                      "key => 'k' || g %% 7) FROM generate_series(1, 50) g",
                                   (pre,))]
    assert len(set(pre_ids)) == 50

    # Records waiting in Kafka (nothing ingests them yet).
    in_ids = [str(uuid.uuid4()) for _ in range(40)]
    kafka.produce(in_topic, [(m, i % 4, "k%d" % i, {"n": i}, "OrderCreated")
                             for i, m in enumerate(in_ids)])
    # The legacy lane: its records are in Kafka and already in the inbox, with their offset.
    leg_ids = ["legacy-%d" % i for i, *_ in LEGACY]
    offs = kafka.produce(legacy, [(m, 0, None, {"n": i}, "OrderCreated")
                                  for i, m in enumerate(leg_ids)])
    assert [o for _, o in offs] == list(range(12))
    for i, status, attempts, err in LEGACY:
        query(c, """
            INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset",
                                        headers, payload, raw_payload, event_type, status,
                                        attempts, next_attempt_at, processed_at, last_error)
            VALUES ('orders', %(m)s, %(t)s, 0, %(o)s,
                    jsonb_build_object('message_id', %(m)s, 'event_type', 'OrderCreated'),
                    CASE WHEN %(s)s = 'unparsable' THEN NULL ELSE jsonb_build_object('n', %(o)s) END,
                    CASE WHEN %(s)s = 'unparsable' THEN '\\x00ff'::bytea END, 'OrderCreated', %(s)s,
                    %(a)s, CASE WHEN %(s)s = 'retry' THEN now() - interval '1 s' END,
                    CASE WHEN %(s)s IN ('processed', 'ignored') THEN now() END, %(e)s)""",
              dict(m=leg_ids[i], t=legacy, o=i, s=status, a=attempts, e=err))
    query(c, "INSERT INTO eventbox.offsets (subscription, topic, \"partition\", next_offset) "
             "VALUES ('orders', %s, 0, 12)", (legacy,))
    # A pass that took legacy-8 (attempts 0) and never finished: the next pass counts it.
    query(c, "INSERT INTO eventbox.handler_claims VALUES ('orders', %s, 0, ARRAY['legacy-8'], "
             "ARRAY[0])", (legacy,))
    untouched_before = query(c, "SELECT * FROM eventbox.inbox WHERE status = ANY (%s) "
                                "ORDER BY message_id", (list(UNTOUCHED),))
    assert len(untouched_before) == 6

    # process() refuses the old schema, with the hint.
    with pytest.raises(psycopg2.Error) as err:
        query(c, "SELECT eventbox.process('orders')")
    assert err.value.pgcode == "55000", err.value
    assert "ALTER EXTENSION pg_eventbox UPDATE" in (err.value.diag.message_hint or ""), err.value

    # All that while: no worker ran, and the WARNING was said once.
    assert worker_counts(c) == {}
    assert len(cluster.log_lines(MISMATCH)) == 1, cluster.log_lines(MISMATCH)
    assert query_one(c, "SELECT count(*) FROM eventbox.outbox WHERE status = 'pending'") == 50
    assert query_one(c, "SELECT count(*) FROM shop.handled") == 0

    # The upgrade, under the waiting supervisor.
    cluster.mark_log()
    el = Elapsed()
    query(c, "ALTER EXTENSION pg_eventbox UPDATE")
    up_s = el()
    workers_s = wait_workers(cluster, timeout=15) + up_s
    cluster.wait_log(r'pg_eventbox ' + re.escape(LIBRARY_VERSION) +
                     r' found in database "app"; starting workers', 5, since_mark=True)
    assert query(c, "SELECT handler, run_as::text, pg_typeof(handler)::text FROM eventbox.handlers"
                 ) == [("shop.on_order(eventbox.inbox)", "app_handler", "text")]

    # The outbox rows left pending under 0.1.0: delivered, each exactly once.
    recs = kafka.wait_ids(pre, pre_ids, timeout=30)
    delivered_s = el()
    wait_until(lambda: query_one(c, "SELECT count(*) FROM eventbox.outbox WHERE topic = %s",
                                 (pre,)) == 0, 15, what="pending rows of %s acknowledged" % pre)
    recs = kafka.read(pre)
    mids = collections.Counter(r.message_id for r in recs)
    assert set(mids) == set(pre_ids) and not duplicates(mids), (len(recs), duplicates(mids))

    # Kafka records ingested, waiting rows handled: each expected message exactly once.
    status = wait_settled(c, "orders", 40 + 12, timeout=60)
    handled_s = el()
    assert status == {"processed": 48, "dead": 2, "ignored": 1, "unparsable": 1}, status
    runs = query(c, "SELECT message_id, ran_as, attempt, out_id::text FROM shop.handled")
    ran = collections.Counter(m for m, *_ in runs)
    expected = set(in_ids) | {leg_ids[i] for i, s, *_ in LEGACY if s in ("retry", "received")}
    assert set(ran) == expected, (sorted(set(ran) - expected), sorted(expected - set(ran)))
    assert not duplicates(ran), duplicates(ran)
    assert {r[1] for r in runs} == {"app_handler"}
    # legacy-8's interrupted pass was counted before it ran again; the retries ran attempt 2.
    attempts = {m: a for m, _, a, _ in runs}
    assert attempts["legacy-8"] == 2 and attempts["legacy-6"] == 2 and attempts["legacy-9"] == 1

    # Untouched: dead, processed, ignored, unparsable rows are exactly as they were in 0.1.0's
    # columns (later releases append columns: 0.2.0 mode, 'live' for every row handled before;
    # 0.4.0 key_payload, NULL for keys read as bytes).
    untouched_ids = ([r[1] for r in untouched_before],)
    after = query(c, "SELECT * FROM eventbox.inbox WHERE message_id = ANY (%s) ORDER BY message_id",
                  untouched_ids)
    assert [r[:len(untouched_before[0])] for r in after] == untouched_before
    assert query(c, "SELECT DISTINCT mode, key_payload FROM eventbox.inbox "
                    "WHERE message_id = ANY (%s)", untouched_ids) == [("live", None)]
    # Offsets: the legacy lane kept its stored offset; the new records were all read once.
    offsets = dict(((t, p), o) for t, p, o in query(
        c, "SELECT topic, \"partition\", next_offset FROM eventbox.offsets"))
    assert offsets[(legacy, 0)] == 12
    assert {p: offsets.get((in_topic, p)) for p in range(4)} == {p: 10 for p in range(4)}
    assert query(c, "SELECT count(*) FROM eventbox.handler_claims WHERE message_ids <> '{}'"
                 ) == [(0,)]
    ingest = query(c, "SELECT messages, duplicates FROM eventbox.workers WHERE role = 'ingest'")
    assert ingest == [(40, 0)], ingest

    # Every handler run produced exactly one output record.
    out_ids = [r[3] for r in runs]
    recs = kafka.wait_ids(out, out_ids, timeout=30)
    outs = collections.Counter(r.message_id for r in recs)
    assert set(outs) == set(out_ids) and not duplicates(outs)

    assert query_one(c, "SELECT eventbox.process('orders')") == 0
    assert len(cluster.log_lines(MISMATCH)) == 1
    assert not cluster.log_lines(r"cache lookup failed|ERROR:.*eventbox", since_mark=True), \
        cluster.log_lines(r"ERROR", since_mark=True)
    report("live_upgrade", alter_s="%.2f" % up_s, workers_after_s="%.1f" % workers_s,
           outbox_delivered_after_s="%.1f" % delivered_s, inbox_settled_after_s="%.1f" % handled_s,
           outbox_rows=len(pre_ids), kafka_records=len(in_ids), handler_runs=len(runs),
           lost=0, duplicated=0)
    c.close()
