"""Settings the relay picks up on reload: eventbox.brokers (switch, empty) and
eventbox.outbox_retention. Every ALTER SYSTEM is reset by the `settings`
fixture, which waits until new sessions see the original value again."""

import re
import time

import pytest

from devbroker import DevBroker
import devbroker
from eventbox_fixtures import (env, pending_count, query, query_one, read_topic,
                               wait_for_ids, wait_outbox_drained, wait_until)


# 7 ---------------------------------------------------------------------------

def test_reload_switches_to_another_broker(conn, settings, log_watch, new_topic):
    main_bootstrap = env("EVENTBOX_BOOTSTRAP")
    proc, bootstrap2, host2, port2 = devbroker.start(env("EVENTBOX_DEVBROKER"), partitions=4)
    try:
        ctl2 = DevBroker(host2, port2)
        topic = new_topic(4)            # on the environment's broker
        ctl2.create_topic(topic, 4)     # and on the second one

        settings.set("eventbox.brokers", bootstrap2)
        log_watch.wait_for(r"eventbox relay publishing to %s\b" % re.escape(bootstrap2), 30)
        on_second = [r[0] for r in query(conn, """
            SELECT eventbox.send(%s, jsonb_build_object('n', g), key => 'k' || g)
              FROM generate_series(1, 20) AS g""", (topic,))]
        wait_outbox_drained(topic, timeout=60)
        recs = wait_for_ids(topic, on_second, bootstrap=bootstrap2)
        assert sorted(r.message_id for r in recs) == sorted(on_second)
        assert read_topic(topic) == [], "published to the old broker after the reload"

        # back to the environment's broker
        log_watch.mark()
        settings.reset("eventbox.brokers")
        log_watch.wait_for(r"eventbox relay publishing to %s\b" % re.escape(main_bootstrap), 30)
        back = query_one(conn, """SELECT eventbox.send(%s, '{"back": true}'::jsonb)""", (topic,))
        wait_outbox_drained(topic, timeout=60)
        assert [r.message_id for r in wait_for_ids(topic, [back])] == [back]
        assert back not in {r.message_id for r in read_topic(topic, bootstrap=bootstrap2)}
        ctl2.close()
    finally:
        settings.restore()          # before the broker the relay may point to goes away
        devbroker.stop(proc)


def test_empty_brokers_leaves_relay_idle_until_set(conn, settings, log_watch, new_topic):
    topic = new_topic(4)
    settings.set("eventbox.brokers", "")
    log_watch.wait_for(r"eventbox relay idle: eventbox\.brokers is empty", 30)
    wait_until(lambda: query(conn, "SELECT state FROM eventbox.workers WHERE role = 'relay'")
               == [("idle: no brokers",)], 30, what="relay state 'idle: no brokers'")

    # send() keeps working; the rows wait
    mids = [r[0] for r in query(conn, """
        SELECT eventbox.send(%s, jsonb_build_object('n', g), key => 'k' || g %% 5)
          FROM generate_series(1, 30) AS g""", (topic,))]
    assert len(mids) == 30
    # A negative check needs a window: for 2 s (> two poll wake-ups of a busy
    # relay) nothing may leave the outbox.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        assert pending_count(topic, conn=conn) == 30
        time.sleep(0.2)
    assert query(conn, """SELECT count(*), max(attempts) FROM eventbox.outbox
                           WHERE topic = %s AND status = 'pending'""", (topic,)) == [(30, 0)]

    log_watch.mark()
    settings.reset("eventbox.brokers")
    log_watch.wait_for(r"eventbox relay publishing to %s\b" % re.escape(env("EVENTBOX_BOOTSTRAP")),
                       30)
    wait_outbox_drained(topic, timeout=60)
    recs = wait_for_ids(topic, mids)
    assert sorted(r.message_id for r in recs) == sorted(mids)


# 8 ---------------------------------------------------------------------------

def _retain(conn, settings, topic, retention):
    """Sets the retention and waits until the relay applies it: a probe row
    committed after new sessions see the value must be kept as sent."""
    settings.set("eventbox.outbox_retention", retention)
    probe = query_one(conn, """SELECT eventbox.send(%s, '{"probe": 1}'::jsonb)""", (topic,))

    def probe_state():
        rows = query(conn, "SELECT status FROM eventbox.outbox WHERE message_id = %s", (probe,))
        if not rows:
            pytest.fail("the acknowledged row was deleted although "
                        "eventbox.outbox_retention = %s" % retention)
        return rows[0][0] == "sent"
    wait_until(probe_state, 60, what="probe row to be marked sent")
    return probe


def test_outbox_retention_keeps_sent_rows_with_offsets(conn, settings, new_topic):
    topic = new_topic(4)
    try:
        probe = _retain(conn, settings, topic, "1h")
        mids = [r[0] for r in query(conn, """
            SELECT eventbox.send(%s, jsonb_build_object('n', g), key => 'k' || g %% 7)
              FROM generate_series(1, 60) AS g""", (topic,))]
        wait_outbox_drained(topic, timeout=60)
        rows = query(conn, """
            SELECT message_id::text, status, kafka_partition, kafka_offset, attempts, last_error,
                   next_attempt_at, sent_at, created_at
              FROM eventbox.outbox WHERE topic = %s""", (topic,))
        by_id = {r[0]: r for r in rows}
        assert set(by_id) == set(mids) | {probe}

        recs = read_topic(topic)
        assert sorted(r.message_id for r in recs) == sorted(by_id)
        for r in recs:
            _mid, status, part, offset, attempts, last_error, nxt, _s, _c = by_id[r.message_id]
            assert status == "sent"
            assert (part, offset) == (r.partition, r.offset), r.message_id
            assert attempts == 1
            assert last_error is None and nxt is None

        # sent_at is the time of the acknowledgement: after the row was created
        # and recent (not a clock frozen at some earlier time)
        bad = [(r[0], r[7], r[8]) for r in rows if r[7] is None or r[7] < r[8]]
        assert not bad, "%d row(s) with sent_at missing or before created_at, e.g. " \
                        "(message_id, sent_at, created_at) = %r" % (len(bad), bad[0])
        age = query_one(conn, """SELECT extract(epoch FROM now() - min(sent_at))
                                   FROM eventbox.outbox WHERE topic = %s""", (topic,))
        assert age < 120, "sent_at is %.0f s old for rows sent just now" % age
    finally:
        settings.restore()
        query(conn, "DELETE FROM eventbox.outbox WHERE topic = %s AND status = 'sent'", (topic,))


def test_outbox_retention_purges_sent_rows(conn, settings, new_topic):
    topic = new_topic(4)
    try:
        _retain(conn, settings, topic, "2s")
        query(conn, """SELECT eventbox.send(%s, jsonb_build_object('n', g))
                         FROM generate_series(1, 20) AS g""", (topic,))
        wait_outbox_drained(topic, timeout=60)
        # rows are kept as sent for about 2 s, then purged in the background
        wait_until(lambda: query_one(conn, "SELECT count(*) FROM eventbox.outbox WHERE topic = %s",
                                     (topic,)) == 0,
                   30, what="purge of sent rows with eventbox.outbox_retention = 2s (rows: %r)"
                   % query(conn, "SELECT status, sent_at, now() FROM eventbox.outbox "
                                 "WHERE topic = %s LIMIT 1", (topic,)))
    finally:
        settings.restore()
        query(conn, "DELETE FROM eventbox.outbox WHERE topic = %s AND status = 'sent'", (topic,))
