"""Batch handler workers killed: exactly-once effects and nothing lost.

Every SIGKILL of a server process makes the postmaster restart the whole
server (crash recovery): the killed pid goes to $EVENTBOX_KILLED_PIDS first
(eventbox_fixtures.sigkill) so that the run's log scan accepts the crash."""

import time
import uuid

from eventbox_fixtures import LogWatcher, query, report, sigkill, wait_until
from eventbox_handler_lib import Msg, duplicate_runs, handler_pids, inbox_status, \
    ledger_figures, produce, retry_conn, show_duplicates, wait_settled, wait_workers

SLOW_BATCH_DDL = """
CREATE TABLE {s}.ledger (message_id text, seq int, attempts int, pid int,
                         at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION {s}.handle(msgs eventbox.inbox[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.ledger (message_id, seq, attempts, pid)
    SELECT m.message_id, (m.payload->>'seq')::int, m.attempts, pg_backend_pid()
      FROM unnest(msgs) AS m;
    PERFORM pg_sleep(0.0015 * cardinality(msgs));   -- ~15 s of handling on 2 workers
END $$;
"""


def eventbox_pids(c):
    return [r[0] for r in query(c, "SELECT pid FROM pg_stat_activity "
                                   "WHERE backend_type LIKE 'eventbox %%'")]


def test_sigkill_batch_handler_workers_ledger_exactly_once(case):
    """20k messages on 8 partitions handled by a batch handler; a handler worker
    is SIGKILLed 3 times meanwhile (at ~20 %, ~45 % and ~70 %): at the end every
    message is 'processed' and the ledger (no unique key) has exactly one row
    per message."""
    hc = case(8)
    hc.setup(SLOW_BATCH_DDL, handler="{s}.handle(eventbox.inbox[])", batch=True,
             max_attempts=10, backoff="50 ms", backoff_max="200 ms")
    total = 20000
    msgs = [Msg(str(uuid.uuid4()), i % 8, "k%d" % (i % 400), {"seq": i}, "Slow")
            for i in range(total)]
    log = LogWatcher()
    t0 = time.monotonic()
    produce(hc.topic, msgs)

    kills = []
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

    def check(c):
        return (ledger_figures(c, hc.q("{s}.ledger"), [m.mid for m in msgs]),
                query(c, "SELECT message_id, status, attempts, last_error FROM eventbox.inbox "
                         "WHERE subscription = %s AND status <> 'processed' LIMIT 5",
                      (hc.sub,)),
                duplicate_runs(c, hc.q("{s}.ledger")))

    (rows, distinct, lost, dups, unexpected), not_processed, dup_runs = retry_conn(check)
    show_duplicates(dup_runs)
    crashes = [ln for ln in log.lines(r"terminated by signal 9")]
    report("batch_handler_sigkill_x3", messages=total, kills=len(kills),
           killed="; ".join("pid %d at %d processed, back in %.1f s" % k for k in kills),
           ledger_rows=rows, distinct=distinct, lost=lost, duplicated=dups,
           unexpected=unexpected, inbox=status, total_s="%.1f" % (time.monotonic() - t0))
    assert len(kills) == 3
    assert len(crashes) >= 3, crashes
    assert not_processed == []
    assert status == {"processed": total}
    assert (lost, unexpected) == (0, 0)
    assert dups == 0, "\n".join(dup_runs)
    assert rows == distinct == total
