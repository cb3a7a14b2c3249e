"""The ingest worker's inserts reach the statistics system (what autovacuum and autoanalyze go
by) even when it goes idle right after a batch: PostgreSQL holds a process's table statistics
back while its flushes would be less than a second apart, and the worker used to flush only
after a batch, so the last batches of a burst stayed unreported until the next message came."""
import time

from inbox_kafka import end_offsets, produce
from inbox_support import poll, unique_name


def inbox_inserts(db):
    # Each statement runs in its own transaction: a fresh statistics snapshot every time.
    return db.value("SELECT n_tup_ins FROM pg_stat_user_tables "
                    "WHERE relid = 'eventbox.inbox'::regclass")


def test_inserts_of_the_last_batch_reach_the_statistics(ib_db, ib_topic, ib_producer,
                                                        ib_subscriptions):
    topic = ib_topic("stats", 1)
    sub = unique_name("stats")
    ib_subscriptions(sub, [topic])
    ib_db.wait_caught_up(sub, end_offsets(topic), timeout=60)
    # A first message more than a second after the worker's last flush: its batch is flushed
    # at once (together with anything earlier tests left pending).
    time.sleep(1.2)
    before = inbox_inserts(ib_db)
    produce(ib_producer, topic, [{"value": b'{"n":0}', "headers": [("message_id", b"s0")]}])
    ib_db.wait_rows(sub, 1, timeout=60)
    flushed = poll(lambda: (inbox_inserts(ib_db) > before) and inbox_inserts(ib_db), 10,
                   "the first batch's inserts in pg_stat_user_tables")
    # Two more at once: their batches come within a second of that flush, so they are held
    # back, and then the worker is idle.
    produce(ib_producer, topic, [{"value": b'{"n":1}', "headers": [("message_id", b"s1")]},
                                 {"value": b'{"n":2}', "headers": [("message_id", b"s2")]}])
    ib_db.wait_rows(sub, 3, timeout=60)
    poll(lambda: inbox_inserts(ib_db) >= flushed + 2, 10,
         "n_tup_ins of eventbox.inbox to reach %d (the idle worker's last inserts)"
         % (flushed + 2))
