"""eventbox.offsets: the next offset of every partition, written in the same transaction as the
inbox rows it covers (docs/reference/functions.md, docs/design/guarantees.md); eventbox.lag
derived from it."""
import threading
import time

from inbox_kafka import end_offsets, json_value, produce
from inbox_support import Db, report, unique_name

PARTITIONS = 5
ROUND1 = [1, 10, 300, 3000, 0]   # messages per partition (partition 4 stays empty at first)
ROUND2 = [5, 0, 100, 2000, 7]


class OffsetSampler(threading.Thread):
    """Checks, in one statement (one snapshot) at a time while the worker ingests, that the
    rows of every partition are exactly the offsets below its stored next_offset: rows and
    offsets commit together. Every record carries its own message_id, so rows = records."""

    SQL = """
        SELECT p, o.next_offset, r.n, r.lo, r.hi
          FROM (SELECT "partition" AS p, next_offset FROM eventbox.offsets
                 WHERE subscription = %(s)s AND topic = %(t)s) o
          FULL JOIN (SELECT "partition" AS p, count(*) AS n, min("offset") AS lo,
                            max("offset") AS hi
                       FROM eventbox.inbox WHERE subscription = %(s)s GROUP BY 1) r USING (p)
    """

    def __init__(self, sub, topic):
        super().__init__(daemon=True)
        self.sub, self.topic = sub, topic
        self.stop = threading.Event()
        self.samples = 0
        self.partial = 0  # samples taken while some rows were stored and some not yet
        self.violations = []
        self.error = None

    def run(self):
        db = Db()
        try:
            while not self.stop.is_set():
                rows = db.rows(self.SQL, {"s": self.sub, "t": self.topic})
                self.samples += 1
                total = sum(r[2] or 0 for r in rows)
                if 0 < total < sum(ROUND1) or sum(ROUND1) < total < sum(ROUND1) + sum(ROUND2):
                    self.partial += 1
                for p, next_offset, n, lo, hi in rows:
                    if next_offset is None:
                        ok = n is None
                    else:
                        ok = (n or 0) == next_offset and (
                            n is None or (lo, hi) == (0, next_offset - 1))
                    if not ok and len(self.violations) < 20:
                        self.violations.append(
                            "partition %s: next_offset %s but rows %s (offsets %s..%s)"
                            % (p, next_offset, n, lo, hi))
                time.sleep(0.005)
        except BaseException as e:
            self.error = e
        finally:
            db.close()


def produce_round(producer, topic, counts, tag):
    records = []
    for p, n in enumerate(counts):
        for i in range(n):
            mid = "%s-%d-%d" % (tag, p, i)
            records.append({"partition": p, "value": json_value({"p": p, "i": i}),
                            "headers": [("message_id", mid.encode())]})
    produce(producer, topic, records)


def check_offsets(db, sub, topic, ends):
    stored = {p: (n, hw, lag) for p, n, hw, lag in db.rows(
        'SELECT "partition", next_offset, high_watermark, lag FROM eventbox.lag '
        "WHERE subscription = %s AND topic = %s", (sub, topic))}
    problems = []
    for (t, p), end in sorted(ends.items()):
        if end == 0:
            if p in stored and stored[p][0] != 0:
                problems.append("empty partition %d: next_offset %s" % (p, stored[p][0]))
            continue
        if p not in stored:
            problems.append("partition %d: no offsets row (end offset %d)" % (p, end))
            continue
        n, hw, lag = stored[p]
        if n != end:
            problems.append("partition %d: next_offset %d, high watermark %d" % (p, n, end))
        if hw != end or lag != 0:
            problems.append("partition %d: eventbox.lag high_watermark %s lag %s, broker's "
                            "high watermark %d" % (p, hw, lag, end))
    extra = set(stored) - {p for (_, p) in ends}
    if extra:
        problems.append("offsets rows for unknown partitions %s" % sorted(extra))
    assert not problems, "\n".join(problems)


def test_offsets_equal_high_watermarks_and_commit_with_rows(ib_db, ib_topic, ib_producer,
                                                            ib_subscriptions):
    topic = ib_topic("offsets", PARTITIONS)
    sub = unique_name("offsets")
    # One record per transaction: thousands of ingest transactions for the sampler to look
    # between.
    ib_subscriptions(sub, [topic], batch_size=1)
    sampler = OffsetSampler(sub, topic)
    sampler.start()
    try:
        produce_round(ib_producer, topic, ROUND1, "r1")
        ends = end_offsets(topic)
        assert [ends[(topic, p)] for p in range(PARTITIONS)] == ROUND1
        ib_db.wait_caught_up(sub, ends, timeout=90)
        assert ib_db.inbox_count(sub) == sum(ROUND1)
        check_offsets(ib_db, sub, topic, ends)

        produce_round(ib_producer, topic, ROUND2, "r2")
        ends = end_offsets(topic)
        assert [ends[(topic, p)] for p in range(PARTITIONS)] == [
            a + b for a, b in zip(ROUND1, ROUND2)]
        ib_db.wait_caught_up(sub, ends, timeout=90)
        assert ib_db.inbox_count(sub) == sum(ROUND1) + sum(ROUND2)
        check_offsets(ib_db, sub, topic, ends)
    finally:
        sampler.stop.set()
        sampler.join(10)
    report("offsets", samples=sampler.samples, samples_mid_ingest=sampler.partial,
           violations=len(sampler.violations))
    assert sampler.error is None, sampler.error
    assert not sampler.violations, (
        "rows and offsets seen out of step (not one transaction):\n"
        + "\n".join(sampler.violations))
    assert sampler.partial > 0, "no sample saw the ingestion in progress"


def test_received_at_and_updated_at_are_ingest_times(ib_db, ib_topic, ib_producer,
                                                     ib_subscriptions):
    topic = ib_topic("times", 2)
    sub = unique_name("times")
    t0 = ib_db.value("SELECT clock_timestamp()")
    ib_subscriptions(sub, [topic])
    produce(ib_producer, topic, [{"value": json_value({"i": i}),
                                  "headers": [("message_id", b"t%d" % i)]} for i in range(20)])
    ib_db.wait_rows(sub, 20, timeout=60)
    ends = end_offsets(topic)
    ib_db.wait_caught_up(sub, ends, timeout=30)
    t1 = ib_db.value("SELECT clock_timestamp()")
    first, last = ib_db.rows("SELECT min(received_at), max(received_at) FROM eventbox.inbox "
                             "WHERE subscription = %s", (sub,))[0]
    o_first, o_last = ib_db.rows("SELECT min(updated_at), max(updated_at) FROM eventbox.offsets"
                                 " WHERE subscription = %s", (sub,))[0]
    worker_start = ib_db.value("SELECT started_at FROM eventbox.workers WHERE role = 'ingest'")
    assert t0 <= first <= last <= t1, (
        "inbox.received_at %s..%s is not within the time the rows were received %s..%s "
        "(the ingest worker started at %s)" % (first, last, t0, t1, worker_start))
    assert t0 <= o_first <= o_last <= t1, (
        "offsets.updated_at %s..%s is not within %s..%s (the ingest worker started at %s)"
        % (o_first, o_last, t0, t1, worker_start))
