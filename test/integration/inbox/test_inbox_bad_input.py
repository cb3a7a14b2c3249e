"""Bad input gets a clear answer and nothing is lost (docs/reference/bad-input.md): a corpus of
crafted records, each of which must end up as exactly one inbox row, without the ingest worker ever
failing a batch or crashing."""
import json
import random

import pytest

from inbox_kafka import NULL_HEADER, end_offsets, json_value, produce, raw_header_name
from inbox_support import LogWatch, report, unique_name

MAX_BYTES = 65536        # eventbox.max_message_bytes during the corpus test
PARTITIONS = 4

RECEIVED, UNPARSABLE, EITHER = "received", "unparsable", "either"


class Corpus:
    """Records with what each must become: its message id (a usable message_id header, or
    None for the transport identity) and its status."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.records = []   # dicts for produce()
        self.expect = []    # (category, expected id or None, expected status)

    def add(self, category, value, status, headers=(), key=None, mid="auto"):
        n = len(self.records)
        headers = list(headers)
        if mid == "auto":
            mid = "bad-%05d" % n
        if mid is not None:
            headers.append(("message_id", mid.encode()))
        self.records.append({"value": value, "key": key, "headers": headers,
                             "partition": n % PARTITIONS})
        self.expect.append((category, mid, status))

    def rand_bytes(self, n, high=False):
        if high:
            return bytes(self.rng.randrange(0x80, 0x100) for _ in range(n))
        return bytes(self.rng.randrange(0, 256) for _ in range(n))

    def json_doc(self):
        r = self.rng
        return {"id": r.randrange(10 ** 9), "name": "n%d" % r.randrange(1000),
                "tags": [r.choice(["a", "b", "\u00e9", "\u4e16"]) for _ in range(r.randrange(5))],
                "nested": {"x": r.random(), "y": None, "z": [True, False]}}


def build_corpus():
    c = Corpus(seed=8)
    r = c.rng
    for _ in range(40):
        c.add("empty", b"", UNPARSABLE, key=c.rand_bytes(r.randrange(0, 20)))
    for _ in range(40):
        c.add("null-value", None, UNPARSABLE, key=c.rand_bytes(r.randrange(1, 30)))
    for size in (MAX_BYTES + 1, 70_000, 100_000, 150_000, 250_000):
        pad = size - len(b'{"pad":""}')
        c.add("huge-json", b'{"pad":"' + b"x" * pad + b'"}', UNPARSABLE)
    for size in (MAX_BYTES + 1, 90_000, 200_000):
        c.add("huge-binary", c.rand_bytes(size), UNPARSABLE)
    exact = b'{"pad":"' + b"y" * (MAX_BYTES - len(b'{"pad":""}')) + b'"}'
    assert len(exact) == MAX_BYTES
    c.add("exactly-max-json", exact, RECEIVED)
    for _ in range(160):
        c.add("invalid-utf8", b"\xfe" + c.rand_bytes(r.randrange(0, 300), high=True), UNPARSABLE)
    for _ in range(60):
        body = bytearray(json_value(c.json_doc()))
        body.insert(r.randrange(1, len(body) - 1), 0)
        c.add("nul-in-json", bytes(body), UNPARSABLE)
    for _ in range(40):
        c.add("nul-binary", b"\x00" + c.rand_bytes(r.randrange(0, 100)), UNPARSABLE)
    for _ in range(160):
        doc = json_value(c.json_doc())
        c.add("broken-json", doc[:r.randrange(1, len(doc))], UNPARSABLE)
    for depth in (100, 1000, 5000, 10000, 30000):
        c.add("deep-arrays", b"[" * depth + b"]" * depth, EITHER)
    for depth in (100, 1000, 5000, 10000):
        c.add("deep-objects", b'{"a":' * depth + b"1" + b"}" * depth, EITHER)
    for text in (b"1e999999", b"-1e999999", b"1e-999999", b'{"n":1e999999}',
                 b'[1e999999,2]', b'{"n":-1E+999999}'):
        c.add("number-out-of-range", text, UNPARSABLE)
    for text in (b"1e400", b'{"n":1e1000}', b'{"n":' + b"7" * 60_000 + b"}",
                 b'{"n":' + b"7" * 1000 + b"." + b"3" * 1000 + b"}"):
        c.add("number-huge-for-double", text, EITHER)
    for text in (b"-0", b"1E+2", b"0.1e-5", b'{"n":-0.0}', b"123456789012345678901234567890"):
        c.add("number-plain", text, RECEIVED)
    for _ in range(30):
        headers = [("h%03d" % i, c.rand_bytes(r.randrange(0, 20))) for i in range(200)]
        c.add("200-headers", json_value(c.json_doc()), RECEIVED, headers=headers)
    c.add("2000-headers", b'{"a":1}', RECEIVED,
          headers=[("h%04d" % i, b"v") for i in range(2000)])
    c.add("big-header-value", b'{"a":1}', RECEIVED, headers=[("big", b"v" * 200_000)])
    for _ in range(100):
        c.add("binary-key", json_value(c.json_doc()), RECEIVED,
              key=c.rand_bytes(r.randrange(0, 1000)))
    for _ in range(80):
        headers = [(raw_header_name(c.rand_bytes(r.randrange(1, 16), high=True)),
                    c.rand_bytes(r.randrange(0, 64))) for _ in range(r.randrange(1, 6))]
        headers.append((raw_header_name(b"\x00" + c.rand_bytes(3)), b"nul-name"))
        headers.append(("nullvalue", NULL_HEADER))
        c.add("binary-headers", json_value(c.json_doc()), RECEIVED, headers=headers,
              key=c.rand_bytes(8))
    for _ in range(20):
        c.add("duplicate-header-names", json_value(c.json_doc()), RECEIVED,
              headers=[("x", b"1"), ("x", b"\xff"), ("x", NULL_HEADER), ("x", b"")])
    # Message ids that cannot be used: the transport identity takes over.
    for size in (257, 300, 1000, 10_000, 100_000):
        for _ in range(8):
            c.add("long-message-id", json_value(c.json_doc()), RECEIVED, mid=None,
                  headers=[("message_id", ("L%d-" % size).encode() + b"i" * size)])
    for _ in range(40):
        c.add("non-utf8-message-id", json_value(c.json_doc()), RECEIVED, mid=None,
              headers=[("message_id", b"\xff" + c.rand_bytes(r.randrange(0, 40), high=True))])
    for _ in range(20):
        c.add("nul-in-message-id", json_value(c.json_doc()), RECEIVED, mid=None,
              headers=[("message_id", b"id\x00" + c.rand_bytes(4))])
    for _ in range(20):
        c.add("empty-message-id", json_value(c.json_doc()), RECEIVED, mid=None,
              headers=[("message_id", b"")])
    for _ in range(20):
        c.add("null-message-id", json_value(c.json_doc()), RECEIVED, mid=None,
              headers=[("message_id", NULL_HEADER), ("ce_id", b"\xff\xfe")])
    for _ in range(40):
        c.add("no-id-garbage", c.rand_bytes(r.randrange(1, 500)), EITHER, mid=None,
              key=c.rand_bytes(4))
    # Usable but unusual ids.
    for i in range(30):
        mid = "id %d \u00fc\U0001f680 \"quoted\" \\ back/slash\nnewline\t%s" % (i, "z" * i)
        c.add("unusual-message-id", json_value(c.json_doc()), RECEIVED, mid=mid)
    c.add("max-length-message-id", b'{"a":1}', RECEIVED, mid="M" * 256)
    # More unparsable JSON-ish text.
    for text in (b'{"a":"\\u0000"}', b'\xef\xbb\xbf{"a":1}', b'{"a":"\\ud800"}',
                 b'{"a":"\x01"}', b"{'a':1}", b"NaN", b"Infinity", b'{"a":1}}', b"[1,]",
                 b'{"a" 1}', b"\"unterminated", b"//comment\n{}", b"{}\x00"):
        for _ in range(5):
            c.add("json-ish", text, UNPARSABLE)
    assert len(c.records) >= 1000, len(c.records)
    return c


@pytest.fixture
def small_max_message_bytes(ib_db):
    original = ib_db.setting("eventbox.max_message_bytes")
    since = ib_db.set_setting("eventbox.max_message_bytes", MAX_BYTES, MAX_BYTES)
    try:
        ib_db.wait_worker_reloaded(since)
        yield MAX_BYTES
    finally:
        ib_db.set_setting("eventbox.max_message_bytes", None, original)


def test_bad_input_corpus_one_row_per_record_and_no_crash(ib_db, ib_topic, ib_producer,
                                                          ib_subscriptions,
                                                          small_max_message_bytes):
    corpus = build_corpus()
    topic = ib_topic("badinput", PARTITIONS)
    sub = unique_name("badinput")
    log = LogWatch()
    before = ib_db.counters()
    ib_subscriptions(sub, [topic])
    sent = produce(ib_producer, topic, corpus.records)
    ends = end_offsets(topic)
    assert sum(ends.values()) == len(corpus.records)
    ib_db.wait_caught_up(sub, ends, timeout=120)

    rows = {r["message_id"]: r for r in ib_db.inbox_rows(
        sub, 'message_id, topic, "partition", "offset", key, status, payload IS NOT NULL AS '
             "has_payload, raw_payload, last_error")}
    problems = []
    expected_ids = set()
    categories = {}
    for s, rec, (category, mid, status) in zip(sent, corpus.records, corpus.expect):
        want = mid if mid is not None else "%s/%d/%d" % (s.topic, s.partition, s.offset)
        expected_ids.add(want)
        r = rows.get(want)
        categories.setdefault(category, 0)
        categories[category] += 1
        where = "%s #%d (%s[%d]@%d)" % (category, corpus.records.index(rec), s.topic,
                                        s.partition, s.offset)
        if r is None:
            problems.append("%s: no row with message id %r" % (where, want[:80]))
            continue
        if (r["topic"], r["partition"], r["offset"]) != (s.topic, s.partition, s.offset):
            problems.append("%s: row is from %s[%d]@%d" % (where, r["topic"], r["partition"],
                                                            r["offset"]))
        key = None if r["key"] is None else bytes(r["key"])
        if key != rec["key"]:
            problems.append("%s: key %r != %r" % (where, key, rec["key"]))
        value = rec["value"]
        raw = None if r["raw_payload"] is None else bytes(r["raw_payload"])
        if r["status"] == "received":
            if status == UNPARSABLE:
                problems.append("%s: received, expected unparsable" % where)
            if not r["has_payload"] or raw is not None:
                problems.append("%s: received without payload or with raw_payload" % where)
        elif r["status"] == "unparsable":
            if status == RECEIVED:
                problems.append("%s: unparsable (%s), expected received"
                                % (where, r["last_error"]))
            if r["has_payload"] or not r["last_error"]:
                problems.append("%s: unparsable with payload or without a reason" % where)
            if value is not None and len(value) > MAX_BYTES:
                if raw != value[:MAX_BYTES] or str(MAX_BYTES) not in r["last_error"]:
                    problems.append("%s: %d bytes: raw_payload of %s bytes, note %r" % (
                        where, len(value), None if raw is None else len(raw), r["last_error"]))
            elif raw != value:
                problems.append("%s: raw_payload differs from the record's bytes" % where)
        else:
            problems.append("%s: status %r" % (where, r["status"]))
    unexpected = set(rows) - expected_ids
    if unexpected:
        problems.append("%d unexpected rows, e.g. %r" % (len(unexpected),
                                                          sorted(unexpected)[:5]))

    after = ib_db.counters()
    crashes = log.crash_lines()
    ingest_errors = log.lines(r"eventbox ingest (ERROR|FATAL|PANIC)")
    statuses = dict(ib_db.rows("SELECT status, count(*) FROM eventbox.inbox WHERE subscription "
                               "= %s GROUP BY 1", (sub,)))
    report("bad_input", records=len(corpus.records), rows=len(rows), statuses=json.dumps(
        statuses, sort_keys=True), categories=len(categories), problems=len(problems),
        worker_restarted=after["pid"] != before["pid"], ingest_errors=len(ingest_errors))
    assert not crashes, "crash lines in the server log:\n" + "\n".join(crashes)
    assert after["pid"] == before["pid"], "the ingest worker restarted (pid %d -> %d)" % (
        before["pid"], after["pid"])
    assert len(rows) == len(corpus.records), (len(rows), len(corpus.records))
    assert not problems, "%d problem(s):\n%s" % (len(problems), "\n".join(problems[:40]))
    assert not ingest_errors, ("the ingest worker failed batches:\n"
                               + "\n".join(ingest_errors[:20]))


def test_max_message_bytes_reload_applies_to_running_subscriptions(ib_db, ib_topic,
                                                                   ib_producer,
                                                                   ib_subscriptions):
    topic = ib_topic("maxbytes", 1)
    sub = unique_name("maxbytes")
    ib_subscriptions(sub, [topic])
    produce(ib_producer, topic, [{"value": b'{"probe":1}', "headers": [("message_id", b"probe")]}])
    ib_db.wait_rows(sub, 1, timeout=60)   # the subscription's consumer runs

    big = b'{"pad":"' + b"q" * 5000 + b'"}'
    original = ib_db.setting("eventbox.max_message_bytes")
    since = ib_db.set_setting("eventbox.max_message_bytes", 4096, 4096)
    try:
        ib_db.wait_worker_reloaded(since)
        produce(ib_producer, topic, [{"value": big, "headers": [("message_id", b"big")]}])
        ib_db.wait_rows(sub, 2, timeout=60)
    finally:
        ib_db.set_setting("eventbox.max_message_bytes", None, original)
    status, raw, note = ib_db.rows(
        "SELECT status, raw_payload, last_error FROM eventbox.inbox WHERE subscription = %s "
        "AND message_id = 'big'", (sub,))[0]
    assert status == "unparsable" and bytes(raw) == big[:4096] and "4096" in (note or ""), (
        "a %d-byte record after eventbox.max_message_bytes was reloaded as 4096: status %r, "
        "raw_payload %s bytes, last_error %r (the running subscription kept the old limit)"
        % (len(big), status, None if raw is None else len(raw), note))
