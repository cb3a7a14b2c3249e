"""A processed mark that touches no index (docs/design/handlers.md, "A processed mark that
touches no index"; issue 31): no index of eventbox.inbox mentions a column a handler's outcome
changes, and the table leaves room on each page, so marking messages processed is a HOT update
(pg_stat_user_tables.n_tup_hot_upd). A functional property of the schema, not a timing: a mark
that does not find room on its page is not HOT, so the share is asserted at 90%, not 100%."""

import uuid

from eventbox_fixtures import connect, query, query_one, report, wait_until
from eventbox_handler_lib import Msg, produce, wait_settled

DDL = """
CREATE TABLE {s}.ledger (message_id text);
CREATE FUNCTION {s}.handle(m eventbox.inbox) RETURNS void LANGUAGE sql AS $$
  INSERT INTO {s}.ledger VALUES (m.message_id);
$$;
CREATE FUNCTION {s}.handle_all(ms eventbox.inbox[]) RETURNS void LANGUAGE sql AS $$
  INSERT INTO {s}.ledger SELECT m.message_id FROM unnest(ms) m;
$$;
"""

N = 3000


def updates(c):
    """(n_tup_upd, n_tup_hot_upd) of eventbox.inbox, as the statistics show them now."""
    query(c, "SELECT pg_stat_clear_snapshot()")
    return tuple(query(c, "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                          "WHERE relid = 'eventbox.inbox'::regclass")[0])


def hot_share(case, batch):
    hc = case(partitions=2)
    hc.setup(DDL, handler="{s}.handle_all(eventbox.inbox[])" if batch else "{s}.handle(eventbox.inbox)",
             batch=batch)
    c = connect()
    try:
        before = updates(c)
        pad = "x" * 200
        produce(hc.topic, [Msg(str(uuid.uuid4()), i % 2, "k%d" % (i % 50), {"i": i, "pad": pad}, "T")
                           for i in range(N)])
        assert wait_settled(hc.sub, N, timeout=180) == {"processed": N}
        assert query_one(c, hc.q("SELECT count(DISTINCT message_id) FROM {s}.ledger")) == N
        # Each message's mark is one update (the workers report their statistics within a
        # second or so of their transactions).
        wait_until(lambda: updates(c)[0] - before[0] >= N or None, 30, 0.2,
                   "the marks counted in pg_stat_user_tables")
        after = updates(c)
        upd, hot = after[0] - before[0], after[1] - before[1]
        report("hot_marks", batch=batch, updates=upd, hot=hot)
        assert hot >= 0.9 * upd, (hot, upd)
        # The index of the rows still to handle holds every row; the lanes' positions, below
        # which none waits, reached the end of both partitions.
        ends = query(c, "SELECT p.\"partition\", p.position, o.next_offset "
                        "FROM eventbox.inbox_positions p JOIN eventbox.offsets o "
                        "USING (subscription, topic, \"partition\") "
                        "WHERE p.subscription = %s AND NOT p.replay ORDER BY 1", (hc.sub,))
        assert ends and all(position == next_offset for _, position, next_offset in ends), ends
    finally:
        c.close()


def test_processed_marks_are_hot_updates(case):
    hot_share(case, batch=False)


def test_batch_handler_marks_are_hot_updates(case):
    hot_share(case, batch=True)


def test_no_inbox_index_mentions_what_an_outcome_changes():
    c = connect()
    try:
        rows = query(c, """
            SELECT i.indexrelid::regclass::text, a.attname
              FROM pg_index i, pg_attribute a
             WHERE i.indrelid = 'eventbox.inbox'::regclass AND a.attrelid = i.indrelid
               AND a.attname IN ('status', 'attempts', 'processed_at', 'last_error')
               AND (a.attnum = ANY (i.indkey::int2[])
                    OR pg_get_expr(i.indexprs, i.indrelid) ~ ('\\m' || a.attname || '\\M')
                    OR pg_get_expr(i.indpred, i.indrelid) ~ ('\\m' || a.attname || '\\M'))""")
        assert rows == [], rows
        assert "fillfactor=50" in query_one(c, "SELECT reloptions FROM pg_class "
                                               "WHERE oid = 'eventbox.inbox'::regclass")
    finally:
        c.close()
