"""The metric counters of a dropped subscription are freed: its series leave eventbox.metrics
within two supervisor sweeps (10 s apart), and a subscription created later, under the same name
or another, counts from zero in a free entry.

Before, an entry of the shared counter table (512 of them) was never freed while the server
ran: a dropped subscription's series stayed forever, and once 512 names had come and gone every
new subscription was counted in the overflow entry (subscription="")."""

import uuid

from eventbox_fixtures import query, query_one, wait_until
from eventbox_handler_lib import Msg, produce


def records(conn, name):
    return query_one(conn, "SELECT value FROM eventbox.metrics "
                           "WHERE name = 'eventbox_ingest_records_total' "
                           "AND labels->>'subscription' = %s", (name,))


def series(conn, name):
    return query_one(conn, "SELECT count(*) FROM eventbox.metrics "
                           "WHERE labels->>'subscription' = %s", (name,))


def test_a_dropped_subscriptions_counters_are_freed(conn, new_topic):
    topic = new_topic(1)
    name = "metrics_drop_" + uuid.uuid4().hex[:8]
    msgs = [Msg("m-%d" % i, 0, None, {"n": i}, None) for i in range(5)]
    produce(topic, msgs)
    try:
        query(conn, "SELECT eventbox.create_subscription(%s, ARRAY[%s], start_from => 'earliest')",
              (name, topic))
        wait_until(lambda: records(conn, name) == 5, 60, what="5 records counted for %s" % name)
        query(conn, "SELECT eventbox.drop_subscription(%s)", (name,))
        wait_until(lambda: series(conn, name) == 0, 45, interval=0.5,
                   what="the series of dropped subscription %s to leave eventbox.metrics" % name)

        # Created again: its entry starts from zero (the same 5 records are read again, as the
        # dropped subscription's inbox rows and offsets went with it).
        query(conn, "SELECT eventbox.create_subscription(%s, ARRAY[%s], start_from => 'earliest')",
              (name, topic))
        wait_until(lambda: records(conn, name) == 5, 60,
                   what="5 records counted for %s created again" % name)
        assert query_one(conn, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s",
                         (name,)) == 5
        assert records(conn, name) == 5
    finally:
        query(conn, "SELECT eventbox.drop_subscription(name) FROM eventbox.subscriptions "
                    "WHERE name = %s", (name,))
