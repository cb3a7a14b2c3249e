"""Rows held in eventbox.outbox_held do not hold the relay's settled position W
(docs/design/outbox-rotation.md): a row waiting for a retry, and a row in flight longer than
eventbox.relay_sweep_interval (a broker down with relay_message_timeout = 0), is read and retried
from outbox_held, and W passes its copy in the rotated tables. A relay that starts over reads a
key's held row (below W) before the key's later rows (above W), so per-key order holds."""

import json

from eventbox_fixtures import (count_ids, query, query_one, read_topic, report, settled_below,
                               wait_for_ids, wait_outbox_drained, wait_until)


def held_rows(conn, topic):
    return query_one(conn, "SELECT count(*) FROM eventbox.outbox_held WHERE topic = %s",
                     (topic,))


def relay_state(conn):
    return query_one(conn, "SELECT state FROM eventbox.workers WHERE role = 'relay'")


def key_orders(recs, skip):
    seqs = {}
    for r in recs:
        if r.message_id in skip:
            continue
        p = json.loads(r.value)
        seqs.setdefault(p["key"], []).append(p["seq"])
    # Duplicates (at-least-once) aside, each key's first sightings in the topic's order.
    return {k: list(dict.fromkeys(s)) for k, s in seqs.items()}


def test_retried_rows_are_held_and_read_first_after_a_reset(conn, new_topic, settings,
                                                            restore_broker_state):
    broker = restore_broker_state
    topic = new_topic(4)
    settings.set("eventbox.relay_message_timeout", "1s")
    settings.set("eventbox.relay_retry_backoff", "500ms")
    settings.set("eventbox.relay_retry_backoff_max", "1s")
    # Rows of other tests still in the outbox (a key waiting for its retry, and its later rows
    # behind it) are held after one to two intervals too; W waits for them until then.
    settings.set("eventbox.relay_sweep_interval", "1s")
    warm = query_one(conn, """SELECT eventbox.send(%s, '{"warm": 1}'::jsonb)""", (topic,))
    wait_for_ids(topic, [warm])

    broker.broker_down("all")
    n_keys = 10
    first = [r[0] for r in query(conn, """
        SELECT eventbox.send(%s, jsonb_build_object('key', 'k' || g, 'seq', 0), key => 'k' || g)
          FROM generate_series(1, %s) AS g""", (topic, n_keys))]
    top = query_one(conn, "SELECT max(id) FROM eventbox.outbox WHERE topic = %s", (topic,))
    # Every delivery times out: the rows wait for their retries in outbox_held, and W passes
    # them while they do (it waited for the retries before).
    wait_until(lambda: held_rows(conn, topic) == n_keys and settled_below(conn) > top, 60,
               what="the failed rows held and W past them (last id %d)" % top)
    assert query_one(conn, "SELECT count(*) FROM eventbox.outbox WHERE topic = %s "
                           "AND status = 'pending' AND attempts >= 1", (topic,)) == n_keys

    # The relay stops reading (no brokers: idle), the keys' later rows arrive above W, then it
    # starts over from its stored state with the broker back.
    settings.set("eventbox.brokers", "")
    wait_until(lambda: relay_state(conn) == "idle: no brokers", 30, what="the relay idle")
    later = [r[0] for r in query(conn, """
        SELECT eventbox.send(%s, jsonb_build_object('key', 'k' || g, 'seq', s), key => 'k' || g)
          FROM generate_series(1, 4) AS s, generate_series(1, %s) AS g
         ORDER BY s, g""", (topic, n_keys))]
    assert min(query_one(conn, "SELECT array_agg(id) FROM eventbox.outbox WHERE message_id = "
                               "ANY (%s::uuid[])", (later,))) >= settled_below(conn)
    broker.broker_up("all")
    settings.reset("eventbox.brokers")
    wait_outbox_drained(topic, timeout=120)
    assert held_rows(conn, topic) == 0, "acknowledged held rows stay in outbox_held"
    recs = read_topic(topic)
    lost, dups, unexpected = count_ids(recs, first + later + [warm])
    report("relay_held_reset", messages=len(first) + len(later), records=len(recs), lost=lost,
           duplicated=dups, unexpected=unexpected)
    assert lost == 0
    assert unexpected == 0
    orders = key_orders(recs, {warm})
    assert len(orders) == n_keys
    for key, seqs in orders.items():
        assert seqs == [0, 1, 2, 3, 4], "key %s out of order: %r" % (key, seqs)


def test_rows_in_flight_too_long_are_held(conn, new_topic, settings, restore_broker_state):
    broker = restore_broker_state
    topic = new_topic(4)
    assert query_one(conn, "SELECT current_setting('eventbox.relay_message_timeout')") == "0"
    settings.set("eventbox.relay_sweep_interval", "1s")
    warm = query_one(conn, """SELECT eventbox.send(%s, '{"warm": 1}'::jsonb)""", (topic,))
    wait_for_ids(topic, [warm])

    broker.broker_down("all")
    mids = [r[0] for r in query(conn, """
        SELECT eventbox.send(%s, jsonb_build_object('key', 'k' || g %% 7, 'seq', g / 7),
                             key => 'k' || g %% 7)
          FROM generate_series(0, 48) AS g""", (topic,))]
    top = query_one(conn, "SELECT max(id) FROM eventbox.outbox WHERE topic = %s", (topic,))
    # In flight for good (no delivery timeout): held after one to two intervals, and W passes
    # them. No attempt is counted: nothing failed.
    wait_until(lambda: held_rows(conn, topic) == len(mids) and settled_below(conn) > top, 60,
               what="the rows in flight held and W past them (last id %d)" % top)
    assert query_one(conn, "SELECT count(*) FROM eventbox.outbox WHERE topic = %s "
                           "AND status = 'pending' AND attempts = 0", (topic,)) == len(mids)

    broker.broker_up("all")
    wait_outbox_drained(topic, timeout=120)
    wait_until(lambda: held_rows(conn, topic) == 0, 30,
               what="acknowledged held rows leave outbox_held")
    recs = read_topic(topic)
    lost, dups, unexpected = count_ids(recs, mids + [warm])
    report("relay_held_in_flight", messages=len(mids), records=len(recs), lost=lost,
           duplicated=dups, unexpected=unexpected)
    assert lost == 0
    assert unexpected == 0
    for key, seqs in key_orders(recs, {warm}).items():
        assert seqs == list(range(7)), "key %s out of order: %r" % (key, seqs)
