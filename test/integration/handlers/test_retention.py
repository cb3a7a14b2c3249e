"""Inbox retention (eventbox.inbox_retention, eventbox.dead_retention): the supervisor purges
processed and ignored rows older than the window, keeps dead ones until dead_retention, counts
what it purged in eventbox.metrics; a purged message that arrives again is stored and handled
again (the window is the deduplication horizon), and eventbox.replay() says how many records it
will store again.

Rows are aged with an UPDATE of received_at (and processed_at) instead of waiting: a message
handled two hours ago was received at least as long ago."""

import re
import uuid

from eventbox_fixtures import connect, query, query_one, report, wait_until
from eventbox_handler_lib import Msg, produce, wait_settled

DDL = """
CREATE TABLE {s}.ledger (message_id text, at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION {s}.handle(m eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF (m.payload->>'fail')::boolean THEN RAISE EXCEPTION 'poison'; END IF;
  INSERT INTO {s}.ledger (message_id) VALUES (m.message_id);
END $$;
"""


def purged_total(c):
    return query_one(c, "SELECT value FROM eventbox.metrics "
                        "WHERE name = 'eventbox_retention_purged_rows_total' "
                        "AND labels->>'table' = 'inbox'")


def test_retention_purges_processed_keeps_dead_and_is_the_dedupe_horizon(case, settings):
    settings.set("eventbox.inbox_retention", "1h")
    hc = case(partitions=2)
    hc.setup(DDL, event_type="T", max_attempts=1)
    ok = [Msg(str(uuid.uuid4()), i % 2, None, {"i": i}, "T") for i in range(300)]
    poison = [Msg(str(uuid.uuid4()), i % 2, None, {"fail": True}, "T") for i in range(10)]
    other = [Msg(str(uuid.uuid4()), i % 2, None, {"i": i}, "U") for i in range(10)]
    produce(hc.topic, ok + poison + other)
    settled = wait_settled(hc.sub, 320, timeout=120)
    assert settled == {"processed": 300, "dead": 10, "ignored": 10}, settled

    c = connect()
    before = purged_total(c)
    aged = ok[:200] + other
    query(c, "UPDATE eventbox.inbox SET received_at = now() - interval '3 hours', "
             "processed_at = now() - interval '2 hours' "
             "WHERE subscription = %s AND message_id = ANY(%s)", (hc.sub, [m.mid for m in aged]))
    # Received as long ago, handled just now (a backlog, a late retry): kept for the window.
    late = ok[200:]
    query(c, "UPDATE eventbox.inbox SET received_at = now() - interval '3 hours' "
             "WHERE subscription = %s AND message_id = ANY(%s)", (hc.sub, [m.mid for m in late]))
    query(c, "UPDATE eventbox.inbox SET received_at = now() - interval '2 hours' "
             "WHERE subscription = %s AND status = 'dead'", (hc.sub,))

    def status():
        return dict(query(c, "SELECT status, count(*) FROM eventbox.inbox WHERE subscription = %s "
                             "GROUP BY status", (hc.sub,)))
    wait_until(lambda: status() == {"processed": 100, "dead": 10}, 30,
               what="the aged processed and ignored rows to be purged")
    # Dead rows wait for dead_retention (default 0: until an operator acts).
    assert query_one(c, "SELECT current_setting('eventbox.dead_retention')") == "0"
    wait_until(lambda: purged_total(c) - before == 210, 10, what="purged counter +210")

    settings.set("eventbox.dead_retention", "1h")
    wait_until(lambda: status() == {"processed": 100}, 30, what="dead rows purged")
    wait_until(lambda: purged_total(c) - before == 220, 10, what="purged counter +220")

    # A purged message arriving again is stored and handled again; a kept one is a duplicate.
    again = Msg(ok[0].mid, 0, None, {"i": 0}, "T")
    kept = Msg(ok[250].mid, 0, None, {"i": 250}, "T")
    produce(hc.topic, [again, kept])
    wait_until(lambda: query_one(c, hc.q("SELECT count(*) FROM {s}.ledger WHERE message_id = %s"),
                                 (again.mid,)) == 2, 60, what="the purged message handled again")
    wait_until(lambda: status() == {"processed": 101}, 30, what="the copy stored again")
    assert query_one(c, hc.q("SELECT count(*) FROM {s}.ledger WHERE message_id = %s"),
                     (kept.mid,)) == 1

    # replay() from offset 0 of partition 1 tells how many records it will store again: the
    # partition's purged ones (nothing was produced to it since).
    purged_p1 = sum(1 for m in aged + poison if m.partition == 1)
    c.notices.clear()
    query(c, "SELECT eventbox.replay(%s, %s, 1, 0)", (hc.sub, hc.topic))
    notice = "".join(c.notices)
    m = re.search(r"will store up to (\d+) record\(s\) again", notice)
    assert m, notice
    assert int(m.group(1)) == purged_p1, notice
    # Nothing to say when every record of the range is still there.
    c.notices.clear()
    first_kept = query_one(c, "SELECT min(\"offset\") FROM eventbox.inbox WHERE subscription = %s "
                              "AND \"partition\" = 1 AND message_id = ANY(%s)",
                           (hc.sub, [x.mid for x in ok[200:]]))
    next_offset = query_one(c, "SELECT next_offset FROM eventbox.offsets WHERE subscription = %s "
                               "AND \"partition\" = 1", (hc.sub,))
    if first_kept is not None and next_offset is not None:
        query(c, "SELECT eventbox.replay(%s, %s, 1, %s)", (hc.sub, hc.topic, next_offset))
    assert not any("store up to" in n for n in c.notices), c.notices
    report("retention", purged=220, stored_again=1, replay_notice=purged_p1)
    c.close()


def test_purge_plan_is_bounded_on_a_large_unanalyzed_inbox(settings):
    """The purge walks inbox_received_idx in received_at order from its cursor, testing status
    and processed_at on the row (no index mentions them, so that a processed mark is a HOT
    update): a batch reads about its own rows, however many rows are younger than the window (on
    a table never analyzed: the planner settings of the workers, applied by exec_kept, decide
    the plan)."""
    settings.set("eventbox.inbox_retention", "0")  # the supervisor leaves these rows alone
    c = connect()
    sub = "ret_plan_%s" % uuid.uuid4().hex[:6]
    try:
        query(c, "BEGIN; SELECT eventbox.create_subscription(%s, ARRAY['ret_plan_topic']); "
                 "SELECT eventbox.alter_subscription(%s, enabled => false); COMMIT", (sub, sub))
        query(c, "INSERT INTO eventbox.inbox (subscription, message_id, topic, \"partition\", "
                 "\"offset\", status, received_at, processed_at) "
                 "SELECT %s, g::text, 'ret_plan_topic', 0, g, 'processed', "
                 "now() - (400001 - g) * interval '1 second', "
                 "now() - (400001 - g) * interval '1 second' "
                 "FROM generate_series(1, 400000) g", (sub,))
        with c.cursor() as cur:
            cur.execute("BEGIN")
            for s in ("enable_seqscan", "enable_sort", "enable_hashjoin", "enable_mergejoin"):
                cur.execute("SET LOCAL %s = off" % s)
            cur.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                "DELETE FROM eventbox.inbox WHERE ctid = ANY (ARRAY("
                "SELECT ctid FROM eventbox.inbox "
                "WHERE received_at >= '-infinity' "
                "AND received_at < now() - 100000 * interval '1 second' "
                "AND status IN ('processed', 'ignored') "
                "AND processed_at < now() - 100000 * interval '1 second' "
                "ORDER BY received_at LIMIT 1000 FOR UPDATE SKIP LOCKED)) RETURNING received_at")
            plan = cur.fetchone()[0][0]
            cur.execute("ROLLBACK")
        top = plan["Plan"]
        buffers = top["Shared Hit Blocks"] + top.get("Shared Read Blocks", 0)
        pages = query_one(c, "SELECT pg_relation_size('eventbox.inbox') / 8192")
        text = repr(plan)
        report("retention_plan", rows=top["Actual Rows"], buffers=buffers, table_pages=pages)
        assert top["Actual Rows"] == 1000
        assert "'Index Name': 'inbox_received_idx'" in text and "Tid Scan" in text, plan
        # Each of the 1000 rows is touched a few times (index entry, lock, TID fetch, delete,
        # and the inbox_released trigger's condition, which PostgreSQL evaluates on the row
        # read again): bounded by the batch, far below one pass over the 400k-row table.
        assert buffers <= 6 * 1000 and buffers < pages, (buffers, pages)
    finally:
        query(c, "SELECT eventbox.drop_subscription(%s)", (sub,))
        c.close()
