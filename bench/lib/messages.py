"""The messages the sections send and receive: JSON payloads, numbered messages with their
Kafka coordinates, and the inbox rows the ingest worker would store for them, as binary COPY
data."""

import io
import json
import random
import string
import struct

PARTITIONS = 32  # partitions of the topics of the relay and inbox sections
SIZES = {"200B": 200, "1KiB": 1024}  # payload sizes of the throughput runs
DISTINCT_KEYS = 1000
EVENT_TYPE = "OrderCreated"
DUP_EVERY = 20  # producer duplicates: 5% of the records ...
DUP_LATER = (1, 8)  # ... sent again after this many more records of their partition
INBOX_COLUMNS = ('subscription, message_id, topic, "partition", "offset", key, headers, payload, '
                 'event_type, status')


def make_payloads(n, size, seed):
    """n (key, payload) pairs. Payloads are JSON written the way jsonb prints it (keys ordered by
    length then bytes, ", " and ": " separators), so the text send() stores and the relay
    publishes is byte-for-byte the kcat input."""
    rnd = random.Random(seed)
    alphabet = string.ascii_letters + string.digits
    # A pool of random strings; each payload takes a slice at a rotating offset.
    pool = ["".join(rnd.choice(alphabet) for _ in range(size + 64)) for _ in range(64)]
    res = []
    for i in range(n):
        key = "customer-%04d" % (i % DISTINCT_KEYS)
        head = '{"id": %d, "pad": "' % (i + 1)
        tail = ('", "sku": "SKU-%05d", "type": "OrderCreated", "amount": %d, "currency": "EUR", '
                '"customer": "%s"}' % (rnd.randrange(100000), rnd.randrange(1, 10 ** 6), key))
        pad_len = max(1, size - len(head) - len(tail))
        off = (i // 64) % 64
        res.append((key, head + pool[i % 64][off:off + pad_len] + tail))
    return res


class Messages:
    """n messages: (message_id, partition, offset, key, payload JSON text), message i in partition
    i % PARTITIONS at offset i // PARTITIONS of a fresh topic."""

    def __init__(self, n, size, seed):
        self.n = n
        payloads = make_payloads(n, size, seed=size)
        self.items = []
        for i, (key, payload) in enumerate(payloads):
            mid = "%08x-%04x-7000-8000-%012x" % (seed, size, i)
            self.items.append((mid, i % PARTITIONS, i // PARTITIONS, key, payload))
        self.avg_payload = sum(len(x[4]) for x in self.items) / n

    def records(self, partitions=None):
        """The messages as kafka.produce() records, headers event_type and message_id; with
        `partitions`, message i goes to partition i % partitions instead of its own."""
        for i, (mid, part, _off, key, payload) in enumerate(self.items):
            yield (payload.encode(), key.encode(), part if partitions is None else i % partitions,
                   [("event_type", EVENT_TYPE), ("message_id", mid)])

    @staticmethod
    def headers_json(mid):
        # What the ingest worker stores for the two Kafka headers of records().
        return json.dumps({"event_type": EVENT_TYPE, "message_id": mid})


def copy_buffer(sub, topic, msgs, status="received", count=None):
    """PostgreSQL binary COPY data of the inbox rows the ingest worker would store for msgs."""
    out = io.BytesIO()
    w = out.write
    pk = struct.pack
    w(b"PGCOPY\n\xff\r\n\x00" + pk("!ii", 0, 0))
    sub_b, topic_b, type_b, status_b = (sub.encode(), topic.encode(), EVENT_TYPE.encode(),
                                        status.encode())

    def text(b):
        w(pk("!i", len(b)))
        w(b)

    def jsonb(s):
        b = s.encode()
        w(pk("!ib", len(b) + 1, 1))  # jsonb binary format: version 1, then the text
        w(b)

    for mid, part, off, key, payload in msgs.items[:count]:
        w(pk("!h", 10))
        text(sub_b)
        text(mid.encode())
        text(topic_b)
        w(pk("!ii", 4, part))
        w(pk("!iq", 8, off))
        text(key.encode())
        jsonb(Messages.headers_json(mid))
        jsonb(payload)
        text(type_b)
        text(status_b)
    w(pk("!h", -1))
    out.seek(0)
    return out


# The inbox's triggers keep lane positions for rows written by hand (docs/design/handlers.md,
# "Lane positions"); the ingest workers' inserts do not fire them. A baseline that writes the
# inbox (COPY, the naive consumers) leaves them out the same way, and so does a handlers run's
# setup (its subscription has no position yet: its reads start at the lanes' first rows).
# session_replication_role = replica skips ordinary triggers (superuser, as the bench is).
NO_INBOX_TRIGGERS = "SET session_replication_role = replica"


def copy_rows(cur, buf):
    """COPYs copy_buffer() data into eventbox.inbox, without the inbox's triggers."""
    cur.execute(NO_INBOX_TRIGGERS)
    cur.copy_expert("COPY eventbox.inbox (%s) FROM STDIN (FORMAT binary)" % INBOX_COLUMNS, buf)
    cur.execute("RESET session_replication_role")


def with_duplicates(records, seed):
    """The records (value, key, partition, headers), with record i (i % DUP_EVERY == 0) sent
    again after 1 to 8 more records of its partition, as a producer's retry makes it. Returns
    (records, duplicates)."""
    rnd = random.Random(seed)
    pending = {}  # partition -> [(records of the partition still to pass, record)]
    out = []
    originals = 0
    for i, rec in enumerate(records):
        originals += 1
        out.append(rec)
        waiting = pending.setdefault(rec[2], [])
        for w in waiting:
            w[0] -= 1
        for w in [w for w in waiting if w[0] <= 0]:
            out.append(w[1])
            waiting.remove(w)
        if i % DUP_EVERY == 0:
            waiting.append([rnd.randint(*DUP_LATER), rec])
    for waiting in pending.values():
        out.extend(w[1] for w in waiting)
    return out, len(out) - originals
