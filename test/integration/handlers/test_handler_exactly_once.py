"""Handlers have exactly-once effects: one ledger row per distinct message,
whatever Kafka redelivers, and they run as their run_as role.

Messages come from Kafka (kafka-python producer, headers message_id and
event_type) through the ingest worker into eventbox.inbox; the handler workers
run the registered plpgsql handler on them."""

import random
import time
import uuid

from eventbox_fixtures import query, query_one, report, wait_until
from eventbox_handler_lib import RUN_AS, Msg, duplicate_runs, handler_pids, inbox_status, \
    ledger_figures, produce, retry_conn, show_duplicates, wait_settled, wait_workers


LEDGER_DDL = """
CREATE TABLE {s}.ledger (            -- no unique key on purpose: duplicates would show
    message_id text,
    seq        int,
    run_as     name,
    session_as name,
    search     text,
    attempts   int,
    sub        text,
    pid        int,
    at         timestamptz DEFAULT clock_timestamp()
);
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.ledger (message_id, seq, run_as, session_as, search, attempts, sub, pid)
    VALUES (msg.message_id, (msg.payload->>'seq')::int, current_user, session_user,
            current_setting('search_path'), msg.attempts, msg.subscription, pg_backend_pid());
END $$;
"""


# 1 ---------------------------------------------------------------------------

def test_ledger_exactly_once_20k_with_redeliveries(case):
    """20k messages on 8 partitions plus 2k redeliveries (the same message_id
    produced again: 1k right behind their original, 1k after everything): one
    ledger row per distinct message, every inbox row 'processed'.

    The first 15k wait in the inbox (unhandled => 'keep') until the handler is
    registered, so that the workers start on a backlog of full lanes (where
    they compete for lanes at every pass); the other 5k and the late
    redeliveries arrive while they work it off."""
    hc = case(8)
    hc.setup(LEDGER_DDL, event_type="LedgerEvent", register=False, unhandled="keep")
    total, n_keys = 20000, 500
    rng = random.Random(20000)
    msgs = []
    for i in range(total):
        key = "k%d" % (i % n_keys)
        msgs.append(Msg(str(uuid.uuid4()), i % 8, key, {"seq": i, "key": key}, "LedgerEvent"))
    soon = set(rng.sample(range(total), 1000))
    late = rng.sample(range(total), 1000)

    def with_soon(lo, hi):
        out = []
        for i in range(lo, hi):
            out.append(msgs[i])
            if i in soon:
                out.append(msgs[i])       # redelivered right away
        return out

    expected_ids = [m.mid for m in msgs]
    t0 = time.monotonic()
    backlog = total * 3 // 4
    produced = produce(hc.topic, with_soon(0, backlog))
    # backlog: stored, not handled (no handler yet)
    wait_until(lambda: retry_conn(lambda c: inbox_status(c, hc.sub)) == {"received": backlog},
               120, what="the first %d messages to wait in the inbox" % backlog)
    hc.register()
    t1 = time.monotonic()
    produced += produce(hc.topic, with_soon(backlog, total))
    produced += produce(hc.topic, [msgs[i] for i in late])   # redelivered after everything
    status = wait_settled(hc.sub, total, timeout=240)
    # The late redeliveries add no row to wait for: wait until ingest has read them too (their
    # batches, all duplicates, are compared with the stored rows for conflicts).
    wait_until(lambda: retry_conn(lambda c: query_one(
        c, "SELECT sum(next_offset) FROM eventbox.offsets WHERE subscription = %s",
        (hc.sub,))) == produced, 120, what="the offsets to cover every produced record")
    handled_s = time.monotonic() - t1

    def check(c):
        rows, distinct, lost, dups, unexpected = ledger_figures(c, hc.q("{s}.ledger"),
                                                                expected_ids)
        bad_seq = query_one(c, hc.q("""
            SELECT count(*) FROM {s}.ledger l JOIN eventbox.inbox i
                ON i.subscription = '{sub}' AND i.message_id = l.message_id
             WHERE l.seq IS DISTINCT FROM (i.payload->>'seq')::int"""))
        stored = query_one(c, "SELECT sum(next_offset) FROM eventbox.offsets "
                              "WHERE subscription = %s", (hc.sub,))
        pids = query_one(c, hc.q("SELECT count(DISTINCT pid) FROM {s}.ledger"))
        not_processed = query(c, "SELECT message_id, status, attempts, last_error "
                                 "FROM eventbox.inbox WHERE subscription = %s "
                                 "AND status <> 'processed' LIMIT 5", (hc.sub,))
        attempts = dict(query(c, "SELECT attempts, count(*) FROM eventbox.inbox "
                                 "WHERE subscription = %s GROUP BY 1", (hc.sub,)))
        dup_rows = duplicate_runs(c, hc.q("{s}.ledger"))
        return (rows, distinct, lost, dups, unexpected, bad_seq, stored, pids, not_processed,
                attempts, dup_rows)

    (rows, distinct, lost, dups, unexpected, bad_seq, stored, pids, not_processed, attempts,
     dup_rows) = retry_conn(check)
    report("handler_ledger_20k", messages=total, produced=produced, ledger_rows=rows,
           distinct=distinct, lost=lost, duplicated=dups, unexpected=unexpected,
           inbox=status, attempts=attempts, worker_pids=pids,
           handled_s="%.1f" % handled_s, total_s="%.1f" % (time.monotonic() - t0))
    show_duplicates(dup_rows)
    assert produced == total + 2000
    assert stored == total + 2000, "offsets do not cover every produced record"
    assert not_processed == []
    assert status == {"processed": total}
    assert (lost, dups, unexpected) == (0, 0, 0), "\n".join(dup_rows)
    assert rows == distinct == total
    assert bad_seq == 0
    assert attempts == {1: total}, "a message was attempted more than once"


# 2 ---------------------------------------------------------------------------

def test_handler_runs_as_run_as_role(case):
    """The handler sees current_user = its run_as role (not the worker's
    superuser), search_path pinned to "$user", public, pg_temp, and its own inbox row
    (attempt already counted)."""
    hc = case(4)
    hc.setup(LEDGER_DDL, event_type="WhoAmI")
    msgs = [Msg(str(uuid.uuid4()), i % 4, "k%d" % (i % 7), {"seq": i}, "WhoAmI")
            for i in range(200)]
    # other event types have no handler: ignored, never run
    others = [Msg(str(uuid.uuid4()), i % 4, "k", {"seq": -1}, "SomethingElse")
              for i in range(20)]
    produce(hc.topic, msgs + others)
    status = wait_settled(hc.sub, len(msgs) + len(others), timeout=120)

    def check(c):
        return (query(c, hc.q("SELECT run_as, session_as, search, attempts, sub, count(*) "
                              "FROM {s}.ledger GROUP BY 1, 2, 3, 4, 5")),
                ledger_figures(c, hc.q("{s}.ledger"), [m.mid for m in msgs]),
                query_one(c, "SELECT rolsuper FROM pg_roles WHERE rolname = %s", (RUN_AS,)))

    groups, (rows, distinct, lost, dups, unexpected), superuser = retry_conn(check)
    show_duplicates(retry_conn(lambda c: duplicate_runs(c, hc.q("{s}.ledger"))))
    report("handler_run_as", messages=len(msgs), ledger_rows=rows, lost=lost, duplicated=dups,
           unexpected=unexpected, seen=groups, inbox=status)
    assert superuser is False
    assert status == {"processed": len(msgs), "ignored": len(others)}
    assert (lost, dups, unexpected) == (0, 0, 0)
    assert len(groups) == 1, groups
    run_as, _session_as, search, attempts, sub, n = groups[0]
    assert run_as == RUN_AS
    assert search == '"$user", public, pg_temp'
    assert attempts == 1
    assert sub == hc.sub
    assert n == len(msgs)


# 1b --------------------------------------------------------------------------

def test_restarted_handler_workers_exactly_once_on_backlog(case):
    """The handler workers are terminated (pg_terminate_backend; the launcher
    starts new ones) while a backlog waits: the new workers' first passes have
    work at once. Still one ledger row per message, one attempt each."""
    hc = case(4)
    hc.setup(LEDGER_DDL, event_type="Backlog", register=False, unhandled="keep")
    msgs = [Msg(str(uuid.uuid4()), i % 4, "k%d" % (i % 50), {"seq": i}, "Backlog")
            for i in range(2000)]
    produce(hc.topic, msgs)
    wait_until(lambda: retry_conn(lambda c: inbox_status(c, hc.sub)) == {"received": len(msgs)},
               60, what="the backlog to wait in the inbox")

    def terminate(c):
        pids = handler_pids(c)
        for pid in pids:
            assert query_one(c, "SELECT pg_terminate_backend(%s)", (pid,)) is True
        return pids

    old = retry_conn(terminate)
    # registered while the new workers are not there yet (the launcher waits >= 1 s)
    hc.register()
    new = wait_workers(timeout=60, not_pids=old)
    status = wait_settled(hc.sub, len(msgs), timeout=120)

    def check(c):
        return (ledger_figures(c, hc.q("{s}.ledger"), [m.mid for m in msgs]),
                dict(query(c, "SELECT attempts, count(*) FROM eventbox.inbox "
                              "WHERE subscription = %s GROUP BY 1", (hc.sub,))),
                query_one(c, hc.q("SELECT array_agg(DISTINCT pid) FROM {s}.ledger")),
                duplicate_runs(c, hc.q("{s}.ledger")))

    (rows, distinct, lost, dups, unexpected), attempts, pids, dup_runs = retry_conn(check)
    show_duplicates(dup_runs)
    report("handler_restart_backlog", messages=len(msgs), old_workers=old, new_workers=new,
           ran_in=pids, ledger_rows=rows, lost=lost, duplicated=dups, unexpected=unexpected,
           inbox=status, attempts=attempts)
    assert set(pids) <= set(new)
    assert status == {"processed": len(msgs)}
    assert (lost, unexpected) == (0, 0)
    assert dups == 0, "\n".join(dup_runs)
    assert attempts == {1: len(msgs)}
