"""send() keeps what it works out about the outbox's indexes from one call to the next (in the
backend, across transactions), and takes in a change to them through relcache invalidations.
CREATE INDEX CONCURRENTLY changes them while sessions keep writing: an index it builds must
end up with every row, also those a session that had sent before inserted during and after the
build. Checked with amcheck (heapallindexed) and by comparing an index scan with a sequential
scan in one snapshot."""

import threading
import time

from eventbox_fixtures import cancel_unsent, connect, query, query_one

TOPIC = "send-cic-test"


def _writer(stop, errors, counts, k):
    c = connect(autocommit=False)
    try:
        with c.cursor() as cur:
            deadline = time.monotonic() + 120
            while not stop.is_set() and time.monotonic() < deadline:
                cur.execute("SELECT count(eventbox.send(%s, jsonb_build_object('n', g))) "
                            "FROM generate_series(1, 20) g", (TOPIC,))
                c.commit()
                counts[k] += 20
    except Exception as e:  # reported by the test
        errors.append(repr(e))
    finally:
        c.close()


def test_an_index_built_concurrently_gets_every_row_send_writes(conn, settings):
    # Rows stay in the outbox (relay idle) so that the check covers all of them.
    settings.set("eventbox.brokers", "")
    query(conn, "CREATE EXTENSION IF NOT EXISTS amcheck")
    stop, errors, counts = threading.Event(), [], [0, 0]
    writers = [threading.Thread(target=_writer, args=(stop, errors, counts, k)) for k in range(2)]
    try:
        for w in writers:
            w.start()
        # Both sessions have sent (and kept the outbox's shape) before the index appears.
        deadline = time.monotonic() + 60
        while min(counts) < 200 and time.monotonic() < deadline and not errors:
            time.sleep(0.05)
        assert min(counts) >= 200 and not errors, (counts, errors)
        # The rows are in the open rotated table (docs/design/outbox-rotation.md): its indexes
        # are the ones send() keeps.
        rows = query_one(conn, "SELECT format('eventbox.outbox_rows_%s', "
                               "eventbox._outbox_open_table())")
        query(conn, "CREATE INDEX CONCURRENTLY outbox_cic_test ON %s (topic, id) "
                    "WHERE topic <> ''" % rows)
        during = sum(counts)
        deadline = time.monotonic() + 60
        while sum(counts) < during + 400 and time.monotonic() < deadline and not errors:
            time.sleep(0.05)
        assert sum(counts) >= during + 400, (during, counts)
    finally:
        stop.set()
        for w in writers:
            w.join(150)
    try:
        assert not errors, errors
        valid = query_one(conn, "SELECT indisvalid AND indisready FROM pg_index "
                                "WHERE indexrelid = 'eventbox.outbox_cic_test'::regclass")
        assert valid
        # Raises when a row the table holds has no entry in the index.
        query(conn, "SELECT bt_index_check('eventbox.outbox_cic_test'::regclass, true)")
        c = connect(autocommit=False)
        try:
            with c.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cur.execute("SET LOCAL enable_seqscan = off")
                cur.execute("SET LOCAL enable_bitmapscan = off")
                cur.execute("EXPLAIN SELECT count(*) FROM " + rows + " WHERE topic = %s",
                            (TOPIC,))
                plan = "\n".join(r[0] for r in cur.fetchall())
                assert "outbox_cic_test" in plan, plan
                cur.execute("SELECT count(*) FROM " + rows + " WHERE topic = %s", (TOPIC,))
                by_index = cur.fetchone()[0]
                cur.execute("SET LOCAL enable_seqscan = on")
                cur.execute("SET LOCAL enable_indexscan = off")
                cur.execute("SET LOCAL enable_indexonlyscan = off")
                cur.execute("SELECT count(*) FROM " + rows + " WHERE topic = %s", (TOPIC,))
                by_heap = cur.fetchone()[0]
            c.rollback()
        finally:
            c.close()
        assert by_heap == sum(counts), (by_heap, counts)
        assert by_index == by_heap, (by_index, by_heap)
    finally:
        query(conn, "DROP INDEX IF EXISTS eventbox.outbox_cic_test")
        cancel_unsent(conn, TOPIC)
