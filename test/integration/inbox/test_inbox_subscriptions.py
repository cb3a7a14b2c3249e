"""Subscriptions are picked up by the running ingest worker without a restart
(docs/reference/functions.md): a new one starts consuming, altering its topics keeps the stored
offsets of the topics it already had, dropping it stops it and removes its rows and offsets."""
import time

import pytest

from inbox_kafka import end_offsets, json_value, produce
from inbox_support import report, unique_name


def records(tag, n, start=0):
    return [{"value": json_value({"tag": tag, "i": i}),
             "headers": [("message_id", ("%s-%d" % (tag, i)).encode())]}
            for i in range(start, start + n)]


def merged(*dicts):
    out = {}
    for d in dicts:
        out.update(d)
    return out


def test_subscription_added_altered_and_dropped_while_running(ib_db, ib_topic, ib_producer,
                                                              ib_subscriptions):
    t1 = ib_topic("life_a", 3)
    t2 = ib_topic("life_b", 2)
    sub = unique_name("life")
    worker = ib_db.counters()

    # 1. Added while the worker runs: it consumes the history (start_from earliest).
    produce(ib_producer, t1, records("a", 300))
    ib_subscriptions(sub, [t1])
    ib_db.wait_rows(sub, 300, timeout=60)
    ends1 = end_offsets(t1)
    offsets1 = ib_db.wait_caught_up(sub, ends1, timeout=30)
    old_rows = dict(ib_db.rows("SELECT message_id, received_at FROM eventbox.inbox "
                               "WHERE subscription = %s", (sub,)))
    assert len(old_rows) == 300
    before_alter = ib_db.counters()
    assert before_alter["pid"] == worker["pid"], "the ingest worker restarted"

    # 2. Altered to add a second topic; t2 has history (read from its start: a topic new to the
    # subscription starts at start_from), t1 gets new messages after the alter.
    produce(ib_producer, t2, records("b", 40))
    t_alter = time.monotonic()
    ib_db.alter_subscription(sub, topics=[t1, t2])
    assert ib_db.value("SELECT topics FROM eventbox.subscriptions WHERE name = %s",
                       (sub,)) == sorted([t1, t2])
    produce(ib_producer, t1, records("a", 100, start=300))
    produce(ib_producer, t2, records("b", 50, start=40))
    ends = merged(end_offsets(t1), end_offsets(t2))
    # The consumer is rebuilt with the same group: with the dev broker that takes ~45 s.
    ib_db.wait_rows(sub, 490, timeout=150)
    ib_db.wait_caught_up(sub, ends, timeout=30)
    resumed_after = time.monotonic() - t_alter
    after_alter = ib_db.counters()
    rows_now = dict(ib_db.rows("SELECT message_id, received_at FROM eventbox.inbox "
                               "WHERE subscription = %s", (sub,)))
    report("alter_subscription", rows=len(rows_now), caught_up_after_s=round(resumed_after, 1),
           messages_read=after_alter["messages"] - before_alter["messages"],
           duplicates=after_alter["duplicates"] - before_alter["duplicates"])
    assert after_alter["pid"] == worker["pid"], "the ingest worker restarted"
    assert len(rows_now) == 490
    assert set(rows_now) == {"a-%d" % i for i in range(400)} | {"b-%d" % i for i in range(90)}
    assert {k: rows_now[k] for k in old_rows} == old_rows, "rows stored before the alter changed"
    # No re-read of t1's old messages: the worker read exactly the 190 new records.
    assert after_alter["duplicates"] == before_alter["duplicates"], (
        "records already stored were read again after alter_subscription (duplicates %d -> %d)"
        % (before_alter["duplicates"], after_alter["duplicates"]))
    assert after_alter["messages"] - before_alter["messages"] == 190, (
        "the worker read %d records after alter_subscription, 190 were new"
        % (after_alter["messages"] - before_alter["messages"]))
    # t1's offsets continued from where they were.
    stored = ib_db.stored_offsets(sub)
    for tp, n in offsets1.items():
        assert stored[tp] == ends[tp] >= n

    # 3. Dropped: rows and offsets go with it, at once.
    ib_db.drop_subscription(sub)
    assert ib_db.inbox_count(sub) == 0
    assert ib_db.stored_offsets(sub) == {}
    assert ib_db.value("SELECT count(*) FROM eventbox.subscriptions WHERE name = %s",
                       (sub,)) == 0
    messages_at_drop = ib_db.counters()["messages"]
    produce(ib_producer, t1, records("a", 60, start=400))
    # Nothing may come back: watch a few seconds (the worker picks changes up within ~1 s and
    # otherwise ingests new records within a batch or two).
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        c = ib_db.counters()
        if ib_db.inbox_count(sub) or ib_db.stored_offsets(sub) or c["messages"] != messages_at_drop:
            pytest.fail("the dropped subscription is still consumed: rows %d, offsets %r, "
                        "worker messages %d -> %d" % (
                            ib_db.inbox_count(sub), ib_db.stored_offsets(sub),
                            messages_at_drop, c["messages"]))
        time.sleep(0.2)

    # 4. Created again under the same name: its offsets went with the old one, so it starts
    # over from the beginning. (A new group id only spares the wait for the dev broker's group
    # coordinator, which holds a group that its last member left for session.timeout.ms.)
    ib_subscriptions(sub, [t1], group_id=unique_name("regroup"))
    ib_db.wait_rows(sub, 460, timeout=60)
    ib_db.wait_caught_up(sub, end_offsets(t1), timeout=30)
    assert ib_db.inbox_count(sub) == 460
