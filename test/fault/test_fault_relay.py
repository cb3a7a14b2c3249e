"""Fault injection on the relay: repeated SIGKILLs during a stream, and a
burst of retriable Produce errors from the broker. Reports lost and duplicated
message counts (printed in the run's summary); nothing may be lost."""

import json
import time

import kafka

from eventbox_fixtures import (StreamSender, count_ids, env, pending_count, query, query_one,
                               read_topic, report, sigkill, wait_for_ids, wait_outbox_drained,
                               wait_relay, wait_until)

API_PRODUCE = 0
ERR_NOT_LEADER_FOR_PARTITION = 6
ERR_REQUEST_TIMED_OUT = 7
ERR_INVALID_RECORD = 87   # non-retriable


def test_repeated_sigkill_and_produce_error_burst(extension, new_topic, restore_broker_state):
    broker = restore_broker_state
    topic = new_topic(8)
    total = 30000
    sender = StreamSender(topic, total, batch=250, keys=500, pause=0.02, timeout=240)
    sender.start()
    kills = []
    try:
        for frac in (0.15, 0.40, 0.65):
            sender.wait_committed(int(total * frac))
            pid = wait_relay()
            kills.append((pid, sender.committed, pending_count(topic)))
            sigkill(pid)
            wait_relay(not_pid=pid, timeout=120)
            if frac == 0.40:
                # while the stream goes on: the next Produce requests fail
                broker.inject_errors(API_PRODUCE, [ERR_NOT_LEADER_FOR_PARTITION,
                                                   ERR_REQUEST_TIMED_OUT,
                                                   ERR_NOT_LEADER_FOR_PARTITION,
                                                   ERR_REQUEST_TIMED_OUT,
                                                   ERR_NOT_LEADER_FOR_PARTITION,
                                                   ERR_NOT_LEADER_FOR_PARTITION])
        sender.finish(timeout=240)
    finally:
        sender.stop_flag.set()

    t0 = time.monotonic()
    wait_outbox_drained(topic, timeout=180)
    drained = time.monotonic() - t0
    recs = read_topic(topic)
    lost, dups, unexpected = count_ids(recs, sender.ids)
    report("fault_repeated_sigkill_produce_errors", messages=total, kills=len(kills),
           kill_points="; ".join("pid %d at %d committed/%d pending" % k for k in kills),
           records=len(recs), lost=lost, duplicated=dups, unexpected=unexpected,
           drain_after_stream_s="%.1f" % drained, sender_reconnects=sender.reconnects,
           sender_ambiguous_batches=sender.ambiguous)
    assert lost == 0
    assert unexpected == 0

    # The burst did hit the relay's requests: no injected error is left over,
    # so a producer that does not retry gets its record through at once.
    scratch = new_topic(1, suffix="_scratch")
    producer = kafka.KafkaProducer(bootstrap_servers=env("EVENTBOX_BOOTSTRAP"), retries=0)
    try:
        producer.send(scratch, b"after the burst").get(timeout=30)
    finally:
        producer.close(10)


def test_sigkill_relay_while_broker_down(extension, conn, new_topic, restore_broker_state):
    """Rows handed to librdkafka while the broker is down and never acknowledged
    survive a relay crash: the new relay sends them once the broker is back."""
    broker = restore_broker_state
    topic = new_topic(8)
    warm = query_one(conn, """SELECT eventbox.send(%s, '{"warm": 1}'::jsonb)""", (topic,))
    wait_for_ids(topic, [warm])

    broker.broker_down("all")
    mids = [r[0] for r in query(conn, """
        SELECT eventbox.send(%s, jsonb_build_object('n', g), key => 'k' || g %% 31)
          FROM generate_series(1, 2000) AS g""", (topic,))]
    conn.close()
    # let the relay take the rows in flight, then crash it
    time.sleep(1.0)
    pid = wait_relay()
    sigkill(pid)
    new_pid = wait_relay(not_pid=pid, timeout=120)
    assert pending_count(topic) == len(mids)
    broker.broker_up("all")
    wait_outbox_drained(topic, timeout=120)
    recs = read_topic(topic)
    lost, dups, unexpected = count_ids(recs, mids + [warm])
    report("fault_sigkill_while_broker_down", messages=len(mids), killed_pid=pid,
           new_pid=new_pid, records=len(recs), lost=lost, duplicated=dups,
           unexpected=unexpected)
    assert lost == 0
    assert unexpected == 0


def test_permanent_produce_error_is_retried_with_backoff(conn, new_topic, settings,
                                                         restore_broker_state):
    """A record the broker rejects once with a non-retriable error
    (INVALID_RECORD) is recorded on its row (attempts, last_error,
    next_attempt_at after a backoff), retried after the backoff and then
    published once."""
    broker = restore_broker_state
    topic = new_topic(2)
    settings.set("eventbox.relay_retry_backoff", "5s")
    warm = query_one(conn, """SELECT eventbox.send(%s, '{"warm": 1}'::jsonb)""", (topic,))
    wait_for_ids(topic, [warm])   # the relay runs with the new setting

    # Setup, not an assertion: the row must be created well after the relay
    # process started, so that a next_attempt_at computed from a clock that
    # stands still at the relay's start is told apart from a real one.
    age = query_one(conn, """SELECT extract(epoch FROM now() - started_at)::float8
                               FROM eventbox.workers WHERE role = 'relay'""")
    if age < 8:
        time.sleep(8 - age)

    broker.inject_errors(API_PRODUCE, [ERR_INVALID_RECORD])
    mid = query_one(conn, """SELECT eventbox.send(%s, '{"x": 1}'::jsonb, key => 'a')""", (topic,))

    def failed_once():
        rows = query(conn, """SELECT attempts, last_error, next_attempt_at, created_at,
                                     clock_timestamp()
                                FROM eventbox.outbox WHERE message_id = %s""", (mid,))
        return rows and rows[0][0] == 1 and rows[0]
    seen = wait_until(failed_once, 30, interval=0.05, what="the failed attempt to be recorded")
    t_failed = time.monotonic()
    attempts, last_error, next_attempt_at, created_at, observed_at = seen
    assert "INVALID_RECORD" in last_error

    recs = wait_for_ids(topic, [mid], timeout=60)
    retried_after = time.monotonic() - t_failed
    assert [r.message_id for r in recs].count(mid) == 1
    wait_outbox_drained(topic)
    report("fault_permanent_error_retry", retried_after_s="%.1f" % retried_after,
           next_attempt_at=next_attempt_at.isoformat(), created_at=created_at.isoformat())
    # backoff 5 s with jitter: at least 2.5 s after the failure (minus polling slack)
    assert retried_after >= 2.0, "retried %.1f s after the failure, backoff is 5 s" % retried_after
    # next_attempt_at = time of the failure + backoff (2.5 .. 5 s), so at least
    # 2 s after the row was created
    assert (next_attempt_at - created_at).total_seconds() >= 2.0, (
        "next_attempt_at %s is not a backoff after the failure (row created %s, failure "
        "seen %s): the relay computes it from a stale now()"
        % (next_attempt_at, created_at, observed_at))


def test_message_timeouts_during_outage_retry_in_key_order(conn, new_topic, settings,
                                                           restore_broker_state):
    """With the broker down longer than eventbox.relay_message_timeout, every
    delivery times out: the rows are retried (transient errors never give up),
    nothing is lost or marked failed, and each key keeps its order."""
    broker = restore_broker_state
    topic = new_topic(8)
    settings.set("eventbox.relay_message_timeout", "1s")
    settings.set("eventbox.relay_retry_backoff", "200ms")
    settings.set("eventbox.relay_retry_backoff_max", "2s")
    warm = query_one(conn, """SELECT eventbox.send(%s, '{"warm": 1}'::jsonb)""", (topic,))
    wait_for_ids(topic, [warm])

    broker.broker_down("all")
    n_keys, per_key = 20, 25
    mids = [r[0] for r in query(conn, """
        SELECT eventbox.send(%s, jsonb_build_object('key', 'k' || g %% %s, 'seq', g / %s),
                             key => 'k' || g %% %s)
          FROM generate_series(0, %s) AS g""",
                                (topic, n_keys, n_keys, n_keys, n_keys * per_key - 1))]
    # the relay records failed attempts while the broker is down
    wait_until(lambda: query_one(conn, """SELECT count(*) FROM eventbox.outbox
                                           WHERE topic = %s AND attempts >= 2""", (topic,)) > 0,
               30, what="timed out deliveries to be recorded")
    stats = query(conn, """SELECT status, count(*), max(attempts), min(last_error)
                             FROM eventbox.outbox WHERE topic = %s GROUP BY status""", (topic,))
    broker.broker_up("all")
    wait_outbox_drained(topic, timeout=120)
    assert query_one(conn, "SELECT count(*) FROM eventbox.outbox WHERE topic = %s",
                     (topic,)) == 0, "rows left behind (failed?)"
    recs = read_topic(topic)
    lost, dups, unexpected = count_ids(recs, mids + [warm])
    report("fault_message_timeouts_during_outage", messages=len(mids), outbox_during_outage=stats,
           records=len(recs), lost=lost, duplicated=dups, unexpected=unexpected)
    assert lost == 0
    assert unexpected == 0
    assert all(s[0] == "pending" for s in stats), stats
    seqs = {}
    for r in recs:
        if r.message_id == warm:
            continue
        p = json.loads(r.value)
        seqs.setdefault(p["key"], []).append(p["seq"])
    for key, s in seqs.items():
        firsts = list(dict.fromkeys(s))   # duplicates (at-least-once) aside
        assert firsts == list(range(per_key)), "key %s out of order: %r" % (key, s)
