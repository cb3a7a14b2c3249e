"""State changes driven in a loop keep the log bounded (issue: 464 LOG lines in
25 s from alter_subscription / replay loops, one per call): the ingest
worker's "consuming subscription" and "continues from its changed stored
offsets" lines are written at most 5 times a minute each, and the next one
allowed says how many were held back."""

import time

from eventbox_fixtures import LogWatcher, query


def test_alter_and_replay_loops_log_at_a_bounded_rate(conn, new_topic):
    topic = new_topic(2)
    sub = "lograte_" + topic[-8:]
    query(conn, "SELECT eventbox.create_subscription(%s, ARRAY[%s], unhandled => 'keep')",
          (sub, topic))
    watch = LogWatcher()
    try:
        # Every alter changes the consumer's settings: the worker rebuilds it each time.
        for i in range(40):
            query(conn, "SELECT eventbox.alter_subscription(%s, batch_size => %s)",
                  (sub, 100 + i))
            time.sleep(0.05)
        for i in range(40):
            query(conn, "SELECT eventbox.replay(%s, %s, 0, %s)", (sub, topic, i % 3))
            time.sleep(0.05)
        time.sleep(2)  # the worker catches up with the last change
        # (The budget is per worker process, shared with other subscriptions' lines.)
        consuming = watch.lines(r'consuming subscription "%s"' % sub)
        continues = watch.lines(r'subscription "%s" continues from its changed' % sub)
        assert len(consuming) <= 5, consuming
        assert len(continues) <= 5, continues
    finally:
        query(conn, "SELECT eventbox.drop_subscription(%s)", (sub,))
