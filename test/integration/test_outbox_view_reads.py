"""The view eventbox.outbox while the settled position W is held back (docs/design/
outbox-rotation.md, "The view's shape"). A row waiting behind its key's retry holds W for up to
twice eventbox.relay_sweep_interval; meanwhile every row sent after it is above W, and so is the
ack row of every pass. The view's pending branch checks the rows above W against those ack rows:
row by row, each row read the ack rows above it until one held its id, and a count of the
pending rows (the operator's query, and the exact count of the pending gauge) grew with the
rows above W times the ack rows. Now the acknowledged ids that can matter are unnested once and
anti-joined with the rows.

Counted as the buffers `SELECT count(*) FROM eventbox.outbox WHERE status = 'pending'` reads,
with 40,000 rows above W, all but the first acknowledged in ack rows of 100 ids from 8
partitions, written in a transaction rolled back (the relay never sees them): 468,000-688,000
buffers before (12-17 a row; 1.2 s), about 122,000 now (3 a row, the = ANY test of the array
that held the id; 0.25 s)."""
import json

from eventbox_fixtures import connect, query, query_one, report

ROWS = 40000
TOPIC = "view_reads"


def buffers(c, sql):
    """Shared buffers (hit and read) the statement's plan touched, and its rows' first column."""
    plan = query_one(c, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql)
    if isinstance(plan, str):
        plan = json.loads(plan)
    top = plan[0]["Plan"]
    return top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)


def test_pending_rows_above_a_held_back_w_are_checked_against_each_ack_row_once(conn):
    c = connect(autocommit=False)
    try:
        query(c, "SELECT count(eventbox.send(%s, jsonb_build_object('i', g))) "
                 "FROM generate_series(1, %s) g", (TOPIC, ROWS))
        lo, tables = query(c, "SELECT min(id), array_agg(DISTINCT n) "
                              "FROM eventbox._outbox_rows WHERE topic = %s", (TOPIC,))[0]
        assert len(tables) == 1, tables  # a transaction writes into the table it first read
        # Every row but the first acknowledged, ack rows of ~100 ids, 8 partitions interleaved
        # (delivery reports come per partition).
        acks = "eventbox.outbox_acks_%d" % tables[0]
        query(c, "INSERT INTO " + acks + " (acked_at, max_id, ids, partitions, offsets) "
                 "SELECT now(), max(id), array_agg(id ORDER BY id), array_agg(mod(id, 8)::int), "
                 "array_agg(id) FROM eventbox._outbox_rows "
                 "WHERE topic = %s AND id > %s GROUP BY (id - %s) / 800, mod(id, 8)",
              (TOPIC, lo, lo))
        pending = query(c, "SELECT id FROM eventbox.outbox WHERE status = 'pending' "
                           "AND topic = %s", (TOPIC,))
        counted = buffers(c, "SELECT count(*) FROM eventbox.outbox WHERE status = 'pending'")
        shown = query_one(c, "SELECT count(*) FROM eventbox.outbox "
                             "WHERE topic = %s AND status = 'pending'", (TOPIC,))
    finally:
        c.rollback()
        c.close()
    report("test_pending_rows_above_a_held_back_w_are_checked_against_each_ack_row_once",
           rows=ROWS, count_buffers=counted)
    assert [r[0] for r in pending] == [lo], "only the unacknowledged row is pending"
    assert shown == 1
    assert counted <= ROWS * 5, (
        "the pending count read %d buffers for %d rows above W: checked row by row" % (
            counted, ROWS))


def test_a_monitoring_role_reads_every_status_of_the_outbox(conn):
    """The role of docs/guide/security.md ("A role that monitors") has SELECT on the view and
    nothing else. The view's branch of sent rows called a function of the extension's for the
    retention, which grants nothing to PUBLIC: every query of the view that kept that branch (no
    status filter, outbox_stats) failed with 42501 for such a role. It reads the setting with
    current_setting() now."""
    c = connect(autocommit=False)
    try:
        query(c, "CREATE ROLE view_reads_monitor; "
                 "GRANT USAGE ON SCHEMA eventbox TO view_reads_monitor; "
                 "GRANT SELECT ON eventbox.outbox, eventbox.outbox_stats TO view_reads_monitor; "
                 "SET ROLE view_reads_monitor")
        every = query_one(c, "SELECT count(*) FROM eventbox.outbox")
        sent = query_one(c, "SELECT count(*) FROM eventbox.outbox WHERE status = 'sent'")
        stats = query(c, "SELECT status, messages FROM eventbox.outbox_stats")
    finally:
        c.rollback()
        c.close()
    assert every >= sent >= 0
    assert all(messages > 0 for _, messages in stats)
