"""Handler workers killed: exactly-once effects and nothing lost.

Every SIGKILL of a server process makes the postmaster restart the whole
server (crash recovery): the killed pid goes to $EVENTBOX_KILLED_PIDS first
(eventbox_fixtures.sigkill) so that the run's log scan accepts the crash."""

import time
import uuid

from eventbox_fixtures import LogWatcher, query, query_one, report, sigkill, wait_until
from eventbox_handler_lib import Msg, duplicate_runs, handler_pids, inbox_status, \
    ledger_figures, produce, retry_conn, show_duplicates, wait_settled, wait_workers


def eventbox_pids(c):
    return [r[0] for r in query(c, "SELECT pid FROM pg_stat_activity "
                                   "WHERE backend_type LIKE 'eventbox %%'")]


def crasher_running_or_dead(sub, message_id):
    """("running", pid) once a handler worker runs CRASHY_DDL's crasher `message_id` (asleep in
    it), or ("dead", None) once the crasher is dead."""
    def probe(c):
        rows = query(c, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventbox handler' "
                        "AND application_name = %s AND wait_event = 'PgSleep'",
                     ("eventbox-crasher " + message_id,))
        if rows:
            return ("running", rows[0][0])
        if query_one(c, "SELECT status FROM eventbox.inbox WHERE subscription = %s AND "
                        "message_id = %s", (sub, message_id)) == "dead":
            return ("dead", None)
        return None
    return wait_until(lambda: retry_conn(probe), 90, what="the crasher to run again (or go dead)")


# 7 ---------------------------------------------------------------------------

SLOW_LEDGER_DDL = """
CREATE TABLE {s}.ledger (message_id text, seq int, attempts int, pid int,
                         at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.ledger (message_id, seq, attempts, pid)
    VALUES (msg.message_id, (msg.payload->>'seq')::int, msg.attempts, pg_backend_pid());
    PERFORM pg_sleep(0.001);    -- ~10 s of handling for 20k messages on 2 workers
END $$;
"""


def test_sigkill_handler_workers_ledger_exactly_once(case):
    """20k messages on 8 partitions; a handler worker is SIGKILLed 3 times while
    they are handled (at ~20 %, ~45 % and ~70 %): at the end every message is
    'processed' and the ledger (no unique key) has exactly one row per message."""
    hc = case(8)
    hc.setup(SLOW_LEDGER_DDL, max_attempts=10, backoff="50 ms", backoff_max="200 ms")
    total = 20000
    msgs = [Msg(str(uuid.uuid4()), i % 8, "k%d" % (i % 400), {"seq": i}, "Slow")
            for i in range(total)]
    log = LogWatcher()
    t0 = time.monotonic()
    produce(hc.topic, msgs)

    kills = []     # (pid, processed when killed, seconds until the workers were back)
    for fraction in (0.20, 0.45, 0.70):
        def reached(c, target=int(total * fraction)):
            st = inbox_status(c, hc.sub)
            return st if st.get("processed", 0) >= target else None
        wait_until(lambda: retry_conn(reached), 120,
                   what="%d%% of the messages to be processed" % (fraction * 100))
        old = retry_conn(eventbox_pids)
        pids = retry_conn(handler_pids)
        assert pids, "no handler worker to kill"
        pid = pids[len(kills) % len(pids)]
        processed_at_kill = retry_conn(lambda c: inbox_status(c, hc.sub)).get("processed", 0)
        sigkill(pid)
        t_kill = time.monotonic()
        wait_workers(timeout=120, not_pids=old)
        kills.append((pid, processed_at_kill, time.monotonic() - t_kill))
        assert processed_at_kill < total, "the kill came after the work was done"

    status = wait_settled(hc.sub, total, timeout=240)
    elapsed = time.monotonic() - t0

    def check(c):
        return (ledger_figures(c, hc.q("{s}.ledger"), [m.mid for m in msgs]),
                dict(query(c, "SELECT attempts, count(*) FROM eventbox.inbox "
                              "WHERE subscription = %s GROUP BY 1", (hc.sub,))),
                query(c, "SELECT message_id, status, attempts, last_error FROM eventbox.inbox "
                         "WHERE subscription = %s AND status <> 'processed' LIMIT 5",
                      (hc.sub,)),
                duplicate_runs(c, hc.q("{s}.ledger")))

    (rows, distinct, lost, dups, unexpected), attempts, not_processed, dup_runs = \
        retry_conn(check)
    show_duplicates(dup_runs)
    crashes = [ln for ln in log.lines(r"terminated by signal 9")]
    report("handler_sigkill_x3", messages=total, kills=len(kills),
           killed="; ".join("pid %d at %d processed, back in %.1f s" % k for k in kills),
           ledger_rows=rows, distinct=distinct, lost=lost, duplicated=dups,
           unexpected=unexpected, inbox=status, attempts=attempts, total_s="%.1f" % elapsed)
    assert len(kills) == 3
    assert len(crashes) >= 3, crashes
    assert not_processed == []
    assert status == {"processed": total}
    assert lost == 0
    assert unexpected == 0
    assert dups == 0, "\n".join(dup_runs)
    assert rows == distinct == total
    # messages of the killed passes were attempted again, the others once
    assert max(attempts) <= 1 + len(kills), attempts


# 8 ---------------------------------------------------------------------------

CRASHY_DDL = """
CREATE TABLE {s}.ledger (message_id text, seq int, part int, attempts int, pid int,
                         at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.ledger (message_id, seq, part, attempts, pid)
    VALUES (msg.message_id, (msg.payload->>'seq')::int, msg."partition", msg.attempts,
            pg_backend_pid());
    IF (msg.payload->>'crash')::boolean THEN
        -- tell the test which backend runs the crasher, then wait to be killed
        PERFORM set_config('application_name', 'eventbox-crasher ' || msg.message_id, true);
        PERFORM pg_sleep(25);
    END IF;
END $$;
"""


def test_handler_crashing_backend_goes_dead_after_max_attempts(case):
    """A handler that crashes its backend at every attempt goes 'dead' after
    max_attempts crashes ("attempt N never finished"), without running again;
    the messages that were in the crashed passes with it (other lanes, and the
    earlier messages of its own lane) are processed exactly once.

    A non-superuser handler cannot kill its own backend (pg_terminate_backend
    of a worker is refused, COPY TO PROGRAM is superuser-only), so the
    crasher announces itself in application_name, sleeps, and the test
    SIGKILLs that worker: the same crash from the worker's point of view."""
    hc = case(4)
    max_attempts = 3
    hc.setup(CRASHY_DDL, max_attempts=max_attempts, backoff="50 ms", backoff_max="200 ms",
             register=False, unhandled="keep")
    msgs = [Msg(str(uuid.uuid4()), i % 4, "k%d" % (i % 11), {"seq": i, "crash": i == 4 * 10},
                "Crashy") for i in range(4 * 40)]
    crasher = next(m for m in msgs if m.payload["crash"])
    others = [m.mid for m in msgs if m is not crasher]
    produce(hc.topic, msgs)
    # all stored before the handler exists: the first passes are full and mixed
    wait_until(lambda: retry_conn(lambda c: inbox_status(c, hc.sub)) == {"received": len(msgs)},
               60, what="the messages to wait in the inbox")
    log = LogWatcher()
    t0 = time.monotonic()
    hc.register()

    def crasher_state(c):
        return query(c, "SELECT status, attempts, last_error FROM eventbox.inbox "
                        "WHERE subscription = %s AND message_id = %s", (hc.sub, crasher.mid))[0]

    # (pid, the crasher's attempts before the kill, whether its lane's claim (committed before the
    # run) held it with those attempts, messages claimed but unfinished)
    kills = []
    while True:
        what, pid = crasher_running_or_dead(hc.sub, crasher.mid)
        if what == "dead":
            break
        assert len(kills) < max_attempts, \
            "the crasher ran a %d-th time with max_attempts = %d" % (len(kills) + 1, max_attempts)
        # the attempt was claimed (and committed) before the handler ran
        before = retry_conn(crasher_state)[1]
        claimed = retry_conn(lambda c: query_one(
            c, "SELECT count(*) FROM eventbox.handler_claims c, "
               "unnest(c.message_ids, c.attempts) AS u(id, attempts) "
               "WHERE c.subscription = %s AND u.id = %s AND u.attempts = %s",
            (hc.sub, crasher.mid, before))) == 1
        in_pass = retry_conn(lambda c: query_one(
            c, "SELECT count(*) FROM eventbox.handler_claims c, "
               "unnest(c.message_ids, c.attempts) AS u(id, attempts) "
               "JOIN eventbox.inbox i ON i.message_id = u.id AND i.attempts = u.attempts "
               "WHERE c.subscription = %s AND i.subscription = c.subscription "
               "AND i.status IN ('received', 'retry')", (hc.sub,)))
        old = retry_conn(eventbox_pids)
        sigkill(pid)
        kills.append((pid, before, claimed, in_pass))
        wait_workers(timeout=120, not_pids=old)

    status = wait_settled(hc.sub, len(msgs), timeout=120)
    elapsed = time.monotonic() - t0

    def check(c):
        return (crasher_state(c),
                ledger_figures(c, hc.q("{s}.ledger"), others),
                query(c, "SELECT message_id, status, attempts, last_error FROM eventbox.inbox "
                         "WHERE subscription = %s AND status <> 'processed' "
                         "AND message_id <> %s", (hc.sub, crasher.mid)),
                dict(query(c, "SELECT attempts, count(*) FROM eventbox.inbox "
                              "WHERE subscription = %s AND message_id <> %s GROUP BY 1",
                           (hc.sub, crasher.mid))),
                duplicate_runs(c, hc.q("{s}.ledger")))

    (c_status, c_attempts, c_error), (rows, distinct, lost, dups, unexpected), \
        others_not_processed, other_attempts, dup_runs = retry_conn(check)
    show_duplicates(dup_runs)
    crashes = log.lines(r"terminated by signal 9")
    report("handler_crasher", messages=len(msgs), kills=len(kills),
           killed="; ".join("pid %d after %d attempt(s), claimed %s, %d claimed unfinished "
                            "message(s)" % k for k in kills),
           crasher=(c_status, c_attempts), others_ledger_rows=rows, lost=lost, duplicated=dups,
           unexpected=unexpected, other_attempts=other_attempts, inbox=status,
           total_s="%.1f" % elapsed)
    assert [k[1] for k in kills] == list(range(max_attempts)), \
        "the crasher's attempts before each crash: %r" % kills
    assert all(k[2] for k in kills), "a run without the crasher's claim committed: %r" % kills
    assert kills[0][3] > 1, "the first crash did not hit other messages with the crasher"
    assert len(crashes) >= max_attempts, crashes
    assert c_status == "dead"
    assert c_attempts == max_attempts
    assert c_error is not None and "never finished" in c_error and "crashed" in c_error, c_error
    assert others_not_processed == []
    # Messages a crash cut short run alone and one at a time in the database, so the crasher's
    # later crashes never hit another of them: another message loses at most the one attempt it
    # had in the first crashed pass, then runs once.
    assert max(other_attempts) <= 2, other_attempts
    assert status == {"processed": len(msgs) - 1, "dead": 1}
    assert (lost, unexpected) == (0, 0)
    assert dups == 0, "\n".join(dup_runs)
    assert rows == distinct == len(others)


# 9 ---------------------------------------------------------------------------


def test_crash_counts_only_the_run_transaction_in_flight(case):
    """200 messages of one lane waiting before the handler exists: the first pass
    takes them all and runs them in transactions of 64. The crasher (offset 100)
    runs in the second one and its backend is SIGKILLed. The attempt the crash
    cut short counts for the messages of that transaction only: those the pass
    had not started (offsets 128 and up) keep their attempt and run once, as do
    those of the first transaction, which committed (before 0.6.0 every message
    of the pass still waiting was counted and ran alone)."""
    hc = case(1)
    hc.setup(CRASHY_DDL, max_attempts=2, backoff="50 ms", backoff_max="200 ms",
             register=False, unhandled="keep")
    total, crash_at = 200, 100
    msgs = [Msg(str(uuid.uuid4()), 0, "k%d" % (i % 7), {"seq": i, "crash": i == crash_at},
                "Crashy") for i in range(total)]
    produce(hc.topic, msgs)
    wait_until(lambda: retry_conn(lambda c: inbox_status(c, hc.sub)) == {"received": total},
               60, what="the messages to wait in the inbox")
    hc.register()
    kills = 0
    while True:
        what, pid = crasher_running_or_dead(hc.sub, msgs[crash_at].mid)
        if what == "dead":
            break
        assert kills < 2, "the crasher ran a third time with max_attempts = 2"
        # The earlier run transactions commit asynchronously: the WAL writer has them on disk
        # within wal_writer_delay (200 ms), so the crash finds them committed.
        time.sleep(1.0)
        old = retry_conn(eventbox_pids)
        sigkill(pid)
        kills += 1
        wait_workers(timeout=120, not_pids=old)
    assert wait_settled(hc.sub, total, timeout=120) == {"processed": total - 1, "dead": 1}

    def attempts_by_offset(c):
        return dict(query(c, 'SELECT "offset", attempts FROM eventbox.inbox '
                             'WHERE subscription = %s AND message_id <> %s',
                          (hc.sub, msgs[crash_at].mid)))
    attempts = retry_conn(attempts_by_offset)
    counted = sorted(o for o, a in attempts.items() if a > 1)
    report("handler_crash_in_flight", messages=total, kills=kills,
           counted_by_the_crash=len(counted),
           counted_offsets="%s..%s" % (counted[0], counted[-1]) if counted else "-")
    assert kills == 2
    assert set(attempts.values()) <= {1, 2}, attempts
    # The crashed transaction's other messages, and only those: at most 63, within 64
    # consecutive offsets around the crasher; nothing the pass had not started.
    assert 0 < len(counted) <= 63, counted
    assert counted[0] <= crash_at <= counted[-1] and counted[-1] - counted[0] < 64, counted
    assert all(attempts[o] == 1 for o in range(128, total)), \
        [o for o in range(128, total) if attempts[o] != 1]
