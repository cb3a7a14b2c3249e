"""A group subscription dropped while its member joins the group (docs/guide/scaling.md, "A
member stopped while it joins"): librdkafka 2.0.2 aborts the process when a cooperative-sticky
member is destroyed after its JoinGroup was answered and before its first assignment. Every
SyncGroup is refused here, so the member stays in that window; dropping the subscription
destroys it. The ingest worker must not crash (a crash restarts every backend): it waits for the
assignment, leaves the member open, logs why, exits and is started again, and the records of a
subscription created afterwards are stored."""
import time

from inbox_kafka import end_offsets, json_value, produce
from inbox_support import LogWatch, poll, unique_name

SYNC_GROUP = 14               # Kafka API key
REBALANCE_IN_PROGRESS = 27    # error code: the member joins again, its assignor still chosen
# The dev broker answers a group's first JoinGroup after its initial rebalance delay (3 s); the
# member is in the window from then on.
JOINED_AFTER_S = 10
LEFT_OPEN = "restarting to let go of a Kafka consumer group member that had no assignment yet"


def records(tag, n):
    return [{"key": b"k%d" % (i % 5), "value": json_value({"tag": tag, "i": i}),
             "headers": [("message_id", ("%s-%d" % (tag, i)).encode())]} for i in range(n)]


def test_dropped_while_joining_the_worker_restarts_instead_of_crashing(
        ib_db, ib_broker, ib_topic, ib_producer, ib_subscriptions):
    topic = ib_topic("joining", 4)
    pid = ib_db.wait_ingest_worker()
    log = LogWatch()
    ib_broker.inject_errors(SYNC_GROUP, [REBALANCE_IN_PROGRESS] * 500)
    try:
        joining = ib_subscriptions(unique_name("joining"), [topic], membership="group",
                                   group_id=unique_name("joining_group"))
        time.sleep(JOINED_AFTER_S)
        ib_db.rows_retry("SELECT eventbox.drop_subscription(%s)", (joining,))
        poll(lambda: log.lines(LEFT_OPEN), 60, "the ingest worker's line: " + LEFT_OPEN)
        restarted = ib_db.wait_ingest_worker(not_pid=pid)
        assert restarted != pid
    finally:
        ib_broker.clear_errors(SYNC_GROUP)
    assert log.crash_lines() == [], log.crash_lines()
    assert log.lines(r"\(PID %d\) exited with exit code 1" % pid), \
        "the ingest worker %d exited, not crashed" % pid
    # The restarted worker ingests.
    after = ib_subscriptions(unique_name("after_joining"), [topic])
    produce(ib_producer, topic, records("after", 40))
    ib_db.wait_caught_up(after, end_offsets(topic), timeout=60)
    assert ib_db.inbox_count(after) == 40
