"""A row a user changes while the relay has it in flight (produced, not yet acknowledged): the
change holds the row (eventbox.outbox_held, docs/design/outbox-rotation.md), and the
acknowledgement still settles it: it leaves the outbox and is published once, not read and
published again.

The broker's round trip is stretched so that a row stays in flight while the test changes the
outbox under it."""

import time

from eventbox_fixtures import (query, query_one, read_topic, wait_for_ids, wait_outbox_drained,
                               wait_until)

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


def test_a_row_updated_in_flight_is_settled_once_acknowledged(conn, new_topic, broker):
    topic = new_topic(1)
    wait_outbox_drained()
    broker.broker_rtt("all", RTT_MS)
    try:
        mid = _in_flight(conn, topic)
        query(conn, "UPDATE eventbox.outbox SET headers = headers || '{\"note\": \"edited\"}' "
                    "WHERE message_id = %s", (mid,))
        assert query_one(conn, "SELECT status FROM eventbox.outbox_held WHERE id = "
                               "(SELECT id FROM eventbox.outbox WHERE message_id = %s)",
                         (mid,)) == "pending"
        # Gone from the view once acknowledged, well before eventbox.relay_sweep_interval (60 s)
        # would have read it again and published it a second time.
        wait_until(lambda: query_one(conn, "SELECT count(*) FROM eventbox.outbox "
                                           "WHERE message_id = %s", (mid,)) == 0,
                   RTT_MS / 1000 + 10, what="the updated row settled by its ack")
        assert query_one(conn, "SELECT count(*) FROM eventbox.outbox_held h "
                               "JOIN eventbox._outbox_rows r USING (id) WHERE r.message_id = %s",
                         (mid,)) == 0
    finally:
        broker.broker_rtt("all", 0)
    wait_for_ids(topic, {mid}, timeout=30)
    assert [r.message_id for r in read_topic(topic)] == [mid]
