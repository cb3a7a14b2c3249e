"""Gaps re-read cheaply (docs/design/relay.md, "Late commits"). Two writers whose transactions
overlap draw interleaved outbox ids: whenever one commits first, the relay's claim skips the
other's ids, and re-reads that gap in every pass until its writer ends. The rows it re-reads lie
below ids already acknowledged, so each must be checked against the ack rows. Checked row by row,
every re-read row looked up every ack row above it, and with two sessions sending overlapping
transactions of 256 rows the relay spent half its CPU there; now the acknowledged ids above the
read's lowest id are hashed once per statement.

Counted as the scans of the three ack tables (each check, and each hash built, is one per
table): with two writers sending 128 rows per transaction side by side for 3 s, 31,932 scans
for 20,096 messages when rows were checked one by one, 2,751 for 28,160 now. Every message once,
each writer's rows in order."""
import json
import threading
import time

from eventbox_fixtures import connect, query, query_one, report, wait_for_ids
from relay_sending import relay_stat, warm_relay

SECONDS = 3.0
PER_TX = 128
WRITERS = 2


def ack_scans(c):
    """The three ack tables' scans, the relay's counted in."""
    return relay_stat(c, "SELECT sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)) "
                         "FROM pg_stat_user_tables WHERE schemaname = 'eventbox' "
                         "AND relname LIKE 'outbox\\_acks\\_%'")


class Writer(threading.Thread):
    """Sends PER_TX rows per transaction, key "w<n>", payload {"seq": i}, for SECONDS."""

    def __init__(self, topic, n):
        super().__init__(daemon=True)
        self.topic, self.n, self.ids, self.error = topic, n, [], None

    def run(self):
        try:
            c = connect(autocommit=False)
            try:
                deadline = time.monotonic() + SECONDS
                while time.monotonic() < deadline:
                    batch = [str(query_one(
                        c, "SELECT eventbox.send(%s, jsonb_build_object('seq', %s::int), "
                           "key => %s)", (self.topic, len(self.ids) + i, "w%d" % self.n)))
                        for i in range(PER_TX)]
                    c.commit()
                    self.ids.extend(batch)
            finally:
                c.close()
        except BaseException as e:  # reported by the test
            self.error = e


def test_gaps_of_overlapping_writers_are_re_read_without_a_probe_per_row(conn, new_topic):
    topic = new_topic(1)
    warm_relay(conn, topic)
    c = connect(autocommit=True)
    try:
        before = ack_scans(c)
        writers = [Writer(topic, n) for n in range(WRITERS)]
        for w in writers:
            w.start()
        for w in writers:
            w.join(60)
            assert not w.is_alive()
            if w.error is not None:
                raise w.error
        ids = [i for w in writers for i in w.ids]
        recs = wait_for_ids(topic, ids, timeout=120)
        scans = ack_scans(c) - before
    finally:
        c.close()
    recs = [r for r in recs if r.message_id in set(ids)]
    assert sorted(r.message_id for r in recs) == sorted(ids), "lost or duplicated messages"
    for w in writers:
        seqs = [json.loads(r.value)["seq"] for r in recs if r.key == b"w%d" % w.n]
        assert seqs == sorted(seqs), "writer %d's rows out of order" % w.n
    report("test_gaps_of_overlapping_writers_are_re_read_without_a_probe_per_row",
           messages=len(ids), ack_table_scans=scans)
    assert scans < len(ids) / 4, "%d ack table scans for %d messages" % (scans, len(ids))


def test_the_acknowledged_ids_stay_hashed_however_many_ack_rows_are_kept(conn):
    """The hash is the planner's choice, made on its estimate of the ids: estimated from the ack
    tables, which keep their rows as long as eventbox.outbox_retention, the check became a scan
    of every id per row from about 300k ack rows on. eventbox._acked_ids() declares its ROWS.
    Checked on 600k ack rows inserted in a transaction rolled back (ids far above any row's, so
    nothing the relay reads meanwhile matches them): the inline subquery is no longer hashed,
    the function still is."""
    c = connect(autocommit=False)
    try:
        query(c, "INSERT INTO eventbox.outbox_acks_0 (acked_at, max_id, ids, partitions, offsets) "
                 "SELECT now(), g, ARRAY[g], ARRAY[0], ARRAY[0] "
                 "FROM generate_series(9000000000000000000, 9000000000000599999) g")

        def hashed(subquery):
            plan = "\n".join(r[0] for r in query(
                c, "EXPLAIN SELECT r.id FROM eventbox._outbox_rows r "
                   "WHERE r.id NOT IN (%s)" % subquery))
            return "hashed SubPlan" in plan

        inline = hashed("SELECT i FROM eventbox._outbox_acks a, unnest(a.ids) AS i "
                        "WHERE a.max_id >= 0 AND i >= 0")
        function = hashed("SELECT eventbox._acked_ids(0)")
    finally:
        c.rollback()
        c.close()
    report("test_the_acknowledged_ids_stay_hashed_however_many_ack_rows_are_kept",
           inline_hashed=inline, function_hashed=function)
    assert not inline, "600k ack rows did not make the inline subquery unhashed: no check"
    assert function
