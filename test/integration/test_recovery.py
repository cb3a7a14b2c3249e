"""The relay survives crashes, terminations and broker outages without losing
a committed message (at-least-once: duplicates are counted and reported)."""

import re
import time

from eventbox_fixtures import (StreamSender, count_ids, pending_count, query, query_one,
                               read_topic, report, sigkill, wait_for_ids, wait_outbox_drained,
                               wait_relay)


# 5 ---------------------------------------------------------------------------

def test_sigkill_relay_mid_stream_loses_nothing(extension, new_topic):
    topic = new_topic(8)
    total = 20000
    sender = StreamSender(topic, total, batch=250, keys=300, pause=0.01)
    sender.start()
    try:
        sender.wait_committed(total // 4)
        # kill while the relay is busy: some rows published, some not yet
        wait_for_ids(topic, sender.ids[:100], timeout=60)
        pid = wait_relay()
        committed, pending = sender.committed, pending_count(topic)
        sigkill(pid)   # crash restart of every backend, the sender's included
        new_pid = wait_relay(not_pid=pid, timeout=120)
        sender.finish()
    finally:
        sender.stop_flag.set()
    wait_outbox_drained(topic, timeout=180)
    recs = read_topic(topic)
    lost, dups, unexpected = count_ids(recs, sender.ids)
    report("sigkill_relay_mid_stream", messages=total, killed_pid=pid, new_pid=new_pid,
           committed_at_kill=committed, pending_at_kill=pending, records=len(recs),
           lost=lost, duplicated=dups, unexpected=unexpected,
           sender_reconnects=sender.reconnects, sender_ambiguous_batches=sender.ambiguous)
    assert lost == 0
    assert unexpected == 0


# 6 ---------------------------------------------------------------------------

def test_broker_down_10s_then_up_loses_nothing(conn, new_topic, restore_broker_state, log_watch):
    broker = restore_broker_state
    topic = new_topic(8)
    warm = query_one(conn, """SELECT eventbox.send(%s, '{"warm": 1}'::jsonb)""", (topic,))
    wait_for_ids(topic, [warm])

    broker.broker_down("all")
    t_down = time.monotonic()
    mids = []
    for i in range(10):
        t0 = time.monotonic()
        mids += [r[0] for r in query(conn, """
            SELECT eventbox.send(%s, jsonb_build_object('batch', %s, 'n', g), key => 'k' || g %% 17)
              FROM generate_series(1, 50) AS g""", (topic, i))]
        assert time.monotonic() - t0 < 5, "send() blocked while the broker is down"
    # the outage lasts 10 s
    time.sleep(max(0.0, 10.0 - (time.monotonic() - t_down)))
    assert pending_count(topic, conn=conn) == len(mids) == 500
    assert query_one(conn, "SELECT count(*) FROM eventbox.outbox WHERE topic = %s AND status <> 'pending'",
                     (topic,)) == 0

    broker.broker_up("all")
    t_up = time.monotonic()
    wait_outbox_drained(topic, timeout=120)
    recovered = time.monotonic() - t_up
    recs = read_topic(topic)
    lost, dups, unexpected = count_ids(recs, mids + [warm])
    report("broker_down_10s", messages=len(mids), recovered_s="%.1f" % recovered,
           lost=lost, duplicated=dups, unexpected=unexpected)
    assert lost == 0
    assert unexpected == 0

    # "log at a bounded rate": librdkafka complains constantly while the broker is
    # down; the relay lets at most one warning through per 10 s.
    elapsed = time.monotonic() - t_down
    warnings = log_watch.lines(r"eventbox relay: kafka:")
    assert len(warnings) <= 2 + elapsed / 10, "%d relay warnings in %.0f s:\n%s" % (
        len(warnings), elapsed, "\n".join(warnings[:20]))


# 10 --------------------------------------------------------------------------

def test_relay_restarted_after_terminate_with_backoff(conn, new_topic, log_watch):
    topic = new_topic(4)
    pid1 = wait_relay()
    first = query_one(conn, """SELECT eventbox.send(%s, '{"n": 1}'::jsonb)""", (topic,))
    wait_for_ids(topic, [first])

    assert query_one(conn, "SELECT pg_terminate_backend(%s)", (pid1,)) is True
    # sent while the relay is gone
    second = query_one(conn, """SELECT eventbox.send(%s, '{"n": 2}'::jsonb)""", (topic,))
    pid2 = wait_relay(not_pid=pid1, timeout=90)
    wait_for_ids(topic, [first, second], timeout=60)

    # again, soon after: it died young, so the launcher waits longer this time
    assert query_one(conn, "SELECT pg_terminate_backend(%s)", (pid2,)) is True
    third = query_one(conn, """SELECT eventbox.send(%s, '{"n": 3}'::jsonb)""", (topic,))
    pid3 = wait_relay(not_pid=pid2, timeout=150)
    assert pid3 != pid1
    wait_outbox_drained(topic)
    recs = wait_for_ids(topic, [first, second, third], timeout=60)
    assert sorted(r.message_id for r in recs) == sorted([first, second, third])

    lines = log_watch.wait_for(r"eventbox relay exited; restarting it in \d+ ms", 10, count=2)
    delays = [int(re.search(r"restarting it in (\d+) ms", ln).group(1)) for ln in lines]
    report("relay_terminate_restart", pids="%d->%d->%d" % (pid1, pid2, pid3),
           backoff_ms="/".join(map(str, delays)))
    assert 0 < delays[0] < delays[1], delays
    assert query_one(conn, "SELECT count(*) FROM pg_stat_activity "
                           "WHERE backend_type = 'eventbox relay'") == 1
