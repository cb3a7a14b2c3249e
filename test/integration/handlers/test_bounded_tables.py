"""Side tables stay bounded (issue 15): what the workers keep besides the inbox is purged or
forgotten, so that nothing grows for as long as the server runs.

- failed outbox rows (the relay gave up on them) are purged after eventbox.dead_retention, like
  dead inbox rows (0 = kept until an operator acts), whatever the relay's settled position is;
  before, nothing ever deleted them;
- sent outbox rows kept under an earlier eventbox.outbox_retention are purged when it is set to
  0 (hidden by the view at once, gone from the disk when their rotated table is truncated);
  before, the relay purged only while it was above 0, and they stayed forever;
- the supervisor's last purge batches reach the statistics (what autovacuum goes by) also when
  retention is switched off right after them; before, they waited for a purge that never came;
- a dropped subscription leaves nothing behind in the side tables (offsets, handler claims,
  ingest errors, handlers, inbox).

Rows are inserted directly with old timestamps instead of waiting for them to age."""

import time
import uuid

from eventbox_fixtures import cancel_unsent, connect, query, query_one, settled_below, wait_until
from eventbox_handler_lib import Msg, produce, wait_settled


def purged(conn, table):
    return query_one(conn, "SELECT value FROM eventbox.metrics "
                           "WHERE name = 'eventbox_retention_purged_rows_total' "
                           "AND labels->>'table' = %s", (table,))


def outbox_rows(conn, topic, status):
    return query_one(conn, "SELECT count(*) FROM eventbox.outbox WHERE topic = %s AND status = %s",
                     (topic, status))


def insert_outbox(conn, topic, status, n, age):
    query(conn, """
        INSERT INTO eventbox.outbox (message_id, topic, payload, status, attempts, created_at,
                                     sent_at, last_error)
        SELECT gen_random_uuid(), %s, convert_to('{"n": ' || g || '}', 'UTF8'), %s, 3,
               now() - %s::interval,
               CASE WHEN %s = 'sent' THEN now() - %s::interval END,
               CASE WHEN %s = 'failed' THEN 'Broker: Message size too large' END
          FROM generate_series(1, %s) g""", (topic, status, age, status, age, status, n))


def test_failed_outbox_rows_are_purged_after_dead_retention(conn, settings):
    """Given-up rows live in eventbox.outbox_held: they are purged whatever the relay's settled
    position W is (docs/design/outbox-rotation.md). Here W stays below them for the whole test:
    a transaction that drew an outbox id before them is left open, and the relay keeps its gap
    (W never passes a kept gap). Their copies in the rotated tables must not come back as
    pending once purged, also after W passed them."""
    topic = "bounded-failed-" + uuid.uuid4().hex[:8]
    writer = connect(autocommit=False)
    try:
        query(writer, "SELECT eventbox.send(%s, '{}'::jsonb)", ("bounded-writer-" + topic,))
        insert_outbox(conn, topic, "failed", 30, "2 hours")
        insert_outbox(conn, topic, "failed", 5, "0 seconds")
        first = query_one(conn, "SELECT min(id) FROM eventbox.outbox WHERE topic = %s", (topic,))
        last = query_one(conn, "SELECT max(id) FROM eventbox.outbox WHERE topic = %s", (topic,))
        before = purged(conn, "outbox")
        # Default 0: kept until an operator acts. The relay looks once a second; give it three.
        assert query_one(conn, "SELECT current_setting('eventbox.dead_retention')") == "0"
        time.sleep(3)
        assert outbox_rows(conn, topic, "failed") == 35

        settings.set("eventbox.dead_retention", "1h")
        wait_until(lambda: outbox_rows(conn, topic, "failed") == 5, 30,
                   what="failed rows older than eventbox.dead_retention purged")
        wait_until(lambda: purged(conn, "outbox") - before >= 30, 10,
                   what="eventbox_retention_purged_rows_total{table=outbox} +30")
        assert settled_below(conn) < first, "W passed the rows: the purge was not tested above it"
        assert query_one(conn, "SELECT count(*) FROM eventbox.outbox_held WHERE topic = %s",
                         (topic,)) == 5
        assert outbox_rows(conn, topic, "pending") == 0
        # The recent ones stay until they are as old.
        time.sleep(2)
        assert outbox_rows(conn, topic, "failed") == 5
        # The writer ends, W passes every row: the purged ones are still settled.
        writer.rollback()
        wait_until(lambda: settled_below(conn) > last, 30, what="W past the rows")
        assert outbox_rows(conn, topic, "pending") == 0
        assert outbox_rows(conn, topic, "failed") == 5
    finally:
        writer.rollback()
        writer.close()
        settings.restore()
        cancel_unsent(conn, topic)


def stored_rows(conn, topic):
    """Rows of `topic` still stored in the rotated tables, whatever the view shows."""
    return query_one(conn, "SELECT count(*) FROM eventbox._outbox_rows WHERE topic = %s",
                     (topic,))


def test_sent_rows_of_an_earlier_retention_are_purged_when_it_is_zero(conn, settings):
    """Sent rows kept under an earlier eventbox.outbox_retention leave the view at once when it
    is 0, and leave the disk with their table: it is closed at the next rotation and truncated
    once settled, which counts them in eventbox_retention_purged_rows_total."""
    topic = "bounded-sent-" + uuid.uuid4().hex[:8]
    try:
        # As left by eventbox.outbox_retention = 1h, now back to its default 0.
        assert query_one(conn, "SELECT current_setting('eventbox.outbox_retention')") == "0"
        settings.set("eventbox.outbox_rotation_interval", "1s")
        insert_outbox(conn, topic, "sent", 2500, "10 minutes")
        insert_outbox(conn, topic, "pending", 0, "0 seconds")
        before = purged(conn, "outbox")
        assert stored_rows(conn, topic) == 2500
        # A row the relay delivers after them: its position passes theirs.
        query(conn, "SELECT eventbox.send(%s, '{}'::jsonb)", (topic,))
        wait_until(lambda: outbox_rows(conn, topic, "sent") == 0, 30,
                   what="sent rows purged with eventbox.outbox_retention = 0 (left: %d)"
                   % outbox_rows(conn, topic, "sent"))
        wait_until(lambda: stored_rows(conn, topic) == 0, 60,
                   what="the sent rows' table truncated (left: %d)" % stored_rows(conn, topic))
        wait_until(lambda: purged(conn, "outbox") - before >= 2500, 10,
                   what="eventbox_retention_purged_rows_total{table=outbox} +2500")
    finally:
        settings.restore()


def test_purge_statistics_reach_autovacuum_when_retention_is_switched_off(conn, settings):
    """5000 aged rows: five batches 10 ms apart, of which the statistics system gets the first at
    once and the others only at the supervisor's next flush (at most one a second). Retention is
    switched off as soon as the last batch is counted."""
    sub = "bounded_stats_" + uuid.uuid4().hex[:8]
    c = connect()
    try:
        query(c, "SELECT eventbox.create_subscription(%s, ARRAY[%s])", (sub, sub))
        query(c, "SELECT eventbox.alter_subscription(%s, enabled => false)", (sub,))
        query(c, """
            INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset",
                                        payload, status, received_at, processed_at)
            SELECT %s, 'm' || g, %s, 0, g, '{}', 'processed', now() - interval '2 days',
                   now() - interval '2 days'
              FROM generate_series(1, 5000) g""", (sub, sub))
        query(c, "SELECT pg_stat_force_next_flush()")
        query(c, "SELECT 1")

        def deletes():
            query(c, "SELECT pg_stat_clear_snapshot()")
            return query_one(c, "SELECT n_tup_del FROM pg_stat_user_tables "
                                "WHERE relid = 'eventbox.inbox'::regclass")
        deleted0 = deletes()
        before = purged(c, "inbox")
        settings.set("eventbox.inbox_retention", "1d")
        wait_until(lambda: purged(c, "inbox") - before >= 5000, 30, interval=0.01,
                   what="the aged rows purged")
        settings.set("eventbox.inbox_retention", "0")
        wait_until(lambda: deletes() - deleted0 >= 5000, 15,
                   what="the purge's 5000 deletes in pg_stat_user_tables.n_tup_del (at %d)"
                   % (deletes() - deleted0))
    finally:
        settings.restore()
        query(c, "SELECT eventbox.drop_subscription(%s)", (sub,))
        c.close()


SIDE_TABLES = ("inbox", "offsets", "handler_claims", "ingest_errors", "handlers")


def leftovers(conn, sub):
    return {t: query_one(conn, "SELECT count(*) FROM eventbox.%s WHERE subscription = %%s" % t,
                         (sub,)) for t in SIDE_TABLES}


def test_dropped_subscription_leaves_no_rows_in_side_tables(case):
    """A subscription with a handler that processed messages (offsets, handler claims) and whose
    next batch cannot be stored (a trigger refuses it: an ingest error), dropped: every side
    table forgets it."""
    hc = case(partitions=2)
    hc.setup("""
        CREATE FUNCTION {s}.handle(m eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
        BEGIN NULL; END $$;""", event_type="T")
    produce(hc.topic, [Msg(str(uuid.uuid4()), i % 2, None, {"i": i}, "T") for i in range(20)])
    assert wait_settled(hc.sub, 20, timeout=120) == {"processed": 20}
    c = connect()
    trigger = "bounded_refuse_%s" % uuid.uuid4().hex[:8]
    try:
        query(c, hc.q("""
            CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'test refuses rows of %', NEW.subscription; END $$"""))
        query(c, "CREATE TRIGGER %s BEFORE INSERT ON eventbox.inbox FOR EACH ROW "
                 "WHEN (NEW.subscription = %%s) EXECUTE FUNCTION %s.refuse()"
              % (trigger, hc.schema), (hc.sub,))
        produce(hc.topic, [Msg(str(uuid.uuid4()), 0, None, {"i": 20}, "T")])
        wait_until(lambda: leftovers(c, hc.sub)["ingest_errors"] > 0, 60,
                   what="an ingest error for the refused batch")
        have = leftovers(c, hc.sub)
        assert all(have[t] > 0 for t in SIDE_TABLES), have
        query(c, "SELECT eventbox.drop_subscription(%s)", (hc.sub,))
        wait_until(lambda: not any(leftovers(c, hc.sub).values()), 30,
                   what="no row of the dropped subscription left (%r)" % leftovers(c, hc.sub))
    finally:
        query(c, "DROP TRIGGER IF EXISTS %s ON eventbox.inbox" % trigger)
        c.close()
