"""The relay's passes start at least eventbox.relay_linger apart while wakes keep coming
(docs/design/relay.md, "Passes are paced"): a stream of one-row commits no longer runs a pass
per commit (and one per delivery report), each costing the same statements and WAL flush
whatever it finds. Nothing is lost or reordered by the wait: the rows committed meanwhile go
out in the next pass.

A pass is counted by what every pass does and nothing else here does: it reads
eventbox.outbox_held (the read statement's held branch, the acknowledgement write), so the
table's scans count the passes (a few per pass). The messages are awaited in Kafka, not through
the eventbox.outbox view, which would scan that table too. With a pass per wake, 400 commits 5 ms
apart gave 956 scans; paced at 100 ms, 61-65 (at 50 ms: 1,025 against 112-120). The long pace
leaves room for a slower machine: sending over twice the time doubles the paced count.

The pass is the relay's one batching wait: its producer lingers 1 ms (librdkafka's linger.ms),
no longer relay_linger too. Timed from the commit to the message's arrival at a consumer
reading as it goes, with 100 ms for both 135-153 of the 400 messages arrived within 100 ms
(quartiles 75, 134 and 184 ms); with the producer at 1 ms, 302-312 (34, 66 and 97 ms)."""
import json
import time

from eventbox_fixtures import connect, report, wait_for_ids
from relay_sending import Arrivals, relay_stat, send_paced, warm_relay

SENDS = 400
RATE = 200.0  # commits a second, one row each
LINGER = "100ms"
LINGER_S = 0.1


def settled_scans(c):
    """The scans of outbox_held, the relay's counted in."""
    return relay_stat(c, "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) "
                         "FROM pg_stat_user_tables "
                         "WHERE schemaname = 'eventbox' AND relname = 'outbox_held'")


def test_one_row_commits_are_relayed_in_paced_passes(conn, new_topic, settings):
    topic = new_topic(4)
    # A change of relay_linger recreates the producer: the warm-up message waits for it.
    settings.set("eventbox.relay_linger", LINGER)
    warm_relay(conn, topic)
    c = connect(autocommit=True)
    try:
        before = settled_scans(c)
        arrivals = Arrivals(topic, 4)
        arrivals.start()
        sent_at = []
        t0 = time.monotonic()
        ids = send_paced(c, topic, SENDS, RATE, key_of=lambda i: "k%d" % (i % 20),
                         sent_at=sent_at)
        sending_s = time.monotonic() - t0
        recs = wait_for_ids(topic, ids)
        scans = settled_scans(c) - before
    finally:
        c.close()
        arrivals.stop()
    waits = sorted(arrivals.at[i] - s for i, s in zip(ids, sent_at) if i in arrivals.at)

    recs = [r for r in recs if r.message_id in set(ids)]
    assert sorted({r.message_id for r in recs}) == sorted(ids)
    seqs = {}
    for r in recs:
        seq = json.loads(r.value)["seq"]
        seqs.setdefault(r.key, []).append(seq)
    for key, got in seqs.items():
        firsts = list(dict.fromkeys(got))
        assert firsts == sorted(firsts), "key %r out of order: %r" % (key, firsts)
    report("test_one_row_commits_are_relayed_in_paced_passes", commits=SENDS,
           sending_s=round(sending_s, 2), outbox_held_scans=scans,
           arrived=len(waits), within_linger=sum(1 for w in waits if w < LINGER_S),
           quartiles_ms=[round(1000 * waits[len(waits) * q // 4]) for q in (1, 2, 3)])
    # A pass per commit scans the table at least once per commit.
    assert scans < SENDS / 2, "%d scans of outbox_held for %d commits" % (scans, SENDS)
    # The producer adds no relay_linger of its own: a message committed just before a pass is
    # in Kafka well within it.
    assert len(waits) == SENDS
    within = sum(1 for w in waits if w < LINGER_S)
    assert within >= SENDS // 2, (
        "%d of %d messages in Kafka within %s of their commit" % (within, SENDS, LINGER))
