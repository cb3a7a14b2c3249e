"""Handler outcomes commit asynchronously (synchronous_commit = off for the
transaction holding a batch's effects and processed marks; only the pass's
claim on its messages, committed before the handlers run, is synchronous). A crash may then
lose an outcome transaction that had committed: its effects and its
processed marks must vanish together, and the messages must run again, so
that every message still has its effects exactly once.

The test widens the window (wal_writer_delay = 10s: a partly filled WAL page
is written only that often), lets a handler append to a ledger without unique
keys (and send one output message per input, whose publication must follow
the same rule as the ledger row), and crashes the server by SIGKILLing a
handler worker while the messages are being handled, right after reading
which messages are 'processed'. A message seen 'processed' before a crash and
found unprocessed or attempted again after it lost its processed mark to the
crash; the crash is repeated a few times at most until some mark is lost, and
the count is reported (not asserted: see the end of the test)."""

import os
import signal
import time
import uuid

from eventbox_fixtures import connect, env, query, read_topic, report, wait_outbox_drained, \
    wait_until
from eventbox_handler_lib import Msg, duplicate_runs, handler_pids, inbox_status, \
    ledger_figures, produce, retry_conn, show_duplicates, wait_settled, wait_workers

LEDGER_SEND_DDL = """
CREATE TABLE {s}.ledger (message_id text, seq int, attempts int, pid int, out_id uuid,
                         at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.ledger (message_id, seq, attempts, pid, out_id)
    VALUES (msg.message_id, (msg.payload->>'seq')::int, msg.attempts, pg_backend_pid(),
            eventbox.send('{out}', jsonb_build_object('in', msg.message_id,
                                                       'seq', msg.payload->'seq')));
    PERFORM pg_sleep(0.002);    -- ~4 s of handling for 4k messages on 2 workers
END $$;
"""

TOTAL = 4000
KILL_AT = (0.25, 0.50, 0.65, 0.80)   # fractions processed; the later ones only if needed
MIN_KILLS = 2


def eventbox_pids(c):
    return [r[0] for r in query(c, "SELECT pid FROM pg_stat_activity "
                                   "WHERE backend_type LIKE 'eventbox %%'")]


def test_handler_outcomes_lost_in_crash_run_again(case, new_topic, settings):
    hc = case(8)
    out = new_topic(4, suffix="_out")
    hc.setup(LEDGER_SEND_DDL.replace("{out}", out), sends=True, max_attempts=10,
             backoff="50 ms", backoff_max="200 ms")
    settings.set("wal_writer_delay", "10s")
    msgs = [Msg(str(uuid.uuid4()), i % 8, "k%d" % (i % 200), {"seq": i}, "Async")
            for i in range(TOTAL)]
    t0 = time.monotonic()
    produce(hc.topic, msgs)

    kills = []            # (pid, processed seen before the kill, of them lost, back in s)
    lost_marks = {}       # seen 'processed' (at attempt n) before a crash, not after it
    for fraction in KILL_AT:
        if len(kills) >= MIN_KILLS and lost_marks:
            break

        def reached(c, target=int(TOTAL * fraction)):
            st = inbox_status(c, hc.sub)
            return st if st.get("processed", 0) >= target else None
        wait_until(lambda: retry_conn(reached), 120,
                   what="%d%% of the messages to be processed" % (fraction * 100))
        old = retry_conn(eventbox_pids)
        pids = retry_conn(handler_pids)
        assert pids, "no handler worker to kill"
        pid = pids[len(kills) % len(pids)]
        c = connect()
        try:
            # recorded beforehand: nothing but os.kill between the read and the crash
            with open(env("EVENTBOX_KILLED_PIDS"), "a") as f:
                f.write("%d\n" % pid)
            seen = dict(query(c, "SELECT message_id, attempts FROM eventbox.inbox "
                                 "WHERE subscription = %s AND status = 'processed'", (hc.sub,)))
            os.kill(pid, signal.SIGKILL)
        finally:
            try:
                c.close()
            except Exception:
                pass
        t_kill = time.monotonic()
        assert len(seen) < TOTAL, "the kill came after the work was done"
        wait_workers(timeout=120, not_pids=old)
        back = time.monotonic() - t_kill

        def lost_now(c, seen=seen):
            # not processed any more, or attempted again since: the mark was lost
            # (attempts > 1 alone is no proof: an earlier crash reran it)
            rows = query(c, "SELECT i.message_id FROM eventbox.inbox i "
                            "JOIN unnest(%s::text[], %s::int[]) AS s(id, attempts) "
                            "ON i.message_id = s.id WHERE i.subscription = %s "
                            "AND (i.status <> 'processed' OR i.attempts > s.attempts)",
                         (list(seen), list(seen.values()), hc.sub))
            return {r[0]: seen[r[0]] for r in rows}
        lost = retry_conn(lost_now)
        lost_marks.update(lost)
        kills.append((pid, len(seen), len(lost), back))
        print("kill %d: pid %d, %d seen processed before, %d of them lost their mark, "
              "workers back in %.1f s" % ((len(kills),) + kills[-1]))

    status = wait_settled(hc.sub, TOTAL, timeout=240)
    wait_outbox_drained(out, timeout=180)
    elapsed = time.monotonic() - t0
    recs = read_topic(out)

    def check(c):
        return (ledger_figures(c, hc.q("{s}.ledger"), [m.mid for m in msgs]),
                dict(query(c, "SELECT attempts, count(*) FROM eventbox.inbox "
                              "WHERE subscription = %s GROUP BY 1", (hc.sub,))),
                {r[0]: r[1] for r in query(c, "SELECT message_id, attempts FROM eventbox.inbox "
                                              "WHERE subscription = %s", (hc.sub,))},
                query(c, "SELECT message_id, status, attempts, last_error FROM eventbox.inbox "
                         "WHERE subscription = %s AND status <> 'processed' LIMIT 5",
                      (hc.sub,)),
                {r[0] for r in query(c, hc.q("SELECT out_id::text FROM {s}.ledger"))},
                duplicate_runs(c, hc.q("{s}.ledger")))

    (rows, distinct, lost, dups, unexpected), attempts, attempts_of, not_processed, \
        out_ids, dup_runs = retry_conn(check)
    show_duplicates(dup_runs)
    published = [r.message_id for r in recs]
    pub_set = set(published)
    out_not_durable = pub_set - out_ids       # published by an outcome the crash undid
    out_unpublished = out_ids - pub_set
    rerun_after_lost_mark = sum(1 for m, n in lost_marks.items() if attempts_of.get(m, 0) > n)
    report("handler_async_outcome_crash", messages=TOTAL, kills=len(kills),
           killed="; ".join("pid %d: %d seen processed, %d lost their mark, back in %.1f s" % k
                            for k in kills),
           processed_marks_lost=len(lost_marks), of_them_run_again=rerun_after_lost_mark,
           attempted_more_than_once=sum(n for a, n in attempts.items() if a > 1),
           attempts=attempts, inbox=status, ledger_rows=rows, distinct=distinct, lost=lost,
           duplicated=dups, unexpected=unexpected, out_records=len(recs),
           out_published_not_durable=len(out_not_durable),
           out_durable_not_published=len(out_unpublished),
           out_duplicated=len(published) - len(pub_set), total_s="%.1f" % elapsed)
    # NOT asserted (yet): that the crashes lost a processed mark. In the runs so far
    # none did (the relay's flush after each handler send, the synchronous attempt
    # counts and the WAL writer's full pages leave the async outcomes little time);
    # the figure processed_marks_lost says whether this run exercised that window.
    if not lost_marks:
        print("WARNING: %d crash(es) lost no processed mark: the async-outcome window was "
              "not exercised in this run" % len(kills))
    assert not_processed == []
    assert status == {"processed": TOTAL}
    assert lost == 0
    assert unexpected == 0
    assert dups == 0, "\n".join(dup_runs)
    assert rows == distinct == TOTAL
    # a message whose mark was lost ran again (the attempt it had was durable)
    assert rerun_after_lost_mark == len(lost_marks)
    assert len(out_not_durable) == 0, (
        "%d output message(s) published whose handler outcome did not survive the crash, "
        "e.g. %s" % (len(out_not_durable), sorted(out_not_durable)[:5]))
    assert len(out_unpublished) == 0, (
        "%d output message(s) of durable outcomes never published, e.g. %s"
        % (len(out_unpublished), sorted(out_unpublished)[:5]))
