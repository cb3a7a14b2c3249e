"""Batch handlers (docs/guide/handlers.md, "Batch handlers"): messages from
Kafka through the ingest worker, handled by the handler workers with one call
per chunk of a lane's messages. Each lane's effects come in offset order, each
message's exactly once, and a poison message is isolated by splitting its
chunk: it alone is retried and goes dead, its neighbours are processed."""

import time
import uuid

from eventbox_fixtures import query, query_one, report
from eventbox_handler_lib import Msg, handler_pids, inbox_status, ledger_figures, produce, \
    retry_conn, wait_settled

BATCH_LEDGER_DDL = """
CREATE TABLE {s}.ledger (n bigserial, message_id text, part int, off bigint, seq int,
                         call_size int, attempts int);
CREATE FUNCTION {s}.handle(msgs eventbox.inbox[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.ledger (message_id, part, off, seq, call_size, attempts)
    SELECT m.message_id, m."partition", m."offset", (m.payload->>'seq')::int,
           cardinality(msgs), m.attempts
      FROM unnest(msgs) WITH ORDINALITY AS m ORDER BY m.ordinality;
    IF EXISTS (SELECT FROM unnest(msgs) AS m WHERE (m.payload->>'poison')::boolean) THEN
        RAISE EXCEPTION 'poison message in the chunk';
    END IF;
END $$;
"""


def test_batch_handler_order_and_poison_isolated(case):
    """4000 messages on 4 partitions, ordering 'partition', one poison message
    in partition 1 (max_attempts 3): it goes dead after 3 attempts, alone; the
    other 3999 are processed with one ledger row each, every partition's rows
    in offset order, and the handler was called with chunks of many messages."""
    hc = case(4)
    hc.setup(BATCH_LEDGER_DDL, handler="{s}.handle(eventbox.inbox[])", batch=True,
             ordering="partition", max_attempts=3, backoff="50 ms", backoff_max="200 ms")
    total, poison_seq = 4000, 1001          # seq 1001 is in partition 1
    msgs = [Msg(str(uuid.uuid4()), i % 4, "k%d" % (i % 50),
                {"seq": i, "poison": i == poison_seq}, "Batch") for i in range(total)]
    produce(hc.topic, msgs)
    status = wait_settled(hc.sub, total, timeout=180)
    poison_id = msgs[poison_seq].mid
    good_ids = [m.mid for m in msgs if m.mid != poison_id]

    def check(c):
        figures = ledger_figures(c, hc.q("{s}.ledger"), good_ids)
        # Per partition, the ledger (in insertion order) never goes back in offset.
        out_of_order = query_one(c, hc.q("""
            SELECT count(*) FROM (
                SELECT off < lag(off) OVER (PARTITION BY part ORDER BY n) AS back
                  FROM {s}.ledger) x WHERE back"""))
        sizes = query(c, hc.q("SELECT max(call_size), avg(call_size)::numeric(6,1) "
                              "FROM {s}.ledger"))[0]
        poison = query(c, "SELECT status, attempts, last_error FROM eventbox.inbox "
                          "WHERE subscription = %s AND message_id = %s", (hc.sub, poison_id))
        attempts = dict(query(c, "SELECT attempts, count(*) FROM eventbox.inbox "
                                 "WHERE subscription = %s GROUP BY 1", (hc.sub,)))
        return figures, out_of_order, sizes, poison, attempts

    (rows, distinct, lost, dups, unexpected), out_of_order, sizes, poison, attempts = \
        retry_conn(check)
    report("batch_handler_poison", messages=total, ledger_rows=rows, lost=lost,
           duplicated=dups, unexpected=unexpected, inbox=status, out_of_order=out_of_order,
           max_call=sizes[0], avg_call=sizes[1], poison=poison, attempts=attempts)
    assert status == {"processed": total - 1, "dead": 1}, status
    assert poison[0][0] == "dead" and poison[0][1] == 3, poison
    assert "poison message in the chunk" in poison[0][2]
    assert (lost, dups, unexpected) == (0, 0, 0)
    assert rows == distinct == total - 1
    assert out_of_order == 0
    assert sizes[0] > 1, "the handler was never called with more than one message"
    # Only the poison message was attempted more than once: its neighbours in the failed
    # chunks were processed at their first attempt.
    assert attempts == {1: total - 1, 3: 1}, attempts
    assert retry_conn(lambda c: inbox_status(c, hc.sub)) == status


def wait_stored(sub, n):
    """Waits until the subscription's inbox holds at least n rows (120 s at most)."""
    deadline = time.monotonic() + 120
    while retry_conn(lambda c: query_one(c, "SELECT count(*) FROM eventbox.inbox "
                                            "WHERE subscription = %s", (sub,))) < n:
        assert time.monotonic() < deadline, "the backlog was not stored in 120 s"
        time.sleep(0.2)


def test_batch_chunks_are_not_cut_at_64_messages(case):
    """A backlog of 1000 messages in one partition, stored while no handler
    takes them (unhandled 'keep'), then a batch handler registered: a chunk
    takes one subtransaction, so a run transaction holds more than the 64
    messages a transaction of plain handlers holds, and a call gets them all
    (docs/design/handlers.md, "Batch handlers"). Every message once, in
    offset order."""
    hc = case(1)
    hc.setup(BATCH_LEDGER_DDL, handler="{s}.handle(eventbox.inbox[])", batch=True,
             register=False, unhandled="keep", ordering="partition")
    total = 1000
    msgs = [Msg(str(uuid.uuid4()), 0, "k%d" % (i % 7), {"seq": i, "poison": False}, "Batch")
            for i in range(total)]
    produce(hc.topic, msgs)

    wait_stored(hc.sub, total)
    hc.register()
    status = wait_settled(hc.sub, total, timeout=180)

    def check(c):
        figures = ledger_figures(c, hc.q("{s}.ledger"), [m.mid for m in msgs])
        out_of_order = query_one(c, hc.q("""
            SELECT count(*) FROM (SELECT off < lag(off) OVER (ORDER BY n) AS back
                                    FROM {s}.ledger) x WHERE back"""))
        max_call = query_one(c, hc.q("SELECT max(call_size) FROM {s}.ledger"))
        return figures, out_of_order, max_call

    (rows, distinct, lost, dups, unexpected), out_of_order, max_call = retry_conn(check)
    report("batch_chunks_past_64", messages=total, ledger_rows=rows, lost=lost,
           duplicated=dups, inbox=status, out_of_order=out_of_order, max_call=max_call)
    assert status == {"processed": total}, status
    assert (lost, dups, unexpected) == (0, 0, 0)
    assert rows == distinct == total
    assert out_of_order == 0
    assert max_call > 64, max_call


def handler_minor_faults(pids):
    """The minor page faults of the handler workers `pids` so far (/proc/PID/stat, field 10)."""
    total = 0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            total += int(f.read().rsplit(")", 1)[1].split()[7])
    return total


def test_batch_handler_workers_reuse_their_memory(case):
    """A batch handler's chunk of 1 KiB messages is an array of a few hundred KiB, freed at
    the end of its transaction. The handler workers keep freed memory for the next one
    (handlers/worker.cpp, keep_freed_memory()): a backlog handled after a first one costs
    fewer page faults than messages. What is left is the workers' first touch of shared
    buffers they had not mapped yet (the new rows, their new versions, the ledger): 0.47-0.57
    faults per message on a freshly started cluster. With glibc's default thresholds each
    chunk was mapped and faulted in again: 1.83-2.05 (bench/NOTEBOOK.md, 2026-11-28)."""
    hc = case(4)
    hc.setup(BATCH_LEDGER_DDL, handler="{s}.handle(eventbox.inbox[])", batch=True,
             register=False, unhandled="keep", ordering="partition")
    pad = "x" * 1000
    seq = iter(range(10 ** 6))

    def backlog(n):
        produce(hc.topic, [Msg(str(uuid.uuid4()), i % 4, "k%d" % (i % 50),
                               {"seq": next(seq), "poison": False, "pad": pad}, "Batch")
                           for i in range(n)])

    def unregister(c):
        query(c, "SELECT eventbox.unregister_handler(%s, %s::regprocedure)",
              (hc.sub, hc.q(hc.handler)))

    # A first backlog warms the workers up: their heaps grow to what a chunk takes.
    backlog(2000)
    wait_stored(hc.sub, 2000)
    hc.register()
    wait_settled(hc.sub, 2000, timeout=180)
    # The second is stored whole while no handler takes it, so that chunks are full.
    retry_conn(unregister)
    backlog(8000)
    wait_stored(hc.sub, 10000)
    pids = retry_conn(handler_pids)
    before = handler_minor_faults(pids)
    hc.register()
    status = wait_settled(hc.sub, 10000, timeout=180)
    faults = handler_minor_faults(pids) - before
    max_call = retry_conn(lambda c: query_one(c, hc.q("SELECT max(call_size) FROM {s}.ledger")))
    report("batch_handler_page_faults", messages=8000, page_faults=faults,
           per_message=round(faults / 8000, 3), max_call=max_call, inbox=status)
    assert status == {"processed": 10000}, status
    assert max_call > 64, max_call
    assert faults / 8000 < 1.0, "%d page faults for 8000 messages" % faults
