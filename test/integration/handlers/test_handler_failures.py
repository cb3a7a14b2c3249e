"""Failing handlers: a raising handler is rolled back alone, retried with
backoff and set 'dead' after exactly max_attempts attempts, its error kept; a
handler running past eventbox.handler_timeout is cancelled, counted as a
failed attempt, and does not stop the other lanes."""

import threading
import time
import uuid

from eventbox_fixtures import query, report
from eventbox_handler_lib import Msg, Producer, duplicate_runs, ledger_figures, produce, \
    retry_conn, show_duplicates, wait_settled


# 3 ---------------------------------------------------------------------------

POISON_DDL = """
CREATE TABLE {s}.ledger (message_id text, seq int, attempts int, pid int,
                         at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- the row is written before the failure: it must be rolled back with it
    INSERT INTO {s}.ledger (message_id, seq, attempts, pid)
    VALUES (msg.message_id, (msg.payload->>'seq')::int, msg.attempts, pg_backend_pid());
    IF (msg.payload->>'poison')::boolean THEN
        RAISE EXCEPTION 'poison message % (seq %)', msg.message_id, msg.payload->>'seq'
            USING DETAIL = 'rejected by the test handler';
    END IF;
END $$;
"""


def test_poison_messages_dead_after_max_attempts(case):
    """Poison messages (the handler raises for them) end 'dead' after exactly
    max_attempts attempts with their error text; every other message, the
    later ones of the poison messages' partitions included, is processed once
    and has no failed attempt."""
    hc = case(4)
    max_attempts = 4
    hc.setup(POISON_DDL, max_attempts=max_attempts, backoff="50 ms", backoff_max="200 ms")
    msgs = [Msg(str(uuid.uuid4()), i % 4, "k%d" % (i % 13),
                {"seq": i, "poison": i % 25 == 7}, "Order") for i in range(600)]
    poison = {m.mid: m.payload["seq"] for m in msgs if m.payload["poison"]}
    good = [m.mid for m in msgs if not m.payload["poison"]]
    t0 = time.monotonic()
    produce(hc.topic, msgs)
    status = wait_settled(hc.sub, len(msgs), timeout=120)
    elapsed = time.monotonic() - t0

    def check(c):
        return (query(c, "SELECT message_id, status, attempts, last_error, next_attempt_at "
                         "FROM eventbox.inbox WHERE subscription = %s", (hc.sub,)),
                ledger_figures(c, hc.q("{s}.ledger"), good),
                query(c, hc.q("SELECT count(*) FROM {s}.ledger WHERE message_id = ANY(%s)"),
                      (list(poison),))[0][0],
                duplicate_runs(c, hc.q("{s}.ledger")))

    rows, (ledger_rows, distinct, lost, dups, unexpected), poison_rows, dup_runs = \
        retry_conn(check)
    show_duplicates(dup_runs)
    by_id = {r[0]: r for r in rows}
    dead = {mid for mid, r in by_id.items() if r[1] == "dead"}
    wrong_attempts = sorted((r[0], r[2]) for r in rows
                            if r[0] in poison and r[2] != max_attempts)
    report("handler_poison", messages=len(msgs), poison=len(poison), dead=len(dead),
           ledger_rows=ledger_rows, lost=lost, duplicated=dups, unexpected=unexpected,
           poison_ledger_rows=poison_rows, inbox=status, settled_s="%.1f" % elapsed)
    assert dead == set(poison), "dead messages are not the poison messages"
    assert status == {"processed": len(good), "dead": len(poison)}
    assert wrong_attempts == [], "dead after other than max_attempts=%d attempts" % max_attempts
    for mid, seq in poison.items():
        _, _, attempts, last_error, next_at = by_id[mid]
        assert last_error is not None and last_error.startswith("P0001: "), last_error
        assert "poison message %s (seq %d)" % (mid, seq) in last_error, last_error
        assert "rejected by the test handler" in last_error, last_error
        assert next_at is None
    assert poison_rows == 0, "a failed attempt's effects were not rolled back"
    assert (lost, dups, unexpected) == (0, 0, 0), "\n".join(dup_runs)
    assert all(by_id[m][2] == 1 for m in good), "a good message was attempted twice"
    assert all(by_id[m][3] is None for m in good)
    # backoff 50 ms .. 200 ms: 24 poison messages x 3 waits stay well under this
    assert elapsed < 60


# 5 ---------------------------------------------------------------------------

SLEEPY_DDL = """
CREATE TABLE {s}.ledger (message_id text, part int, attempts int, pid int,
                         at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.ledger (message_id, part, attempts, pid)
    VALUES (msg.message_id, msg."partition", msg.attempts, pg_backend_pid());
    IF msg.payload ? 'sleep' THEN
        PERFORM pg_sleep((msg.payload->>'sleep')::float8);
    END IF;
END $$;
"""


class Sampler(threading.Thread):
    """Samples every 100 ms whether a handler worker sleeps in pg_sleep and
    how many messages of the partitions other than 0 are processed."""

    def __init__(self, sub):
        super().__init__(daemon=True)
        self.sub = sub
        self.samples = []   # (t, sleeping, processed in partitions <> 0)
        self.stop = threading.Event()
        self.error = None

    def run(self):
        try:
            from eventbox_fixtures import connect
            c = connect()
            while not self.stop.is_set():
                sleeping = query(c, "SELECT count(*) FROM pg_stat_activity "
                                    "WHERE backend_type = 'eventbox handler' "
                                    "AND wait_event = 'PgSleep'")[0][0]
                done = query(c, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s "
                                "AND \"partition\" <> 0 AND status = 'processed'",
                             (self.sub,))[0][0]
                self.samples.append((time.monotonic(), sleeping, done))
                time.sleep(0.1)
            c.close()
        except Exception as e:
            self.error = e


def test_handler_timeout_cancels_and_other_lanes_flow(case, settings):
    """With eventbox.handler_timeout = 1s, a handler sleeping 20 s is cancelled
    after ~1 s at every attempt (last_error names handler_timeout, attempts
    counted) until it is dead; meanwhile the messages of the other partitions
    keep being processed (sampled: processed count rising while a handler
    worker sits in pg_sleep)."""
    settings.set("eventbox.handler_timeout", "1s")
    hc = case(4)
    max_attempts = 3
    hc.setup(SLEEPY_DDL, max_attempts=max_attempts, backoff="50 ms", backoff_max="200 ms")
    # two sleepers at the head of partition 0, and messages behind them
    sleepers = [Msg(str(uuid.uuid4()), 0, "s", {"sleep": 20}, "Slow") for _ in range(2)]
    behind = [Msg(str(uuid.uuid4()), 0, "b%d" % i, {"n": i}, "Fast") for i in range(20)]

    def sleepers_done(c):
        rows = query(c, "SELECT status FROM eventbox.inbox WHERE subscription = %s "
                        "AND message_id = ANY(%s)", (hc.sub, [m.mid for m in sleepers]))
        return len(rows) == 2 and all(r[0] == "dead" for r in rows)

    sampler = Sampler(hc.sub)
    sampler.start()
    try:
        t0 = time.monotonic()
        produce(hc.topic, sleepers + behind)
        # the other partitions get a steady stream while partition 0 is stuck, until
        # both sleepers are dead (2 x 3 attempts of ~1 s; 2 x 3 x 20 s without the timeout)
        others = []
        producer = Producer()
        dead_s = None
        try:
            while time.monotonic() < t0 + 40:
                if retry_conn(sleepers_done):
                    dead_s = time.monotonic() - t0
                    break
                batch = [Msg(str(uuid.uuid4()), 1 + (len(others) + i) % 3, "o%d" % i,
                             {"n": i}, "Fast") for i in range(15)]
                producer.send(hc.topic, batch)
                others += batch
                time.sleep(0.2)
        finally:
            producer.close()
        assert dead_s is not None, "sleepers not dead after 40 s: not cancelled at the timeout?"
        total = len(sleepers) + len(behind) + len(others)
        status = wait_settled(hc.sub, total, timeout=60)
    finally:
        sampler.stop.set()
        sampler.join(10)
    assert sampler.error is None, sampler.error

    def check(c):
        return (query(c, "SELECT message_id, status, attempts, last_error FROM eventbox.inbox "
                         "WHERE subscription = %s AND message_id = ANY(%s)",
                      (hc.sub, [m.mid for m in sleepers])),
                ledger_figures(c, hc.q("{s}.ledger"), [m.mid for m in behind + others]),
                duplicate_runs(c, hc.q("{s}.ledger")))

    rows, (ledger_rows, distinct, lost, dups, unexpected), dup_runs = retry_conn(check)
    show_duplicates(dup_runs)
    # progress of the other partitions while a handler was asleep
    s = sampler.samples
    asleep_s = sum(b[0] - a[0] for a, b in zip(s, s[1:]) if a[1] and b[1])
    progress_asleep = sum(b[2] - a[2] for a, b in zip(s, s[1:]) if a[1] and b[1])
    report("handler_timeout", sleepers=len(sleepers), others=len(others) + len(behind),
           dead_after_s="%.1f" % dead_s, observed_asleep_s="%.1f" % asleep_s,
           processed_while_asleep=progress_asleep, ledger_rows=ledger_rows, lost=lost,
           duplicated=dups, unexpected=unexpected, inbox=status)
    for mid, st, attempts, last_error in rows:
        assert st == "dead"
        assert attempts == max_attempts
        assert last_error is not None and "handler_timeout" in last_error, last_error
        assert last_error.startswith("57014"), last_error
    # 2 sleepers x 3 attempts, cancelled after ~1 s each (20 s each without the timeout)
    assert dead_s < 25, "sleepers were not cancelled at eventbox.handler_timeout"
    assert asleep_s >= 3.0, "the sampler hardly saw a handler asleep: %r" % s[:50]
    assert progress_asleep >= 50, \
        "other partitions did not progress while a handler slept (%d in %.1f s)" % (
            progress_asleep, asleep_s)
    assert status == {"processed": len(behind) + len(others), "dead": len(sleepers)}
    assert (lost, dups, unexpected) == (0, 0, 0), "\n".join(dup_runs)
