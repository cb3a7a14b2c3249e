"""The failure workflow with the workers running and independent Kafka clients
(issue 17 part A): non-retryable errors dead at once, on_dead 'block_key'
holding back the later messages of a dead message's key while the other keys
flow, eventbox.blocked_keys, retry() and skip() releasing in offset order, and
the dead-letter topic (dead and unparsable records, read back with
kafka-python and confluent_kafka), consumed by a second subscription: the
redrive path."""

import collections
import json
import time
import uuid

from confluent_kafka import Consumer as ConfluentConsumer, TopicPartition as ConfluentTP
from kafka import KafkaProducer

from eventbox_fixtures import env, query, read_topic, report, wait_until
from eventbox_handler_lib import Msg, produce, retry_conn

LEDGER_DDL = """
CREATE TABLE {s}.ledger (n bigserial, message_id text, part int, key text, seq int,
                         via text DEFAULT 'handler');
CREATE TABLE {s}.fixed (seq int PRIMARY KEY);
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.ledger (message_id, part, key, seq)
    VALUES (msg.message_id, msg."partition", convert_from(msg.key, 'UTF8'),
            (msg.payload->>'seq')::int);
    IF (msg.payload->>'poison')::boolean
       AND NOT EXISTS (SELECT 1 FROM {s}.fixed f WHERE f.seq = (msg.payload->>'seq')::int) THEN
        RAISE EXCEPTION 'poison order %', msg.payload->>'seq' USING ERRCODE = 'P0001';
    END IF;
    IF (msg.payload->>'bad_amount')::boolean THEN
        PERFORM (msg.payload->>'amount')::numeric;   -- 22P02: never retried
    END IF;
END $$;
"""


def statuses(c, sub):
    return {r[0]: (r[1], r[2], r[3]) for r in query(
        c, "SELECT message_id, status, attempts, last_error FROM eventbox.inbox "
           "WHERE subscription = %s", (sub,))}


def ledger(c, hc):
    return query(c, hc.q("SELECT message_id, part, key, seq, via FROM {s}.ledger ORDER BY n"))


def headers_of(rec):
    return {name: value.decode() for name, value in rec.headers}


def test_block_key_dead_letters_and_redrive(case, new_topic):
    """400 messages on 4 partitions and 10 keys; 3 poison messages (retried, then
    dead) and 1 with a bad amount (22P02: dead at its first attempt), on_dead
    'block_key' and a dead-letter topic. Every later message of those keys in
    their partition waits, unattempted, while all the others are processed;
    eventbox.blocked_keys names each block with its held count; the dead-letter
    topic (read with kafka-python) carries each dead message's key, value and
    headers plus the error headers. A second subscription consumes the dead
    letters and repairs them (the redrive path); the operator then skips two
    dead messages and retries the two others after fixing their cause: every
    message is handled exactly once and each key's messages in offset order."""
    hc = case(4)
    dlt = new_topic(2)
    hc.setup(LEDGER_DDL, max_attempts=2, backoff="50 ms", backoff_max="100 ms",
             on_dead="block_key", dead_letter_topic=dlt)
    msgs = []
    for i in range(400):
        poison = i in (13, 57, 122)
        bad = i == 201
        payload = {"seq": i, "poison": poison, "bad_amount": bad, "amount": "x" if bad else "1"}
        msgs.append(Msg(str(uuid.uuid4()), i % 4, "k%d" % (i % 10), payload, "Order"))
    dead_msgs = [m for m in msgs if m.payload["poison"] or m.payload["bad_amount"]]
    held = {m.mid for m in msgs for d in dead_msgs
            if m.partition == d.partition and m.key == d.key and m.payload["seq"] > d.payload["seq"]}
    free = [m for m in msgs if m.mid not in held and m not in dead_msgs]
    produce(hc.topic, msgs)

    def settled(c):
        st = statuses(c, hc.sub)
        if len(st) != len(msgs):
            return None
        done = [m for m in free if st[m.mid][0] == "processed"]
        dead = [m for m in dead_msgs if st[m.mid][0] == "dead"]
        return st if len(done) == len(free) and len(dead) == len(dead_msgs) else None

    st = wait_until(lambda: retry_conn(settled), 120, 0.3, "all free messages processed")
    # The held messages stay received and unattempted, also some time later.
    time.sleep(1.0)
    st = retry_conn(lambda c: statuses(c, hc.sub))
    assert {st[mid][:2] for mid in held} == {("received", 0)}
    for m in dead_msgs:
        status, attempts, error = st[m.mid]
        if m.payload["bad_amount"]:
            assert (status, attempts) == ("dead", 1) and error.startswith("22P02: "), st[m.mid]
        else:
            assert (status, attempts) == ("dead", 2) and error.startswith("P0001: "), st[m.mid]
    blocks = retry_conn(lambda c: query(
        c, "SELECT message_id, topic, \"partition\", convert_from(key, 'UTF8'), held, status "
           "FROM eventbox.blocked_keys WHERE subscription = %s", (hc.sub,)))
    want_blocks = {(d.mid, hc.topic, d.partition, d.key,
                    sum(1 for m in msgs if m.mid in held and m.partition == d.partition
                        and m.key == d.key), "dead") for d in dead_msgs}
    assert set(blocks) == want_blocks
    led = retry_conn(lambda c: ledger(c, hc))
    assert not {r[0] for r in led} & held, "a held message was attempted"

    # The dead letters, published by the relay (kafka-python reads them).
    recs = wait_until(lambda: (lambda r: r if len(r) == len(dead_msgs) else None)(
        read_topic(dlt, missing_ok=True)), 60, 0.5, "the dead letters on %s" % dlt)
    by_id = {headers_of(r)["__eventbox.errors.message_id"]: r for r in recs}
    assert set(by_id) == {m.mid for m in dead_msgs}
    for m in dead_msgs:
        r = by_id[m.mid]
        h = headers_of(r)
        assert r.key == m.key.encode()
        assert json.loads(r.value) == m.payload
        assert h["event_type"] == "Order"
        assert h["__connect.errors.topic"] == hc.topic
        assert h["__connect.errors.partition"] == str(m.partition)
        assert int(h["__connect.errors.offset"]) >= 0
        assert h["__connect.errors.connector.name"] == hc.sub
        assert h["__eventbox.errors.status"] == "dead"
        assert h["__eventbox.errors.attempts"] == ("1" if m.payload["bad_amount"] else "2")
        assert h["__connect.errors.exception.class.name"] == \
            ("22P02" if m.payload["bad_amount"] else "P0001")
        assert ("poison order %d" % m.payload["seq"] in h["__connect.errors.exception.message"]
                or m.payload["bad_amount"])
        assert r.message_id and r.message_id != m.mid   # the outbox row's own id
    offsets = {m.mid: int(headers_of(by_id[m.mid])["__connect.errors.offset"]) for m in dead_msgs}

    # The redrive path: a second subscription consumes the dead-letter topic and repairs
    # each message (here: records it in the ledger, marked 'redrive').
    repair_sub = "dlt_repair_%s" % uuid.uuid4().hex[:6]

    def make_repair(c):
        query(c, hc.q("""
            CREATE FUNCTION {s}.repair(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO {s}.ledger (message_id, part, key, seq, via)
                VALUES (msg.headers->>'__eventbox.errors.message_id',
                        (msg.headers->>'__connect.errors.partition')::int,
                        convert_from(msg.key, 'UTF8'), (msg.payload->>'seq')::int, 'redrive');
            END $$;
            GRANT EXECUTE ON FUNCTION {s}.repair(eventbox.inbox) TO {role};"""))
        query(c, "SELECT eventbox.create_subscription(%s, ARRAY[%s])", (repair_sub, dlt))
        query(c, hc.q("SELECT eventbox.register_handler(%s, '{s}.repair(eventbox.inbox)'"
                      "::regprocedure, run_as => '{role}')"), (repair_sub,))
    retry_conn(make_repair)
    try:
        wait_until(lambda: retry_conn(lambda c: query(
            c, hc.q("SELECT count(*) FROM {s}.ledger WHERE via = 'redrive'"))[0][0]
            == len(dead_msgs)), 60, 0.3, "the repair subscription to handle the dead letters")
        # Repaired by the redrive: skip two of them; fix the cause of the others and retry them.
        skipped, retried = dead_msgs[:2], dead_msgs[2:]

        def operate(c):
            for m in skipped:
                query(c, "SELECT eventbox.skip(%s, %s)", (hc.sub, m.mid))
            for m in retried:
                query(c, hc.q("INSERT INTO {s}.fixed VALUES (%s)"), (m.payload["seq"],))
                query(c, hc.q("UPDATE {s}.ledger SET via = 'superseded' WHERE via = 'redrive' "
                              "AND message_id = %s"), (m.mid,))
                if m.payload["bad_amount"]:
                    query(c, "UPDATE eventbox.inbox SET payload = payload || "
                             "'{\"amount\": \"12.5\"}' WHERE subscription = %s AND "
                             "message_id = %s", (hc.sub, m.mid))
                query(c, "SELECT eventbox.retry(%s, %s)", (hc.sub, m.mid))
        retry_conn(operate)

        def all_done(c):
            st = statuses(c, hc.sub)
            ok = sum(1 for s in st.values() if s[0] in ("processed", "ignored"))
            return st if ok == len(msgs) else None
        st = wait_until(lambda: retry_conn(all_done), 120, 0.3, "every message handled")
        assert retry_conn(lambda c: query(
            c, "SELECT count(*) FROM eventbox.blocked_keys WHERE subscription = %s",
            (hc.sub,)))[0][0] == 0
        led = retry_conn(lambda c: ledger(c, hc))
    finally:
        retry_conn(lambda c: query(c, "SELECT eventbox.drop_subscription(%s)", (repair_sub,)))

    # Exactly once: every message has one effect (the skipped ones through the redrive), and
    # each (partition, key) saw its messages in offset (= seq) order.
    effects = collections.Counter(r[0] for r in led if r[4] in ("handler", "redrive"))
    failed_attempts = {m.mid for m in dead_msgs}
    lost = [m.mid for m in msgs if effects[m.mid] == 0]
    dups = [mid for mid, n in effects.items() if n > 1 and mid not in failed_attempts]
    order_errors = 0
    last = {}
    for mid, part, key, seq, via in led:
        if via != "handler":
            continue
        if mid in failed_attempts and st[mid][0] == "ignored":
            continue   # its failed attempts were rolled back; the redrive repaired it
        if (part, key) in last and last[(part, key)] > seq:
            order_errors += 1
        last[(part, key)] = seq
    report("dead_letters_block_key", messages=len(msgs), dead=len(dead_msgs), held=len(held),
           dead_letters=len(recs), lost=len(lost), duplicated=len(dups),
           order_errors=order_errors, blocked_offsets=sorted(offsets.values()))
    assert lost == [] and dups == [] and order_errors == 0
    for m in skipped:
        assert st[m.mid][0] == "ignored"
    for m in retried:
        assert st[m.mid][0] == "processed"


def test_unparsable_records_go_to_the_dead_letter_topic(case, new_topic):
    """Records that are not JSON are stored 'unparsable' and, in the same
    transaction, sent to the dead-letter topic byte for byte with their key and
    headers (read back with confluent_kafka); a JSON record next to them is
    handled and sends nothing; a replay of the same records sends nothing more.

    The first record is stored on its own before the others are produced: the ingest stores
    the first batch after a start with ON CONFLICT in its transaction, and the next ones,
    expected to be new, in a subtransaction, whose rows carry the subtransaction's xid. Both
    ways must send their unparsable rows."""
    hc = case(1)
    dlt = new_topic(1)
    hc.setup(LEDGER_DDL, dead_letter_topic=dlt)
    raw = [b"\xff\xfe not json", b"{\"unterminated\": ", b""]
    producer = KafkaProducer(bootstrap_servers=env("EVENTBOX_BOOTSTRAP"), acks="all")
    ids = []
    for i, value in enumerate(raw + [json.dumps({"seq": 99}).encode()]):
        mid = str(uuid.uuid4())
        ids.append(mid)
        key = b"key-%d\x00bin" % i if i < 3 else b"key-3"   # binary keys kept as they are
        producer.send(hc.topic, value=value, key=key, partition=0,
                      headers=[("message_id", mid.encode()), ("origin", b"test-%d" % i),
                               ("binary", b"\x01\x02")])
        if i == 0:
            producer.flush(30)
            wait_until(lambda: len(retry_conn(lambda c: statuses(c, hc.sub))) == 1, 60, 0.2,
                       "the first record stored on its own")
    producer.flush(30)
    producer.close()
    wait_until(lambda: retry_conn(lambda c: (lambda st: len(st) == 4 and st[ids[3]][0] ==
                                             "processed")(statuses(c, hc.sub))),
               60, 0.3, "the records stored and the JSON one processed")
    st = retry_conn(lambda c: statuses(c, hc.sub))
    assert [st[m][0] for m in ids] == ["unparsable"] * 3 + ["processed"]

    def read_dlt(expect):
        consumer = ConfluentConsumer({"bootstrap.servers": env("EVENTBOX_BOOTSTRAP"),
                                      "group.id": "dlt-check-%s" % uuid.uuid4().hex,
                                      "enable.auto.commit": False})
        try:
            consumer.assign([ConfluentTP(dlt, 0, 0)])
            out = []
            deadline = time.monotonic() + 60
            while len(out) < expect and time.monotonic() < deadline:
                m = consumer.poll(0.5)
                if m is not None and m.error() is None:
                    out.append(m)
            # anything more arriving meanwhile would be a duplicate
            m = consumer.poll(2.0)
            while m is not None:
                if m.error() is None:
                    out.append(m)
                m = consumer.poll(0.5)
            return out
        finally:
            consumer.close()

    got = read_dlt(3)
    assert len(got) == 3
    for i, m in enumerate(got):
        h = {k: v for k, v in m.headers()}
        assert m.value() in (raw[i], None) and (m.value() or b"") == raw[i]
        assert m.key() == b"key-%d\x00bin" % i
        assert h["origin"] == b"test-%d" % i
        assert h["__eventbox.errors.status"] == b"unparsable"
        assert h["__eventbox.errors.message_id"] == ids[i].encode()
        assert h["__connect.errors.topic"] == hc.topic.encode()
        assert h["__connect.errors.offset"] == str(i).encode()
        assert h["__connect.errors.exception.message"]
    # Reading the partition again from offset 0 stores nothing new and sends nothing more.
    replayed_at = retry_conn(lambda c: query(
        c, "SELECT eventbox.replay(%s, %s, 0, 0); SELECT clock_timestamp()",
        (hc.sub, hc.topic))[0][0])
    wait_until(lambda: retry_conn(lambda c: query(
        c, "SELECT next_offset = 4 AND updated_at > %s FROM eventbox.offsets "
           "WHERE subscription = %s", (replayed_at, hc.sub))[0][0]), 60, 0.3,
        "the ingest worker to read the partition again")
    time.sleep(1.0)
    assert retry_conn(lambda c: query(
        c, "SELECT count(*) FROM eventbox.outbox WHERE topic = %s AND status = 'pending'",
        (dlt,)))[0][0] == 0
    again = read_dlt(3)
    report("dead_letters_unparsable", records=4, unparsable=3, dead_letters=len(again))
    assert len(again) == 3


def test_dead_letter_loop_through_two_subscriptions_ends(case):
    """Subscription A dead-letters into the topic B reads, and B into the topic A
    reads (each refuses only a dead-letter topic among its own topics). Before,
    a poison record and an unparsable one went round for ever: B's dead letter
    replaced A's name in __connect.errors.connector.name, so A dead-lettered its
    own record again when it came back. Now each dead letter also carries the
    trail (__eventbox.errors.subscriptions): A takes back its record once, marks
    it dead (or stores it unparsable) without a dead letter, with a note."""
    a, b = case(1), case(1)
    failing = """
        CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'poison %', msg.message_id USING ERRCODE = 'P0001';
        END $$;
    """
    a.setup(failing, max_attempts=1, dead_letter_topic=b.topic)
    b.setup(failing, max_attempts=1, dead_letter_topic=a.topic)
    poison, raw = str(uuid.uuid4()), str(uuid.uuid4())
    producer = KafkaProducer(bootstrap_servers=env("EVENTBOX_BOOTSTRAP"), acks="all")
    producer.send(a.topic, value=json.dumps({"poison": True}).encode(), key=b"k", partition=0,
                  headers=[("message_id", poison.encode())])
    producer.send(a.topic, value=b"\xff not json", key=b"k", partition=0,
                  headers=[("message_id", raw.encode())])
    producer.flush(30)
    producer.close()

    def rows(c, sub):
        return query(c, "SELECT message_id, status, last_error, "
                        "headers->>'__eventbox.errors.message_id', "
                        "headers->>'__eventbox.errors.subscriptions' "
                        "FROM eventbox.inbox WHERE subscription = %s ORDER BY \"offset\"", (sub,))

    def came_back(c):
        back = [r for r in rows(c, a.sub) if r[4] == "%s,%s" % (a.sub, b.sub)]
        done = [r for r in back if r[1] in ("dead", "unparsable")]
        return back if len(done) == 2 else None

    back = wait_until(lambda: retry_conn(came_back), 90, 0.3,
                      "both records back at %s through %s" % (a.sub, b.sub))
    note = "(no dead letter: it came from this subscription's dead letters)"
    assert sorted(r[1] for r in back) == ["dead", "unparsable"], back
    assert all(r[2].endswith(note) for r in back), back
    # The records came back once, and once is all: nothing more is in flight, since A's
    # returned rows committed without dead letters. Each subscription wrote two.
    a_rows, b_rows = retry_conn(lambda c: (rows(c, a.sub), rows(c, b.sub)))
    assert len(a_rows) == 4 and len(b_rows) == 2, (a_rows, b_rows)
    assert {r[1] for r in b_rows} == {"dead", "unparsable"}
    assert all(note not in (r[2] or "") for r in b_rows), b_rows
    assert {r[3] for r in b_rows} == {poison, raw}
    # (the relay deletes what it published once the broker acknowledged it)
    wait_until(lambda: retry_conn(lambda c: query(
        c, "SELECT count(*) FROM eventbox.outbox WHERE topic IN (%s, %s)",
        (a.topic, b.topic)))[0][0] == 0, 60, 0.3, "the outbox emptied")
    on_b, on_a = read_topic(b.topic), read_topic(a.topic)
    assert [headers_of(r)["__eventbox.errors.subscriptions"] for r in on_b] == [a.sub] * 2
    assert [headers_of(r).get("__eventbox.errors.subscriptions") for r in on_a] == \
        [None, None] + ["%s,%s" % (a.sub, b.sub)] * 2
    report("dead_letter_loop", records=2, stored_a=len(a_rows), stored_b=len(b_rows),
           dead_letters=len(on_b) + len(on_a) - 2)
