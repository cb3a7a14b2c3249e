"""The workers' life around the served database and the extension: eventbox.database missing
at start (one WARNING, no restart loop, workers once it exists), and the extension dropped and
created again at once (the new install's handlers and sends work within seconds)."""

import collections
import time
import uuid

import pytest

from clusters import (HANDLER_DDL, WORKER_TYPES, Elapsed, duplicates, query, query_one,
                             report, wait_settled, wait_until, wait_workers, worker_counts)

MISSING = r'eventbox launcher WARNING:  eventbox\.database "missing_app" does not exist'
LAUNCHER_FAILED = (r'eventbox launcher FATAL|eventbox launcher ERROR|'
                   r'background worker "eventbox (launcher|supervisor)" \(PID \d+\) exited')


def test_missing_database_warns_once_then_workers_start(clusters, kafka):
    cluster = clusters("nodb").start(db="postgres", conf=["eventbox.database='missing_app'"],
                                     brokers=kafka.bootstrap)
    cluster.wait_log(MISSING, timeout=15)
    lines = cluster.log_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if "does not exist" in ln)
    assert ("DETAIL:  The pg_eventbox workers of that database start once it exists"
            in lines[at + 1]), lines[at:at + 3]
    assert ("HINT:  Create the database, or remove it from eventbox.database"
            in lines[at + 2]), lines[at:at + 3]

    # A window of 5 s: still one WARNING, the launcher neither fails nor is restarted.
    window = Elapsed()
    while window() < 5.0:
        assert len(cluster.log_lines(MISSING)) == 1, cluster.log_lines(MISSING)
        assert not cluster.log_lines(LAUNCHER_FAILED), cluster.log_lines(LAUNCHER_FAILED)
        time.sleep(0.25)
    assert not cluster.log_lines(r"FATAL"), cluster.log_lines(r"FATAL")
    assert worker_counts(cluster.connect("postgres")) == {}

    cluster.mark_log()
    cluster.sql("CREATE DATABASE missing_app", dbname="postgres")
    cluster.sql("CREATE EXTENSION pg_eventbox", dbname="missing_app")
    # The launcher looks again after 1, 2, 4, ... up to 60 s.
    workers_s = wait_workers(cluster, timeout=70, dbname="missing_app")
    cluster.wait_log(r'eventbox\.database "missing_app" exists now', 5, since_mark=True)
    assert len(cluster.log_lines(MISSING)) == 1
    assert not cluster.log_lines(LAUNCHER_FAILED), cluster.log_lines(LAUNCHER_FAILED)
    report("missing_database", warnings=1, observed_s="%.1f" % window(),
           workers_after_create_s="%.1f" % workers_s)


def setup_handler(c, kafka, sub, in_topic, out):
    query(c, HANDLER_DDL.replace("{out}", out).replace("{role}", "app_handler"))
    query(c, "SELECT eventbox.create_subscription(%s, ARRAY[%s], backoff => '100 ms', "
             "backoff_max => '1 s')", (sub, in_topic))
    query(c, "SELECT eventbox.register_handler(%s, 'shop.on_order(eventbox.inbox)'::regprocedure, "
             "event_type => 'OrderCreated', run_as => 'app_handler')", (sub,))


def produce_and_settle(c, kafka, sub, in_topic, n, timeout=30.0):
    ids = [str(uuid.uuid4()) for _ in range(n)]
    kafka.produce(in_topic, [(m, i % 4, "k%d" % i, {"n": i}, "OrderCreated")
                             for i, m in enumerate(ids)])
    status = wait_settled(c, sub, n, timeout=timeout)
    assert status == {"processed": n}, status
    ran = collections.Counter(m for m, in query(c, "SELECT message_id FROM shop.handled"))
    assert set(ran) == set(ids) and not duplicates(ran), (len(ran), duplicates(ran))
    return ids


@pytest.mark.parametrize("one_transaction", [False, True], ids=["back_to_back", "one_transaction"])
def test_drop_and_create_extension_at_once(clusters, kafka, one_transaction):
    cluster = clusters("recreate").start(db="app", brokers=kafka.bootstrap)
    c = cluster.connect()
    query(c, "CREATE EXTENSION pg_eventbox")
    query(c, "CREATE ROLE app_handler NOLOGIN")
    setup_handler(c, kafka, "orders", kafka.topic("orders"), kafka.topic("out"))
    wait_workers(cluster)
    old_pids = {p for p, in query(c, "SELECT pid FROM pg_stat_activity "
                                     "WHERE backend_type = ANY (%s)", (list(WORKER_TYPES),))}

    # Drop (the handler function goes with the row type it takes) and create again at once.
    cluster.mark_log()
    el = Elapsed()
    c.autocommit = not one_transaction
    query(c, "DROP EXTENSION pg_eventbox CASCADE")
    query(c, "CREATE EXTENSION pg_eventbox")
    if one_transaction:
        c.commit()
        c.autocommit = True
    gap = el()  # reported, not asserted: the DROP waits for worker transactions in flight
    query(c, "DROP SCHEMA shop CASCADE")
    in2, out2 = kafka.topic("orders2"), kafka.topic("out2")
    setup_handler(c, kafka, "orders", in2, out2)
    cluster.wait_log(r'pg_eventbox was dropped or re-created in database "app"; restarting its '
                     r'workers', 10, since_mark=True)
    # Every worker is a new one, started for the new install.
    wait_until(lambda: not old_pids & {p for p, in query(
        c, "SELECT pid FROM pg_stat_activity WHERE backend_type = ANY (%s)",
        (list(WORKER_TYPES),))}, 15, what="the old install's workers to stop")
    restart_s = wait_workers(cluster, timeout=15) + el()

    # The new install's handler runs its messages (the row type is the new one).
    ids = produce_and_settle(c, kafka, "orders", in2, 20)
    handled_s = el()
    outs = [r[0] for r in query(c, "SELECT out_id::text FROM shop.handled")]
    recs = kafka.wait_ids(out2, outs, timeout=15)
    assert not duplicates(collections.Counter(r.message_id for r in recs))

    # A send() on the new install is relayed at once, not at the 60 s sweep.
    pre = kafka.topic("pre")
    t_send = Elapsed()
    mid = query_one(c, "SELECT eventbox.send(%s, '{\"after\": \"re-create\"}'::jsonb)", (pre,))
    kafka.wait_ids(pre, [mid], timeout=10)
    send_s = t_send()
    assert send_s < 5, send_s
    bad = cluster.log_lines(r"cache lookup failed|could not open relation|ERROR", since_mark=True)
    assert not bad, bad
    report("drop_create_%s" % ("one_transaction" if one_transaction else "back_to_back"),
           gap_s="%.2f" % gap, workers_restarted_s="%.1f" % restart_s,
           handled_20_s="%.1f" % handled_s, send_delivered_s="%.2f" % send_s, handled=len(ids))


SLOW_HANDLER = """
CREATE SCHEMA slow;
CREATE FUNCTION slow.on_order(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(1.5);  -- the DROP arrives meanwhile, while the pass holds the inbox
    PERFORM eventbox.send('{out}', jsonb_build_object('in', msg.message_id));
END $$;
GRANT USAGE ON SCHEMA slow TO app_handler;
GRANT USAGE ON SCHEMA eventbox TO app_handler;
GRANT EXECUTE ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid) TO app_handler;
"""


def test_drop_extension_while_a_handler_runs(clusters, kafka):
    """DROP EXTENSION while a handler pass is in flight (its handler asleep, then calling
    send()). Without a lock of its own the DROP and the workers took the tables' locks in
    whatever order they came to them: once in a full local test run the DROP locked the outbox,
    waited for the inbox a pass held, and the pass waited for the outbox: "deadlock detected",
    the DROP failed; when this test ran without the lock, the workers went on running statements
    against the dropped tables (relay and handler ERRORs in the log). Now the DROP first takes
    the schema lock every worker transaction holds in share mode: it waits for the pass to end,
    and the workers that waited for it exit quietly."""
    cluster = clusters("droprun").start(db="app", brokers=kafka.bootstrap)
    c = cluster.connect()
    query(c, "CREATE EXTENSION pg_eventbox")
    query(c, "CREATE ROLE app_handler NOLOGIN")
    query(c, SLOW_HANDLER.replace("{out}", kafka.topic("slow_out")))
    in_topic = kafka.topic("slow_in")
    query(c, "SELECT eventbox.create_subscription('slow', ARRAY[%s])", (in_topic,))
    query(c, "SELECT eventbox.register_handler('slow', 'slow.on_order(eventbox.inbox)'"
             "::regprocedure, run_as => 'app_handler')")
    wait_workers(cluster)
    cluster.mark_log()
    kafka.produce(in_topic, [(str(uuid.uuid4()), 0, "k", {"n": 1}, "OrderCreated")])
    # The handler is asleep inside its pass (the pass's backend shows the sleep).
    wait_until(lambda: query_one(c, "SELECT count(*) FROM pg_stat_activity WHERE "
                                    "wait_event = 'PgSleep' AND backend_type = 'eventbox handler'"),
               30, interval=0.02, what="the handler to be asleep in its pass")
    el = Elapsed()
    query(c, "DROP EXTENSION pg_eventbox CASCADE")
    drop_s = el()
    deadlocks = cluster.log_lines(r"deadlock detected", since_mark=True)
    assert not deadlocks, deadlocks
    # The pass ended before the DROP went on: its send() committed with its processed mark.
    assert query_one(c, "SELECT count(*) FROM pg_extension WHERE extname = 'pg_eventbox'") == 0
    wait_until(lambda: worker_counts(c) == {}, 15, what="the workers to stop")
    bad = cluster.log_lines(r"cache lookup failed|could not open relation|ERROR", since_mark=True)
    assert not bad, bad
    report("drop_while_handler_runs", drop_waited_s="%.1f" % drop_s, deadlocks=len(deadlocks))
