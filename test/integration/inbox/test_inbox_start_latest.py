"""start_from => 'latest': the history before the subscription is skipped, nothing produced
after it is (docs/reference/functions.md; docs/design/guarantees.md: after any restart
consumption resumes from the stored offsets and skips nothing)."""
import time

import pytest

from inbox_kafka import devbroker, end_offsets, json_value, new_producer, produce
from inbox_support import Db, env, poll, report, unique_name


def records(tag, n, start=0):
    return [{"value": json_value({"tag": tag, "i": i}),
             "headers": [("message_id", ("%s-%d" % (tag, i)).encode())]}
            for i in range(start, start + n)]


def tags(db, sub):
    """{tag: number of rows} of a subscription (message ids are tag-i)."""
    return dict(db.rows("SELECT split_part(message_id, '-', 1), count(*) FROM eventbox.inbox "
                        "WHERE subscription = %s GROUP BY 1", (sub,)))


def wait_tag(db, sub, tag, n, timeout):
    state = {}

    def probe():
        state["found"] = tags(db, sub)
        return state["found"].get(tag, 0) >= n
    poll(probe, timeout, lambda: "%d %r rows in %s (found %r)" % (n, tag, sub, state["found"]))


def wait_consuming(db, producer, sub, topic, timeout=90):
    """Produces a probe record every half second until one is stored: from then on the
    subscription's consumer is positioned and reading (whatever 'latest' resolved to)."""
    deadline = time.monotonic() + timeout
    i = 0
    while True:
        produce(producer, topic, records("probe", 1, start=i))
        i += 1
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            if tags(db, sub).get("probe"):
                return
            time.sleep(0.05)
        if time.monotonic() >= deadline:
            pytest.fail("no probe record of %s stored within %.0f s" % (sub, timeout))


def test_latest_skips_history_but_not_messages_produced_after_creation(
        ib_db, ib_topic, ib_producer, ib_subscriptions):
    topic = ib_topic("latest", 3)
    sub = unique_name("latest")
    produce(ib_producer, topic, records("old", 60))
    ib_subscriptions(sub, [topic], start_from="latest")
    # Produced right after create_subscription() returned: these are after the subscription.
    produce(ib_producer, topic, records("early", 30))
    wait_consuming(ib_db, ib_producer, sub, topic)
    produce(ib_producer, topic, records("late", 30))
    wait_tag(ib_db, sub, "late", 30, timeout=60)
    ib_db.wait_caught_up(sub, end_offsets(topic), timeout=30)
    found = tags(ib_db, sub)
    report("latest", old=found.get("old", 0), early=found.get("early", 0),
           late=found.get("late", 0))
    assert found.get("old", 0) == 0, "history before the subscription was stored: %r" % found
    assert found.get("late", 0) == 30, found
    assert found.get("early", 0) == 30, (
        "%d of 30 messages produced right after create_subscription(start_from => 'latest') "
        "returned were skipped (%r): 'latest' is resolved when the consumer is first assigned "
        "its partitions, not when the subscription is created"
        % (30 - found.get("early", 0), found))


@pytest.fixture(scope="module")
def idle_cycle(ib_env):
    """Two 'latest' subscriptions through one period with the workers idle
    (eventbox.brokers = '' + reload):
      running: created and running before; messages p1 before the idle period, p2 during it;
      created_idle: created while the workers are idle, messages 'after' produced then.
    Returns the rows found per tag of each, once both are caught up."""
    db = Db()
    broker = devbroker()
    producer = new_producer()
    t_run, t_idle = unique_name("latest_run"), unique_name("latest_idle")
    broker.create_topic(t_run, 3)
    broker.create_topic(t_idle, 2)
    s_run, s_idle = unique_name("latest_run"), unique_name("latest_idle")
    result = {}
    try:
        produce(producer, t_run, records("old", 40))
        db.create_subscription(s_run, [t_run], start_from="latest")
        wait_consuming(db, producer, s_run, t_run)
        produce(producer, t_run, records("p1", 20))
        wait_tag(db, s_run, "p1", 20, timeout=60)

        try:
            db.set_setting("eventbox.brokers", "", "")
            poll(lambda: db.counters()["state"].startswith("idle"), 30,
                 "the ingest worker to go idle without brokers")
            produce(producer, t_run, records("p2", 30))
            produce(producer, t_idle, records("old", 25))
            db.create_subscription(s_idle, [t_idle], start_from="latest")
            produce(producer, t_idle, records("after", 20))
        finally:
            db.set_setting("eventbox.brokers", None, env("EVENTBOX_BOOTSTRAP"))
        t_back = time.monotonic()

        # The rebuilt consumer of s_run rejoins a group it left: the dev broker's coordinator
        # holds such a group for session.timeout.ms (45 s), hence the long timeouts.
        wait_tag(db, s_run, "p2", 30, timeout=150)
        db.wait_caught_up(s_run, end_offsets(t_run), timeout=60)
        result["resumed_after_s"] = round(time.monotonic() - t_back, 1)
        db.wait_caught_up(s_idle, end_offsets(t_idle), timeout=150)
        result["running"] = tags(db, s_run)
        result["created_idle"] = tags(db, s_idle)
        yield result
    finally:
        for s in (s_run, s_idle):
            try:
                db.rows("SELECT eventbox.drop_subscription(name) FROM eventbox.subscriptions "
                        "WHERE name = %s", (s,))
            except Exception:
                pass
        db.close()
        producer.close(timeout=10)
        broker.close()


def test_latest_resumes_after_the_workers_were_idle(idle_cycle):
    found = idle_cycle["running"]
    report("latest_idle_restart", resumed_after_s=idle_cycle["resumed_after_s"],
           old=found.get("old", 0), p1=found.get("p1", 0), p2=found.get("p2", 0))
    assert found.get("old", 0) == 0, found
    assert found.get("p1", 0) == 20, found
    assert found.get("p2", 0) == 30, (
        "messages produced while the ingest worker was idle were skipped: %r" % found)


def test_latest_subscription_created_while_idle_skips_nothing_after_creation(idle_cycle):
    found = idle_cycle["created_idle"]
    report("latest_created_idle", old=found.get("old", 0), after=found.get("after", 0))
    assert found.get("old", 0) == 0, found
    assert found.get("after", 0) == 20, (
        "%d of 20 messages produced after create_subscription(start_from => 'latest') (while "
        "the workers were idle) were skipped when the workers came back: %r"
        % (20 - found.get("after", 0), found))
