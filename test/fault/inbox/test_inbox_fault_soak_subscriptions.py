"""Soak: 300 subscriptions with traffic for a while (EVENTBOX_SOAK_SECONDS, default 120), with
churn (a subscription dropped and another created, a replay, one disabled and enabled again
every 20 s). The ingest worker's fds, threads and memory at the end must be those of the start
(at most 20% more, plus a small slack): resources follow the broker's partitions, not the
subscriptions or the time. Every live subscription must hold every record of its topic, once.

Knobs: EVENTBOX_SOAK_SECONDS (length of the traffic), EVENTBOX_SOAK_RATE (records/s, all topics
together; each record is stored once per subscription of its topic)."""
import os
import random
import threading
import time
import uuid

from inbox_kafka import end_offsets, json_value, new_producer
from inbox_support import (LogWatch, caught_up, connect, create_subscriptions, footprint, poll,
                           report)

SUBSCRIPTIONS = 300
TOPICS = 6
PARTITIONS = 4
SECONDS = float(os.environ.get("EVENTBOX_SOAK_SECONDS", "120"))
RATE = float(os.environ.get("EVENTBOX_SOAK_RATE", "50"))
CHURN_EVERY_S = 20
WARMUP_PER_TOPIC = 100


class Traffic(threading.Thread):
    """Produces records with unique message ids to random topics at RATE per second."""

    def __init__(self, topics, run):
        super().__init__(daemon=True, name="soak-producer")
        self.topics = topics
        self.run_id = run
        self.stop = threading.Event()
        self.sent = {t: 0 for t in topics}
        self.error = None

    def run(self):
        producer = new_producer(linger_ms=20)
        rng = random.Random(5)
        n = 0
        try:
            start = time.monotonic()
            while not self.stop.is_set():
                due = int((time.monotonic() - start) * RATE)
                futures = []
                while n < due:
                    topic = rng.choice(self.topics)
                    mid = "%s-%07d" % (self.run_id, n)
                    futures.append((topic, producer.send(
                        topic, key=b"k%d" % (n % 101),
                        value=json_value({"n": n, "id": mid, "pad": "x" * (n % 200)}),
                        headers=[("message_id", mid.encode())])))
                    n += 1
                producer.flush(timeout=60)
                for topic, f in futures:
                    f.get(timeout=60)
                    self.sent[topic] += 1
                time.sleep(0.05)
        except BaseException as e:
            self.error = e
        finally:
            producer.close(timeout=10)


def test_soak_300_subscriptions_resources_stay_bounded_and_nothing_is_lost(
        ib_db, ib_topic, ib_producer):
    run = uuid.uuid4().hex[:6]
    prefix = "ib_soak_%s_" % run
    topics = [ib_topic("soak%d" % t, PARTITIONS) for t in range(TOPICS)]
    subs = {"%s%03d" % (prefix, i): [topics[i % TOPICS]] for i in range(SUBSCRIPTIONS)}
    pid = ib_db.wait_ingest_worker()
    log = LogWatch()
    conn = connect()
    traffic = Traffic(topics, run)
    events = []
    try:
        create_subscriptions(conn, list(subs.items()))
        for t in topics:
            for i in range(WARMUP_PER_TOPIC):
                ib_producer.send(t, value=json_value({"warm": i}),
                                 headers=[("message_id", ("%s-warm-%s-%d" % (run, t, i)).encode())])
        ib_producer.flush(timeout=60)
        ends = {t: end_offsets(t) for t in topics}
        poll(lambda: not caught_up(ib_db, ends, list(subs.items())), 300,
             "all %d subscriptions caught up with the warm-up" % SUBSCRIPTIONS, interval=0.5)
        # The warm-up also replays a partition, as the churn below does: batches of duplicates
        # (compared with their stored rows for conflicts) have run before the start figures.
        warm = sorted(subs)[0]
        ib_db.rows("SELECT eventbox.replay(%s, %s, 0, 0)", (warm, subs[warm][0]))
        poll(lambda: not caught_up(ib_db, ends, list(subs.items())), 300,
             "the warm-up replay caught up", interval=0.5)
        start = footprint(pid)
        t_start = time.monotonic()
        traffic.start()
        churn = 0
        while time.monotonic() - t_start < SECONDS:
            time.sleep(min(CHURN_EVERY_S, max(0.0, SECONDS - (time.monotonic() - t_start))))
            if time.monotonic() - t_start >= SECONDS:
                break
            churn += 1
            # Drop one, create another (from the earliest record of its topic), replay one
            # partition, pause and resume one: subscriptions come and go, resources do not grow.
            gone = sorted(subs)[churn]
            del subs[gone]
            ib_db.drop_subscription(gone)
            new = "%sn%03d" % (prefix, churn)
            subs[new] = [topics[churn % TOPICS]]
            create_subscriptions(conn, [(new, subs[new])])
            victim = sorted(subs)[-churn]
            ib_db.rows("SELECT eventbox.replay(%s, %s, 0, 0)", (victim, subs[victim][0]))
            paused = sorted(subs)[churn + 10]
            ib_db.alter_subscription(paused, enabled=False)
            time.sleep(1)
            ib_db.alter_subscription(paused, enabled=True)
            events.append("t=%.0fs: dropped %s, created %s, replayed %s, paused %s" % (
                time.monotonic() - t_start, gone[-3:], new[-4:], victim[-3:], paused[-3:]))
        traffic.stop.set()
        traffic.join(120)
        assert not traffic.is_alive(), "producer still running"
        if traffic.error is not None:
            raise traffic.error
        ends = {t: end_offsets(t) for t in topics}
        poll(lambda: not caught_up(ib_db, ends, list(subs.items())), 300,
             "all subscriptions caught up after the traffic", interval=0.5)
        end = footprint(pid)
        produced = {t: sum(ends[t].values()) for t in topics}
        assert produced == {t: WARMUP_PER_TOPIC + traffic.sent[t] for t in topics}, (
            produced, traffic.sent)

        rows = {s: (n, d) for s, n, d in ib_db.rows(
            "SELECT subscription, count(*), count(DISTINCT message_id) FROM eventbox.inbox "
            "WHERE subscription LIKE %s GROUP BY subscription", (prefix + "%",))}
        lost = {s: produced[ts[0]] - rows.get(s, (0, 0))[1] for s, ts in subs.items()
                if rows.get(s, (0, 0))[1] != produced[ts[0]]}
        duplicated = {s: n - d for s, (n, d) in rows.items() if n != d}
        stray = sorted(set(rows) - set(subs))
        total = sum(n for n, _ in rows.values())
        report("soak_subscriptions", subscriptions=len(subs), seconds=SECONDS, rate=RATE,
               records=sum(produced.values()), inbox_rows=total, lost=sum(lost.values()),
               duplicated=sum(duplicated.values()), churn=churn,
               fds="%d->%d" % (start["fds"], end["fds"]),
               relation_fds="%d->%d" % (start["rel_fds"], end["rel_fds"]),
               threads="%d->%d" % (start["threads"], end["threads"]),
               rss_kb="%d->%d" % (start["rss_kb"], end["rss_kb"]),
               anon_kb="%d->%d" % (start["anon_kb"], end["anon_kb"]))
        print("\n".join(events))
        assert not lost, "subscriptions missing records: %r" % dict(list(lost.items())[:5])
        assert not duplicated and not stray, (duplicated, stray)
        assert ib_db.counters()["pid"] == pid, "the ingest worker restarted"
        # Bounded: the end is the start, up to 20% and a small slack. Relation files are
        # PostgreSQL's file cache (one fd per relation fork and segment the worker touched, more
        # as the inbox grows new forks and segments, up to max_files_per_process): they are
        # checked apart. RSS also counts the shared buffers the worker touched (more with more
        # data): the check is on RssAnon, its private memory.
        other_start, other_end = start["fds"] - start["rel_fds"], end["fds"] - end["rel_fds"]
        assert other_end <= other_start * 1.2 + 2, (start, end)
        assert end["rel_fds"] <= start["rel_fds"] * 1.2 + 8, (start, end)
        assert end["threads"] <= start["threads"] * 1.2 + 2, (start, end)
        assert end["anon_kb"] <= start["anon_kb"] * 1.2 + 4096, (start, end)
        assert log.lines(r"eventbox ingest.*(ERROR|could not store)") == []
    finally:
        traffic.stop.set()
        conn.close()
        ib_db.rows_retry("SELECT eventbox.drop_subscription(name) FROM eventbox.subscriptions "
                         "WHERE name LIKE %s", (prefix + "%",))
