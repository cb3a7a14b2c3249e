"""The relay's, the ingest worker's and the handler workers' statements cost what their batch
costs, whatever the statistics say (issue 14's audit; the handler path's statements as
eventbox.process() runs them have test_handler_plans_unanalyzed.py, the retention purge
test_retention.py).

A cluster of its own loads auto_explain next to the extension (log_analyze, log_buffers, every
statement, JSON), so the log shows the plan of every statement the real background workers run,
with the buffers each node touched. Autovacuum is off: the tables are never analyzed, or
analyzed only while empty (statistics that say "no rows"), and the workers meet backlogs of
BACKLOG rows. Every plan of a relay or ingest statement must then:
- never scan the outbox's tables (eventbox.outbox is a view over the rotated tables, outbox_held
  and the ack tables: docs/design/outbox-rotation.md) or eventbox.inbox sequentially;
- never throw away more rows in a filter than it keeps (the defect's shape: an index scan over the
  whole backlog with a filter);
- touch at most a few buffers per row it handles (BUFFERS_PER_ROW, plus FIXED_BUFFERS for
  descending the indexes), far below what the backlog spans.
"""

import datetime
import json
import re
import time

import pytest

from clusters import query, query_one, wait_until

BACKLOG = 200000
KAFKA_RECORDS = 20000
PARTITIONS = 4
# An inbox row the ingest stores writes its heap page and three index entries (inbox_pkey,
# inbox_todo_idx, inbox_received_idx: no index is partial on the status since 0.6.0, so the
# entries a processed mark used to write are written once at the insert instead; about 13
# buffers per row measured).
BUFFERS_PER_ROW = 14
FIXED_BUFFERS = 200
WORKERS = ("eventbox relay", "eventbox ingest")
# The tables behind the view eventbox.outbox.
OUTBOX_TABLES = ("outbox_rows_0", "outbox_rows_1", "outbox_rows_2", "outbox_held",
                 "outbox_acks_0", "outbox_acks_1", "outbox_acks_2")
SCANNED_TABLES = OUTBOX_TABLES + ("inbox",)
EXPLAIN_CONF = (
    "shared_preload_libraries = 'pg_eventbox,auto_explain'",
    "auto_explain.log_min_duration = 0",
    "auto_explain.log_analyze = on",
    "auto_explain.log_buffers = on",
    "auto_explain.log_timing = off",
    "auto_explain.log_format = json",
    "autovacuum = off",
)
# A plan in the log: the prefix ('%m [%p] %b '), then the JSON document, each of its lines
# indented by a tab, ending with a tab and the closing brace.
PLAN_RE = re.compile(r"^(\S+ \S+) UTC \[(\d+)\] ([^:\n]+?) LOG:  duration: [\d.]+ ms  plan:\n"
                     r"(\t\{.*?\n\t\})$", re.M | re.S)
# While the test's own transaction inserts the outbox backlog, the relay's polls (woken every
# eventbox.relay_poll_interval) step over the index entries of those uncommitted rows and find
# nothing: that is MVCC, not the plan (the claim is the index scan above the cursor it must be).
# Polls that found no row in those windows (their plan returned none; its InitPlans read the
# relay's row of eventbox.outbox_state) are left out.
writing_windows = []


def worker_plans(cluster, workers=WORKERS):
    """(backend type, query text, plan dict) of every statement the workers ran."""
    out = []
    for m in PLAN_RE.finditer(cluster.log_text()):
        backend = m.group(3).strip()
        if backend not in workers:
            continue
        doc = json.loads(m.group(4))
        at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").replace(
            tzinfo=datetime.timezone.utc).timestamp()
        if (backend == "eventbox relay" and doc["Plan"].get("Actual Rows", 0) == 0
                and any(lo <= at <= hi for lo, hi in writing_windows)):
            continue
        out.append((backend, doc["Query Text"], doc["Plan"]))
    return out


def nodes(plan):
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def rows_handled(plan):
    """The most rows any node of the plan produced (over all its loops)."""
    return max(n.get("Actual Rows", 0) * max(n.get("Actual Loops", 1), 1) for n in nodes(plan))


# The relay's ack row of a pass (one row whose arrays carry the pass's acknowledged ids, up to
# eventbox.relay_batch_size, stored in TOAST) is written with the ids' work, not one row's.
ACK_ROW = "INSERT INTO eventbox.outbox_acks_%d (acked_at, max_id, ids, partitions, offsets) VALUES"
RELAY_BATCH = 1000


# Statements that read more than a batch by design, once per event and not per row: the relay's
# count of a rotated table's acknowledged ids before it truncates the table (a scan of that ack
# table, once per rotation), and the ingest's lowering of lane positions for a batch stored
# below what its process stored before (a record read again; an SQL function whose statements
# are planned at each call, their catalog reads counted on its Result node).
ONCE_PER_EVENT = ("sum(cardinality(ids))", "eventbox._inbox_stored_below(")


def problems(backend, text, plan):
    found = []
    if any(s in text for s in ONCE_PER_EVENT):
        return found
    rows = rows_handled(plan)
    if any(ACK_ROW % n in text for n in range(3)):
        rows = max(rows, RELAY_BATCH)
    limit = BUFFERS_PER_ROW * max(rows, 1) + FIXED_BUFFERS
    for n in nodes(plan):
        rel = n.get("Relation Name", "")
        kept = n.get("Actual Rows", 0) * max(n.get("Actual Loops", 1), 1)
        removed = n.get("Rows Removed by Filter", 0) + n.get("Rows Removed by Index Recheck", 0)
        buffers = n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0)
        what = "%s: %s on %s" % (backend, n["Node Type"], rel or "-")
        if n["Node Type"] == "Seq Scan" and rel in SCANNED_TABLES:
            found.append("%s: sequential scan" % what)
        if removed > kept + 10:
            found.append("%s: kept %d rows, filtered out %d" % (what, kept, removed))
        if buffers > limit:
            found.append("%s: %d buffers for %d rows (limit %d)" % (what, buffers, rows, limit))
    return ["%s\n    in: %s" % (p, " ".join(text.split())[:160]) for p in found]


def fill_inbox(c, n, tag):
    """n received rows of a subscription no handler serves, straight into the inbox (the backlog
    the ingest worker's statements run against)."""
    query(c, """
        INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset",
                                    payload, event_type)
        SELECT 'plans_backlog', %s || g, 'plans_backlog', g %% 8, g / 8,
               jsonb_build_object('n', g, 'pad', repeat('x', 150)), 'T'
          FROM generate_series(1, %s) g""", (tag + "-b-", n))


def check_workers(cluster, conn, kafka, tag, analyze_empty):
    """Drains an outbox backlog through the relay and a Kafka backlog through the ingest worker,
    then checks every plan they logged."""
    if analyze_empty:
        query(conn, "ANALYZE %s, eventbox.outbox_state, eventbox.inbox, eventbox.offsets"
              % ", ".join("eventbox." + t for t in OUTBOX_TABLES))
    # The workers plan their kept statements again after an ANALYZE (and at their start) on
    # whatever the tables hold then: empty, as a relay idles before an outage leaves a backlog.
    # Their periodic statements (the outbox purge runs each second) must be planned so first.
    time.sleep(2.5)
    # Light traffic first: a few records, some of them conflicting duplicates, so that the ingest
    # worker plans its conflicts check on a nearly empty inbox too.
    early = kafka.topic("plans_early_%s" % tag)
    kafka.produce(early, [("%s-e-%d" % (tag, i % 10), 0, "k", {"n": i}, "T") for i in range(20)])
    query(conn, "SELECT eventbox.create_subscription(%s, ARRAY[%s], start_from => 'earliest')",
          ("plans_early_" + tag, early))
    wait_until(lambda: query_one(conn, "SELECT count(*) FROM eventbox.conflicts WHERE "
                                       "subscription = %s", ("plans_early_" + tag,)) == 10, 60,
               what="the ingest worker recorded the early conflicts")
    assert query_one(conn, "SELECT count(*) FROM pg_stat_user_tables WHERE schemaname = "
                           "'eventbox' AND relname = ANY (%s) AND "
                           "(last_autoanalyze IS NOT NULL OR last_autovacuum IS NOT NULL)",
                     (list(SCANNED_TABLES),)) == 0
    # The outbox backlog: one transaction, the relay wakes at its commit.
    out_topic = kafka.topic("plans_out_%s" % tag)
    began = time.time()
    query(conn, "SELECT count(eventbox.send(%s, jsonb_build_object('n', g, 'pad', "
                "repeat('y', 150)), 'k' || (g %% 64))) FROM generate_series(1, %s) g",
          (out_topic, BACKLOG))
    writing_windows.append((began - 0.5, time.time() + 0.5))
    # The Kafka backlog, written by kafka-python before the subscription exists.
    in_topic = kafka.topic("plans_in_%s" % tag, partitions=PARTITIONS)
    # Every 20th record repeats an earlier record's id with another payload: the batches that
    # carry one run the conflicts check against the whole subscription's rows.
    kafka.produce(in_topic, [("%s-%d" % (tag, i - 10 if i % 20 == 19 else i), i % PARTITIONS,
                              "k%d" % (i % 64), {"n": i}, "T") for i in range(KAFKA_RECORDS)])
    fill_inbox(conn, BACKLOG, tag)
    query(conn, "SELECT eventbox.create_subscription(%s, ARRAY[%s], start_from => 'earliest')",
          ("plans_" + tag, in_topic))
    wait_until(lambda: query_one(conn, "SELECT count(*) FROM eventbox.outbox") == 0, 180,
               what="the relay drained %d outbox rows" % BACKLOG)
    stored = KAFKA_RECORDS - KAFKA_RECORDS // 20
    wait_until(lambda: query_one(conn, "SELECT count(*) FROM eventbox.offsets WHERE subscription "
                                       "= %s AND next_offset > 0", ("plans_" + tag,))
               == PARTITIONS and query_one(conn, "SELECT sum(next_offset) FROM eventbox.offsets "
                                                 "WHERE subscription = %s", ("plans_" + tag,))
               == KAFKA_RECORDS, 180,
               what="the ingest worker consumed %d records" % KAFKA_RECORDS)
    assert query_one(conn, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s",
                     ("plans_" + tag,)) == stored
    assert query_one(conn, "SELECT count(*) FROM eventbox.conflicts WHERE subscription = %s",
                     ("plans_" + tag,)) == KAFKA_RECORDS // 20
    assert query_one(conn, "SELECT count(*) FROM pg_stat_user_tables WHERE schemaname = "
                           "'eventbox' AND relname = ANY (%s) AND "
                           "(last_autoanalyze IS NOT NULL OR last_autovacuum IS NOT NULL)",
                     (list(SCANNED_TABLES),)) == 0


def test_relay_and_ingest_plans_are_bounded_by_their_batch(clusters, kafka):
    cluster = clusters("plans").start(conf=EXPLAIN_CONF, brokers=kafka.bootstrap)
    conn = cluster.connect()
    assert "auto_explain" in query_one(conn, "SHOW shared_preload_libraries")
    query(conn, "CREATE EXTENSION pg_eventbox")
    wait_until(lambda: query_one(conn, "SELECT count(*) FROM pg_stat_activity "
                                       "WHERE backend_type IN %s", (WORKERS,)) >= 2, 60,
               what="relay and ingest workers")
    # Never analyzed: the inbox also holds a big backlog of another subscription.
    check_workers(cluster, conn, kafka, "never", analyze_empty=False)
    # Analyzed while empty, then a backlog arrives.
    query(conn, "TRUNCATE eventbox.inbox; SELECT eventbox.truncate_outbox()")
    check_workers(cluster, conn, kafka, "empty", analyze_empty=True)
    time.sleep(1)   # the last statements' plans reach the log
    plans = worker_plans(cluster)
    by_worker = {w: [p for p in plans if p[0] == w] for w in WORKERS}
    # The workers' statements were all seen (so the checks below looked at something).
    relay_texts = " ".join(t for _, t, _ in by_worker["eventbox relay"])
    ingest_texts = " ".join(t for _, t, _ in by_worker["eventbox ingest"])
    # The claim's two branches (the rotated tables above the cursor, outbox_held) and the ack
    # rows its passes write.
    for needle in ("FROM eventbox._outbox_rows r WHERE r.id > $1",
                   "FROM eventbox.outbox_held h WHERE h.id > $1",
                   "INSERT INTO eventbox.outbox_acks_"):
        assert needle in relay_texts, "no relay plan with %r in the log" % needle
    for needle in ("INSERT INTO eventbox.inbox", "INSERT INTO eventbox.offsets",
                   "INSERT INTO eventbox.conflicts"):
        assert needle in ingest_texts, "no ingest plan with %r in the log" % needle
    bad = [p for w, t, plan in plans for p in problems(w, t, plan)]
    assert not bad, "%d plan nodes scan more than their batch:\n%s" % (
        len(bad), "\n".join(bad[:20]))
    big = max((rows_handled(plan) for _, _, plan in plans), default=0)
    assert big >= 100, "the workers' plans handled at most %d rows: no batch was checked" % big


# The handler workers over a backlog whose handled messages leave their todo index entries
# behind (autovacuum off: none is ever vacuumed away). A read that started at a lane's first
# offset, or a probe that landed at a lane's start, walked every message handled before in that
# lane: tens of thousands of entries by the end. With low-water marks (docs/design/handlers.md,
# "Low-water marks") a lane read starts past them and a lane probe is one descent.
HANDLER_RECORDS = 150000
HANDLER_PARTITIONS = 3
# Lane reads and lane probes: a heap page per row at most, plus the index descent and the
# entries of the one batch handled since the mark was set (each may cost a heap visit until a
# scan marks it dead), so up to 3 buffers per row; a probe (one row) gets the fixed part.
HANDLER_BUFFERS_PER_ROW = 3
HANDLER_FIXED_BUFFERS = 30
# The plain probe for lanes missing from eventbox.offsets (a worker's discovery walk, at most
# once a second when idle and after its marks are dropped every 10 s): over the lanes' positions
# (eventbox.inbox_positions), from which it walks what was handled since they last moved.
DISCOVERY_PROBE = "ORDER BY p.topic, p.\"partition\" LIMIT 1"
# A lane read (live or replay range).
READ_TEXT = "ORDER BY i.\"offset\" LIMIT $4"


def handler_problems(text, plan):
    found = []
    if "FROM eventbox.inbox" not in text or DISCOVERY_PROBE in text:
        return found
    rows = rows_handled(plan)
    limit = HANDLER_BUFFERS_PER_ROW * max(rows, 1) + HANDLER_FIXED_BUFFERS
    for n in nodes(plan):
        if "inbox" not in n.get("Relation Name", "") + n.get("Index Name", ""):
            continue
        buffers = n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0)
        if buffers > limit:
            found.append("%s on %s: %d buffers for %d rows (limit %d)\n    in: %s" % (
                n["Node Type"], n.get("Index Name") or n.get("Relation Name"), buffers, rows,
                limit, " ".join(text.split())[:160]))
    return found


def purge_and_vacuum(conn):
    """Statistics that favour the wrong index: a VACUUM after a purge left 10 rows of many
    pages (pg_class says 10 rows). The workers plan after it (a VACUUM's pg_class update also
    makes kept plans plan again): on such statistics the planner finds a scan of inbox_pkey
    (the subscription's rows, from the first) as cheap as one descent of the todo index."""
    query(conn, """
        INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset",
                                    status, processed_at)
        SELECT 'hplans', 'old-' || g, 'hplans_old', 0, g, 'processed', now()
          FROM generate_series(1, 30000) g;
        DELETE FROM eventbox.inbox WHERE "offset" > 10""")
    query(conn, "VACUUM eventbox.inbox")
    assert query_one(conn, "SELECT reltuples FROM pg_class "
                           "WHERE oid = 'eventbox.inbox'::regclass") == 10


# "never": never analyzed nor vacuumed, ordering 'partition'. "purged": purge_and_vacuum(),
# ordering 'key' (each lane read first looks for the lane's keys waiting for a retry).
@pytest.mark.parametrize("stats", ["never", "purged"])
def test_handler_worker_reads_are_bounded_by_their_batch(clusters, kafka, stats):
    cluster = clusters("hplans").start(conf=EXPLAIN_CONF, brokers=kafka.bootstrap)
    conn = cluster.connect()
    query(conn, "CREATE EXTENSION pg_eventbox")
    if stats == "purged":
        purge_and_vacuum(conn)
    query(conn, """
        CREATE ROLE hplans_role;
        CREATE TABLE public.hplans_sink (id text);
        GRANT INSERT ON public.hplans_sink TO hplans_role;
        CREATE FUNCTION public.hplans_on(m eventbox.inbox) RETURNS void LANGUAGE sql
            AS $$ INSERT INTO public.hplans_sink VALUES (m.message_id) $$;""")
    topic = kafka.topic("hplans", partitions=HANDLER_PARTITIONS)
    kafka.produce(topic, [("h-%d" % i, i % HANDLER_PARTITIONS, "k%d" % (i % 64), {"n": i}, "T")
                          for i in range(HANDLER_RECORDS)], timeout=300)
    ordering = "key" if stats == "purged" else "partition"
    query(conn, "BEGIN; SELECT eventbox.create_subscription('hplans', ARRAY[%s], "
                "ordering => %s); "
                "SELECT eventbox.register_handler('hplans', 'public.hplans_on(eventbox.inbox)'"
                "::regprocedure, run_as => 'hplans_role'); COMMIT", (topic, ordering))
    wait_until(lambda: query_one(conn, "SELECT count(*) FROM public.hplans_sink")
               == HANDLER_RECORDS, 600, 0.5,
               what="the handler workers handled %d messages" % HANDLER_RECORDS)
    assert query_one(conn, "SELECT count(*) FROM pg_stat_user_tables WHERE schemaname = "
                           "'eventbox' AND relname = 'inbox' AND "
                           "(last_autoanalyze IS NOT NULL OR last_autovacuum IS NOT NULL)") == 0
    time.sleep(1)   # the last statements' plans reach the log
    plans = worker_plans(cluster, ("eventbox handler",))
    texts = [t for _, t, _ in plans]
    reads = [t for t in texts if READ_TEXT in t]
    # A probe starts at the higher of the worker's mark ($4) and the lane's durable position.
    probes = [t for t in texts
              if "i.\"offset\" >= greatest($4, " in t and "ORDER BY i.\"offset\" LIMIT 1" in t]
    discovery = [t for t in texts if DISCOVERY_PROBE in t]
    assert reads and probes, "no lane read or lane probe of a handler worker in the log"
    if ordering == "key":
        assert any("ORDER BY i.next_attempt_at" in t for t in texts), "no waiting-keys read"
    bad = [p for _, t, plan in plans for p in handler_problems(t, plan)]
    print("handler workers: %d lane reads, %d lane probes, %d discovery probes; %d over the "
          "bound" % (len(reads), len(probes), len(discovery), len(bad)))
    # A few reads may start below where they could: the marks are dropped every 10 s (and a
    # lane's shared mark is raised only after the pass that handled its rows committed, so the
    # other worker can read the lane from an older one). A read or probe that walked what was
    # handled before would exceed the bound nearly every time, not in 1% of the calls.
    allowed = max(5, (len(reads) + len(probes)) // 100)
    assert len(bad) <= allowed, (
        "%d plan nodes of handler workers scan more than their batch (%d allowed):\n%s" % (
            len(bad), allowed, "\n".join(bad[:20])))
    # The discovery walk stays occasional (the lanes come from eventbox.offsets): about once a
    # second per worker while idle. It once took rows an ingest batch had just committed into a
    # lane the known walk had found empty, counted them as work in unknown lanes, and then ran
    # at every pass for seconds (288 discovery probes, 92 lane probes over the bound).
    assert len(discovery) <= 20, (len(discovery), len(probes))
    # A pass reads only as many rows of a lane as it still takes: the lane reads return about
    # what the workers handled (150,000 for 150,000 here; 1.5-2% more when a pass read up to its
    # whole size from each lane it looked at; sql/handlers_process.sql shows the difference).
    read_rows = sum(plan.get("Actual Rows", 0) for _, t, plan in plans if READ_TEXT in t)
    print("handler workers' lane reads returned %d rows for %d messages" % (
        read_rows, HANDLER_RECORDS))
    assert HANDLER_RECORDS <= read_rows <= HANDLER_RECORDS * 1.1, read_rows
