"""RabbitMQ subscriptions and crashes: a handler worker SIGKILLed while it handles an AMQP
subscription (effects once), and the ingest worker SIGKILLed at two precise points of a batch:
before its inbox commit, and after it but before the broker took the batch's ack. Each reports
lost / duplicated counts (pika publishes).

How the ingest worker is held at a precise point, without a handler or a test hook: it stores a
batch's rows and then sets the queue's next offset in eventbox.offsets (compare-and-set) in the
same transaction. A test session holding that offsets row FOR UPDATE makes the worker wait inside
its transaction, after its inserts and before its commit (pg_stat_activity shows it waiting on a
Lock). Then:
  - before the commit: SIGKILL. The transaction never committed, the batch was never acked: the
    broker redelivers it, it is stored once.
  - after the commit, before the ack: the RabbitMQ node is stopped first, so no ack from the
    worker can reach it and the worker cannot reconnect and be redelivered the batch early. The
    test session lets go, the worker commits (the test sees the rows) and is SIGKILLed; no
    duplicate was counted before the kill. The node is started again and redelivers the batch
    (persistent messages on a durable queue, never acknowledged) whose rows committed: every
    delivery is a duplicate (eventbox_ingest_duplicates_total counts them), no row is stored
    twice. This is the state a crash between the commit and the ack leaves, reached
    deterministically (a SIGKILL racing the ack a few microseconds after the commit is not)."""
import time
import uuid

from eventbox_fixtures import (connect, query, query_one, report, sigkill, wait_until,
                               with_fresh_connection)
from test_amqp_ingest import counts, drop, fresh_queue, ingest_pids, publish, stored, subscribe


def retry(fn, timeout=120):
    """fn(connection) on a fresh connection, retried while the server restarts after a crash."""
    return with_fresh_connection(fn, timeout)


def metric(sub, name):
    return int(retry(lambda c: query_one(
        c, "SELECT coalesce(sum(value), 0) FROM eventbox.metrics WHERE name = %s "
           "AND labels->>'subscription' = %s", (name, sub))))


def waiting_on_lock(pid):
    return retry(lambda c: query_one(
        c, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)))


def hold_offsets(sub):
    """A session holding the subscription's offsets rows FOR UPDATE (its transaction open)."""
    holder = connect()
    holder.autocommit = False
    cur = holder.cursor()
    cur.execute("SELECT * FROM eventbox.offsets WHERE subscription = %s FOR UPDATE", (sub,))
    assert cur.rowcount == 1, "the queue's offsets row is not there yet"
    return holder


def set_enabled(sub, enabled):
    c = connect()
    try:
        query(c, "SELECT eventbox.alter_subscription(%s, enabled => %s)", (sub, enabled))
    finally:
        c.close()


def held_batch(rabbit, sub, queue, first, second):
    """Stores `first` (the offsets row exists after it), holds the offsets row, publishes
    `second` and waits until the ingest worker waits on the lock inside its transaction.
    Returns (holder session, worker pid)."""
    ch = rabbit.channel()
    publish(ch, queue, first)
    wait_until(lambda: set(first) <= set(stored(sub)), 120, what="the first batch stored")
    # `second` waits whole in the queue while the subscription is disabled, so that the
    # worker's next batch takes most of it at once.
    set_enabled(sub, False)
    publish(ch, queue, second)
    ch.connection.close()
    holder = hold_offsets(sub)
    set_enabled(sub, True)
    pids = ingest_pids()
    assert len(pids) == 1, pids
    wait_until(lambda: waiting_on_lock(pids[0]), 60,
               what="the ingest worker waiting on the offsets row")
    return holder, pids[0]


def test_ingest_worker_killed_before_the_inbox_commit(extension, rabbit):
    ch = rabbit.channel()
    queue = fresh_queue(ch)
    ch.connection.close()
    sub = subscribe([queue], batch_size=100)
    first = ["b%04d" % i for i in range(100)]
    second = ["c%04d" % i for i in range(100)]
    try:
        holder, pid = held_batch(rabbit, sub, queue, first, second)
        # Inside the worker's transaction: none of the second batch is visible.
        assert not set(second) & set(stored(sub))
        sigkill(pid)
        try:
            holder.close()
        except Exception:
            pass
        wait_until(lambda: set(first + second) <= set(stored(sub)), 180,
                   what="the batch redelivered and stored")
        lost, duplicated = counts(sub, first + second)
        redelivered = metric(sub, "eventbox_ingest_redelivered_total")
        report("amqp ingest worker SIGKILLed before the inbox commit", sent=200, lost=lost,
               duplicated_rows=duplicated, redelivered=redelivered)
        assert (lost, duplicated) == (0, 0)
        assert redelivered > 0  # the uncommitted batch came back flagged redelivered
    finally:
        retry(lambda c: drop(sub))
        ch = rabbit.channel()
        ch.queue_delete(queue)
        ch.connection.close()


def test_ingest_worker_killed_after_the_commit_before_the_ack(extension, rabbit):
    ch = rabbit.channel()
    queue = fresh_queue(ch)
    ch.connection.close()
    sub = subscribe([queue], batch_size=100)
    first = ["f%04d" % i for i in range(100)]
    second = ["g%04d" % i for i in range(100)]
    try:
        holder, pid = held_batch(rabbit, sub, queue, first, second)
        assert not set(second) & set(stored(sub))
        # No ack of this batch can reach the broker from now on, and no redelivery can come
        # before the kill: the node is down.
        rabbit.stop()
        holder.commit()  # lets go of the offsets row: the worker commits
        holder.close()
        # The held batch: what of `second` had arrived when the worker took its batch.
        wait_until(lambda: len(stored(sub)) > len(first), 60, what="the held batch committed")
        held = set(stored(sub)) - set(first)
        dups_before = metric(sub, "eventbox_ingest_duplicates_total")
        sigkill(pid)
        rabbit.start_again()
        # After the restarts (the counters start again from 0) the redelivered batch is read:
        # every delivery of it a duplicate of a committed row.
        wait_until(lambda: metric(sub, "eventbox_ingest_duplicates_total") >= len(held), 180,
                   what="the committed batch redelivered")
        wait_until(lambda: set(second) <= set(stored(sub)), 120, what="the rest of the batch")
        third = ["h%04d" % i for i in range(50)]
        ch = rabbit.channel()
        publish(ch, queue, third)
        ch.connection.close()
        wait_until(lambda: set(third) <= set(stored(sub)), 120, what="consumption going on")
        lost, duplicated = counts(sub, first + second + third)
        dups = metric(sub, "eventbox_ingest_duplicates_total")
        report("amqp ingest worker SIGKILLed after the commit, before the ack", sent=250,
               committed_unacked=len(held), lost=lost, duplicated_rows=duplicated,
               redelivered_duplicates=dups, duplicates_before_kill=dups_before)
        assert (lost, duplicated) == (0, 0)
        assert held and dups_before == 0 and dups >= len(held)
    finally:
        retry(lambda c: drop(sub))
        ch = rabbit.channel()
        ch.queue_delete(queue)
        ch.connection.close()


HANDLER_DDL = """
CREATE TABLE public.{t} (message_id text, attempts int, pid int);
CREATE FUNCTION public.{t}_fn(m eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.{t} VALUES (m.message_id, m.attempts, pg_backend_pid());
    PERFORM pg_sleep(0.002);
END $$;
CREATE ROLE {t}_role NOLOGIN;
GRANT INSERT ON public.{t} TO {t}_role;
"""


def test_handler_worker_killed_while_handling_amqp(extension, rabbit):
    """3,000 messages from a queue; a handler worker SIGKILLed at ~25% and ~60% handled: every
    message processed, its effect (a ledger row, no unique key) exactly once."""
    ch = rabbit.channel()
    queue = fresh_queue(ch)
    sub = subscribe([queue], batch_size=200)
    t = "amqp_ledger_%s" % uuid.uuid4().hex[:8]
    c = connect()
    query(c, HANDLER_DDL.format(t=t))
    query(c, "SELECT eventbox.register_handler(%s, %s::regprocedure, run_as => %s)",
          (sub, "public.%s_fn(eventbox.inbox)" % t, t + "_role"))
    c.close()
    total = 3000
    ids = ["p%05d" % i for i in range(total)]
    try:
        publish(ch, queue, ids)
        ch.connection.close()
        kills = []
        for fraction in (0.25, 0.60):
            target = int(total * fraction)
            wait_until(lambda: retry(lambda c: query_one(
                c, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s "
                   "AND status = 'processed'", (sub,))) >= target, 180,
                what="%d%% handled" % (fraction * 100))
            pids = retry(lambda c: [r[0] for r in query(
                c, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventbox handler' "
                   "ORDER BY pid")])
            assert pids, "no handler worker"
            done = retry(lambda c: query_one(
                c, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s "
                   "AND status = 'processed'", (sub,)))
            assert done < total, "the kill came after the work was done"
            sigkill(pids[len(kills) % len(pids)])
            kills.append(done)
            time.sleep(1)
        wait_until(lambda: retry(lambda c: query_one(
            c, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s "
               "AND status = 'processed'", (sub,))) >= total, 240, what="every message handled")

        def figures(c):
            ledger = dict(query(c, "SELECT message_id, count(*) FROM public.%s GROUP BY 1" % t))
            status = dict(query(c, "SELECT status, count(*) FROM eventbox.inbox "
                                   "WHERE subscription = %s GROUP BY 1", (sub,)))
            return ledger, status
        ledger, status = retry(figures)
        lost, duplicated = counts(sub, ids)
        effects_lost = len([i for i in ids if i not in ledger])
        effects_twice = sum(n - 1 for n in ledger.values())
        report("amqp handler worker SIGKILLed x2", sent=total, kills=len(kills),
               killed_at=kills, lost=lost, duplicated_rows=duplicated,
               effects_lost=effects_lost, effects_twice=effects_twice, inbox=status)
        assert (lost, duplicated) == (0, 0)
        assert status == {"processed": total}
        assert (effects_lost, effects_twice) == (0, 0)
    finally:
        retry(lambda c: drop(sub))

        def cleanup(c):
            query(c, "DROP TABLE IF EXISTS public.%s" % t)
            query(c, "DROP FUNCTION IF EXISTS public.%s_fn(eventbox.inbox)" % t)
            query(c, "DROP ROLE IF EXISTS %s_role" % t)
        retry(cleanup)
        ch = rabbit.channel()
        ch.queue_delete(queue)
        ch.connection.close()
