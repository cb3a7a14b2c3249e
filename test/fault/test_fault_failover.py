"""Failover to a streaming standby (issue 27, item 3): a primary with a synchronous standby runs
outbox and inbox traffic, is SIGKILLed mid-traffic, the standby is promoted, and nothing a client
saw committed is lost: every acknowledged send() reaches Kafka, every record produced is stored
once and handled once. Before the promotion, send() on the standby fails with 25006 (read-only
transaction), the code drivers and poolers look for to reconnect to the new primary."""

import collections
import os
import shutil
import signal
import threading
import time
import uuid

import psycopg2
import pytest

from clusters import (HANDLER_DDL, PGBIN, Cluster, Elapsed, Kafka, as_postgres, duplicates,
                      query, query_one, report, wait_settled, wait_until, wait_workers)

SUB = "failover"


@pytest.fixture
def pair(tmp_path):
    """(kafka, primary, standby): a primary with synchronous replication to a streaming standby,
    the extension and a handler on the primary. Everything is stopped afterwards."""
    kafka = Kafka(str(tmp_path))
    primary, standby = Cluster("fo-primary"), Cluster("fo-standby")
    try:
        primary.start(db="app", brokers=kafka.bootstrap, conf=["wal_keep_size='256MB'"])
        make_standby(primary, standby)
        yield kafka, primary, standby
    finally:
        for c in (standby, primary):
            c.stop()
        kafka.close()


def make_standby(primary, standby):
    os.chmod(standby.dir, 0o755)
    if os.geteuid() == 0:
        shutil.chown(standby.dir, "postgres", "postgres")
    as_postgres([os.path.join(PGBIN, "pg_basebackup"), "-h", primary.dir, "-p",
                 str(primary.port), "-U", "postgres", "-D", standby.datadir, "-R", "-X",
                 "stream", "--no-sync"], cwd=standby.dir)
    with open(os.path.join(standby.datadir, "postgresql.conf"), "a") as f:
        # The copied settings name the primary's port and socket; once promoted, the standby has
        # no standby of its own to wait for.
        f.write("\nport = %d\nunix_socket_directories = '%s'\nsynchronous_standby_names = ''\n"
                % (standby.port, standby.dir))
    standby.pg_ctl_start()
    standby.db = "app"
    # Synchronous from now on (set before, it would have held the primary's start-up commits).
    c = primary.connect()
    query(c, "ALTER SYSTEM SET synchronous_standby_names = '*'")
    query(c, "SELECT pg_reload_conf()")
    wait_until(lambda: query_one(c, "SELECT sync_state FROM pg_stat_replication") == "sync", 30,
               what="the standby streaming synchronously")
    c.close()


def setup_primary(primary, kafka):
    c = primary.connect()
    query(c, "CREATE EXTENSION pg_eventbox")
    query(c, "CREATE ROLE app_handler NOLOGIN")
    in_topic, out_topic, sent_topic = kafka.topic("fo_in"), kafka.topic("fo_out"), \
        kafka.topic("fo_sent")
    query(c, HANDLER_DDL.replace("{out}", out_topic).replace("{role}", "app_handler"))
    query(c, "SELECT eventbox.create_subscription(%s, ARRAY[%s], backoff => '100 ms', "
             "backoff_max => '1 s')", (SUB, in_topic))
    query(c, "SELECT eventbox.register_handler(%s, 'shop.on_order(eventbox.inbox)'::regprocedure, "
             "event_type => 'OrderCreated', run_as => 'app_handler')", (SUB,))
    wait_workers(primary)
    c.close()
    return in_topic, out_topic, sent_topic


class Sender(threading.Thread):
    """send() in a loop, one message a transaction; `acked` holds the ids whose COMMIT returned."""

    def __init__(self, cluster, topic):
        super().__init__(daemon=True)
        self.cluster, self.topic = cluster, topic
        self.acked, self.stop = [], threading.Event()

    def run(self):
        try:
            c = self.cluster.connect()
            while not self.stop.is_set():
                mid = str(uuid.uuid4())
                query(c, "SELECT eventbox.send(%s, %s::jsonb, message_id => %s)",
                      (self.topic, '{"n": %d}' % len(self.acked), mid))
                self.acked.append(mid)
        except psycopg2.Error:
            pass  # the primary is gone: what was acknowledged so far is what must survive


def kill_postmaster(cluster):
    with open(os.path.join(cluster.datadir, "postmaster.pid")) as f:
        pid = int(f.readline())
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not os.path.exists("/proc/%d" % pid), 30, what="the primary to die")


def orders(n):
    ids = [str(uuid.uuid4()) for _ in range(n)]
    return ids, [(m, i % 4, "k%d" % i, {"n": i}, "OrderCreated") for i, m in enumerate(ids)]


def test_send_on_standby_is_a_read_only_error(pair):
    kafka, primary, standby = pair
    setup_primary(primary, kafka)
    c = standby.connect()
    wait_until(lambda: query_one(c, "SELECT count(*) FROM pg_extension "
                                    "WHERE extname = 'pg_eventbox'"), 30,
               what="the extension replayed on the standby")
    for payload in ("'{}'::jsonb", "'\\x00'::bytea"):
        with pytest.raises(psycopg2.Error) as err:
            query(c, "SELECT eventbox.send('fo_standby', %s)" % payload)
        assert err.value.pgcode == "25006", (err.value.pgcode, str(err.value))
        assert "read-only" in str(err.value), str(err.value)
    # No worker runs on a standby.
    assert query_one(c, "SELECT count(*) FROM pg_stat_activity WHERE backend_type IN "
                        "('eventbox relay', 'eventbox ingest', 'eventbox handler')") == 0
    c.close()


def test_failover_to_a_synchronous_standby_loses_nothing(pair):
    kafka, primary, standby = pair
    in_topic, out_topic, sent_topic = setup_primary(primary, kafka)

    before_ids, before = orders(200)
    kafka.produce(in_topic, before)
    sender = Sender(primary, sent_topic)
    sender.start()
    wait_until(lambda: len(sender.acked) >= 300, 60, what="300 sends acknowledged")
    during_ids, during = orders(200)
    producer = threading.Thread(target=kafka.produce, args=(in_topic, during), daemon=True)
    producer.start()
    time.sleep(0.3)   # mid-traffic: sends and ingest batches in flight
    kill_postmaster(primary)
    sender.stop.set()
    sender.join(30)
    producer.join(60)
    acked = list(sender.acked)

    el = Elapsed()
    as_postgres([os.path.join(PGBIN, "pg_ctl"), "-D", standby.datadir, "-w", "promote"],
                cwd=standby.dir)
    workers_s = wait_workers(standby, timeout=60) + el()
    after_ids, after = orders(100)
    kafka.produce(in_topic, after)

    c = standby.connect()
    records = before_ids + during_ids + after_ids
    status = wait_settled(c, SUB, len(records), timeout=120)
    assert status == {"processed": len(records)}, status
    ran = collections.Counter(m for m, in query(c, "SELECT message_id FROM shop.handled"))
    assert set(ran) == set(records), len(set(records) - set(ran))
    assert not duplicates(ran), duplicates(ran)
    # Every acknowledged send and every handler's send reached Kafka (at least once).
    sent = collections.Counter(r.message_id for r in kafka.wait_ids(sent_topic, acked, 120))
    handled_out = {str(o) for o, in query(c, "SELECT out_id FROM shop.handled")}
    kafka.wait_ids(out_topic, handled_out, 120)
    lost = len(set(acked) - set(sent))
    c.close()
    assert not standby.crash_lines(), standby.crash_lines()
    report("failover", acked_sends=len(acked), records=len(records), workers_s="%.1f" % workers_s,
           lost=lost, duplicated=len(duplicates(sent)) + len(duplicates(ran)))
    assert lost == 0
