"""The relay deletes acknowledged rows at the tids it read them from (a TID scan instead of an
index descent per range of ids). A tid is only where the row was: a row updated while it was in
flight sits elsewhere now, and a row deleted by someone else may have left its place to a new
row. Both must come out right: the updated row is still deleted (by id) once acknowledged, and
the new row at the old place is neither deleted nor lost.

The broker's round trip is stretched so that a row stays in flight (produced, not yet
acknowledged) while the test changes the outbox under it."""

import time
import uuid

from eventbox_fixtures import (query, query_one, read_topic, wait_for_ids,
                               wait_outbox_drained, wait_until)

RTT_MS = 4000


def _send(conn, topic, n, key):
    return query_one(conn, "SELECT eventbox.send(%s, jsonb_build_object('n', %s), %s)::text",
                     (topic, n, key))


def _in_flight(conn, topic):
    """Sends one row and waits until the relay has produced it: the broker appends a record when
    the request arrives and answers RTT_MS later (the high watermark is not asked: that answer
    would wait as long)."""
    mid = _send(conn, topic, 1, "k1")
    time.sleep(1.0)  # the relay wakes at the commit
    return mid


def _insert_at(conn, topic, mid, tid, deadline):
    """Inserts a row the relay reads but holds back (due later) into the place `tid` a deleted
    row left: only the tid delete of the row in flight could remove it before it is published.
    VACUUM frees the place only once no snapshot can see the deleted row any more (a worker's
    transaction may still hold one for a moment): an insert that lands elsewhere is rolled back
    and tried again after the next VACUUM, until the deadline. Returns the last insert's tid."""
    while True:
        query(conn, "VACUUM eventbox.outbox")
        query(conn, "BEGIN")
        got = query_one(conn, """
            INSERT INTO eventbox.outbox (message_id, topic, key, payload, headers,
                                         next_attempt_at)
            VALUES (%s, %s, 'k2', convert_to('{"n": 2}', 'UTF8'), '{}',
                    now() + interval '8 seconds')
            RETURNING ctid::text""", (mid, topic))
        if got == tid or time.monotonic() > deadline:
            query(conn, "COMMIT")
            return got
        query(conn, "ROLLBACK")
        time.sleep(0.1)


def test_a_row_updated_in_flight_is_deleted_by_id_once_acknowledged(conn, new_topic, broker):
    topic = new_topic(1)
    wait_outbox_drained()
    broker.broker_rtt("all", RTT_MS)
    try:
        mid = _in_flight(conn, topic)
        before = query_one(conn, "SELECT ctid::text FROM eventbox.outbox WHERE message_id = %s",
                           (mid,))
        query(conn, "UPDATE eventbox.outbox SET headers = headers || '{\"note\": \"edited\"}' "
                    "WHERE message_id = %s", (mid,))
        after = query_one(conn, "SELECT ctid::text FROM eventbox.outbox WHERE message_id = %s",
                          (mid,))
        assert before != after, (before, after)
        # Gone once acknowledged, well before eventbox.relay_sweep_interval (60 s) would have
        # read it again and published it a second time.
        wait_until(lambda: query_one(conn, "SELECT count(*) FROM eventbox.outbox "
                                           "WHERE message_id = %s", (mid,)) == 0,
                   RTT_MS / 1000 + 10, what="the updated row deleted after its ack")
    finally:
        broker.broker_rtt("all", 0)
    wait_for_ids(topic, {mid}, timeout=30)
    assert [r.message_id for r in read_topic(topic)] == [mid]


def test_a_new_row_in_the_place_of_an_in_flight_row_is_not_deleted(conn, new_topic, broker,
                                                                    log_watch):
    topic = new_topic(1)
    wait_outbox_drained()
    # An empty table: the row in flight takes the first place of its first page, and so does
    # the next row once that place is vacuumed.
    query(conn, "TRUNCATE eventbox.outbox")
    broker.broker_rtt("all", RTT_MS)
    try:
        sent_at = time.monotonic()
        a = _in_flight(conn, topic)
        a_tid = query_one(conn, "SELECT ctid::text FROM eventbox.outbox WHERE message_id = %s",
                          (a,))
        query(conn, "DELETE FROM eventbox.outbox WHERE message_id = %s", (a,))
        b = str(uuid.uuid4())
        b_tid = _insert_at(conn, topic, b, a_tid, deadline=sent_at + RTT_MS / 1000 - 1)
        assert b_tid == a_tid, "the new row did not take the place of the deleted one: %s %s" % (
            a_tid, b_tid)
        # The row in flight is acknowledged after the broker's round trip.
        time.sleep(RTT_MS / 1000 + 1)
    finally:
        broker.broker_rtt("all", 0)
    wait_for_ids(topic, {a, b}, timeout=60)
    assert log_watch.lines("a row read for delivery was replaced at its place")
    wait_until(lambda: query_one(conn, "SELECT count(*) FROM eventbox.outbox "
                                       "WHERE message_id = %s", (b,)) == 0, 30,
               what="the new row deleted after its own ack")
    assert sorted(r.message_id for r in read_topic(topic)) == sorted([a, b])
