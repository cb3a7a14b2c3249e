"""The handler workers' low-water marks (docs/design/handlers.md; issue 14): a worker reads a
lane from the offset below which it saw no message waiting, so that its reads do not walk the
index entries of the messages handled before. Whatever makes a message wait again below that
offset must drop the marks when it commits, or the message is left behind while later ones of
its lane run. Each test first moves a lane's mark past some offsets, then makes a message wait
there again and, at once, gives the lane later messages: the earlier message must still be
handled first (offset order), and not only after the workers' periodic drop of their marks.
Without the invalidation each of these runs the later messages first."""

import time
import uuid

from eventbox_fixtures import query, wait_until
from eventbox_handler_lib import Msg, produce, retry_conn

LEDGER_DDL = """
CREATE TABLE {s}.ledger (n bigserial, message_id text, seq int, mode text);
CREATE TABLE {s}.fixed (seq int PRIMARY KEY);
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF (msg.payload->>'poison')::boolean
       AND NOT EXISTS (SELECT 1 FROM {s}.fixed f WHERE f.seq = (msg.payload->>'seq')::int) THEN
        RAISE EXCEPTION 'poison order %', msg.payload->>'seq' USING ERRCODE = 'P0001';
    END IF;
    INSERT INTO {s}.ledger (message_id, seq, mode)
    VALUES (msg.message_id, (msg.payload->>'seq')::int, msg.mode);
END $$;
"""


def orders(first, n, poison=()):
    return [Msg(str(uuid.uuid4()), 0, "k%d" % (i % 7), {"seq": i, "poison": i in poison},
                "Order") for i in range(first, first + n)]


def statuses(c, sub):
    return dict(query(c, "SELECT message_id, status FROM eventbox.inbox WHERE subscription = %s",
                      (sub,)))


def wait_statuses(hc, want, what):
    """Waits until each message id in `want` has the status it maps to."""
    def done(c):
        st = statuses(c, hc.sub)
        return st if all(st.get(mid) == s for mid, s in want.items()) else None
    return wait_until(lambda: retry_conn(done), 120, 0.2, what)


def ledger(hc, mode=None):
    """The seqs the handler ran, in the order it ran them (optionally of one mode)."""
    rows = retry_conn(lambda c: query(c, hc.q("SELECT seq, mode FROM {s}.ledger ORDER BY n")))
    return [seq for seq, m in rows if mode is None or m == mode]


def test_redriven_and_retried_messages_below_the_mark_run_before_later_ones(case):
    """A dead message (on_dead 'continue': its lane went on, and the worker's mark moved past
    it) is redriven, then another one retried: each runs before the messages produced right
    after the operation."""
    hc = case(1)
    hc.setup(LEDGER_DDL, max_attempts=1)
    first = orders(0, 200, poison={0})
    produce(hc.topic, first)
    wait_statuses(hc, dict({m.mid: "processed" for m in first[1:]}, **{first[0].mid: "dead"}),
                  "199 processed, the poison dead")
    # More rounds, so that each handler worker has read the lane (a worker without a mark
    # reads it from its start and would find the message anyway).
    for r in range(3):
        warm = orders(1000 + 100 * r, 100)
        produce(hc.topic, warm)
        wait_statuses(hc, {m.mid: "processed" for m in warm}, "warm-up round %d" % r)

    def redrive(c):
        query(c, hc.q("INSERT INTO {s}.fixed VALUES (0)"))
        assert query(c, "SELECT eventbox.redrive(%s)", (hc.sub,))[0][0] == 1
    retry_conn(redrive)
    later = orders(200, 10, poison={205})
    produce(hc.topic, later)
    wait_statuses(hc, dict({m.mid: "processed" for m in first + later[:5] + later[6:]},
                           **{later[5].mid: "dead"}), "the redriven message and 9 later ones")
    seqs = ledger(hc)
    assert seqs.index(0) < seqs.index(200), "later messages ran before the redriven one: %r" % (
        seqs[-12:],)

    # retry() of the dead one at 205, with the mark past it (200..209 were read).
    more = orders(210, 50)
    produce(hc.topic, more)
    wait_statuses(hc, {m.mid: "processed" for m in more}, "210..259 processed")

    def retry(c):
        query(c, hc.q("INSERT INTO {s}.fixed VALUES (205)"))
        query(c, "SELECT eventbox.retry(%s, %s)", (hc.sub, later[5].mid))
    retry_conn(retry)
    last = orders(260, 10)
    produce(hc.topic, last)
    wait_statuses(hc, {m.mid: "processed" for m in last + [later[5]]},
                  "the retried message and 10 later ones")
    seqs = ledger(hc)
    assert seqs.index(205) < seqs.index(260), "later messages ran before the retried one: %r" % (
        seqs[-12:],)
    assert sorted(q for q in seqs if q < 1000) == list(range(270))
    assert sorted(q for q in seqs if q >= 1000) == list(range(1000, 1300))


def test_reprocessed_messages_below_the_replay_mark_run_in_offset_order(case):
    """reprocess() queues messages 60..149 again, in rounds (the replay range's marks move past
    them), then 0..9 and, in a later transaction, 150..159: the replays run in offset order,
    0..9 first."""
    hc = case(1)
    hc.setup(LEDGER_DDL)
    msgs = orders(0, 200)
    produce(hc.topic, msgs)
    wait_statuses(hc, {m.mid: "processed" for m in msgs}, "200 processed")

    def reprocess(ids):
        retry_conn(lambda c: query(c, "SELECT eventbox.reprocess(%s, message_ids => %s)",
                                   (hc.sub, ids)))
    # Rounds, so that each handler worker has read the replays of the lane.
    done = 0
    for lo, hi in ((60, 100), (100, 130), (130, 150)):
        reprocess([m.mid for m in msgs[lo:hi]])
        done += hi - lo
        wait_until(lambda: len(ledger(hc, "replay")) == done, 120, 0.2, "%d replays" % done)
    reprocess([m.mid for m in msgs[0:10]])
    reprocess([m.mid for m in msgs[150:160]])
    wait_until(lambda: len(ledger(hc, "replay")) == done + 20, 120, 0.2, "the last 20 replays")
    replays = ledger(hc, "replay")
    assert replays[done:] == list(range(10)) + list(range(150, 160)), replays[done:]


def test_replay_stores_purged_records_again_below_the_mark_and_they_run(case):
    """Messages 0..9 are purged (deleted) after being handled; message 200 fails and waits for
    its retry (ordering 'partition': it holds its later messages back, and every pass reads it,
    so the worker's mark stands at 200). eventbox.replay() from offset 0 makes the ingest worker
    store 0..9 again below that mark: they run before 200's retry does."""
    hc = case(1)
    hc.setup(LEDGER_DDL, backoff="4 seconds", backoff_max="4 seconds")
    msgs = orders(0, 201, poison={200})
    produce(hc.topic, msgs)
    wait_statuses(hc, dict({m.mid: "processed" for m in msgs[:200]}, **{msgs[200].mid: "retry"}),
                  "200 processed, the last one waiting for its retry")

    def purge_and_replay(c):
        query(c, hc.q("INSERT INTO {s}.fixed VALUES (200)"))
        query(c, "DELETE FROM eventbox.inbox WHERE subscription = %s AND message_id = ANY (%s)",
              (hc.sub, [m.mid for m in msgs[:10]]))
        query(c, "SELECT eventbox.replay(%s, %s, 0, 0)", (hc.sub, hc.topic))
    retry_conn(purge_and_replay)
    wait_statuses(hc, {m.mid: "processed" for m in msgs}, "the replayed records and the retry")
    seqs = ledger(hc)
    assert sorted(seqs[200:]) == list(range(10)) + [200], seqs[200:]
    assert seqs[-1] == 200, "the retry at offset 200 ran before the records stored again " \
                            "below it: %r" % (seqs[195:],)


def offsets_index_scans(c):
    """Index scans of eventbox.offsets so far (flushed by the workers at most once a second)."""
    return query(c, "SELECT coalesce(idx_scan, 0) FROM pg_stat_all_tables "
                    "WHERE relid = 'eventbox.offsets'::regclass")[0][0]


def test_an_idle_subscriptions_lanes_are_not_probed_at_every_pass(case):
    """A worker's loop runs a pass over every enabled subscription. An idle one's lanes whose
    marks reached the next offset stored (eventbox.offsets, read once per pass) are passed over
    without a probe each: before, every pass probed each of its lanes (one statement, with an
    eventbox.offsets lookup, per lane), which cost the passes over a busy subscription ~7 us per
    message per idle subscription of 128 lanes beside it. The idle one's messages stored later
    are still handled."""
    idle = case(64)
    idle.setup(LEDGER_DDL)
    produce(idle.topic, [Msg(str(uuid.uuid4()), p, "k", {"seq": p}, "Order") for p in range(64)])
    wait_until(lambda: retry_conn(lambda c: len(ledger(idle)) == 64 or None), 120, 0.2,
               "the idle subscription's 64 messages handled")
    busy = case(1)
    busy.setup(LEDGER_DDL)
    n = 20 * 1024  # >= 20 passes of at most 1,024 messages: each worker loop visits `idle` too
    time.sleep(1.5)  # the workers' statistics of the setup flushed
    before = retry_conn(offsets_index_scans)
    produce(busy.topic, orders(0, n))
    wait_until(lambda: retry_conn(lambda c: len(ledger(busy)) == n or None), 180, 0.2,
               "the busy subscription's %d messages handled" % n)
    time.sleep(1.5)
    scans = retry_conn(offsets_index_scans) - before
    print("index scans of eventbox.offsets: %d" % scans)
    # Probing the idle lanes at each pass: >= 20 x 64 = 1280. Passing over them: a read of the
    # offsets per pass and subscription, the ingest's batches, and the probes after the marks'
    # periodic drop (64 per worker every 10 s).
    assert scans < 640, "%d index scans of eventbox.offsets while %d messages were handled" % (
        scans, n)
    # Still served: messages stored in its lanes now are handled.
    produce(idle.topic, [Msg(str(uuid.uuid4()), p, "k", {"seq": 100 + p}, "Order")
                         for p in range(0, 64, 8)])
    wait_until(lambda: retry_conn(lambda c: len(ledger(idle)) == 72 or None), 60, 0.2,
               "the idle subscription's 8 later messages handled")
