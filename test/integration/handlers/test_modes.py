"""Replay and backfill modes (issue 18), end to end with the workers running: records come from
kafka-python (an independent producer), what the relay publishes is read back with kafka-python.

- backfill => true: the records a partition held when the subscription was created run in mode
  'backfill', the later ones in 'live', switching at exactly the offset the ingest worker
  recorded (offsets.backfill_until); backfill and replay runs keep their sends in
  eventbox.suppressed_sends (nothing reaches Kafka) except the ones sent with
  publish_in_replay => true; eventbox.reprocess() re-runs everything in mode 'replay'; a dry run
  afterwards leaves every checksum as it was.
- reprocess() while live records keep arriving in the same partition: no live record waits for
  the queued replays longer than one pass of a handler worker.
"""

import time
import uuid

from eventbox_fixtures import (connect, query, query_one, read_topic, report, wait_outbox_drained,
                               wait_until)
from eventbox_handler_lib import Msg, Producer, retry_conn, wait_settled

PASS_SIZE = 1024  # kMessagesPerPass (src/handlers/worker.cpp): what one pass of a worker takes
SLACK = 16
REPLAYS = 3 * PASS_SIZE // 2  # queued by reprocess() ahead of the live records

MODES_DDL = """
CREATE TABLE {s}.seen (message_id text, mode text, at timestamptz DEFAULT clock_timestamp(),
                       n bigserial);
CREATE TABLE {s}.totals (id int PRIMARY KEY, total int);
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.seen (message_id, mode) VALUES (msg.message_id, eventbox.current_mode());
    INSERT INTO {s}.totals VALUES ((msg.payload->>'seq')::int, (msg.payload->>'seq')::int)
        ON CONFLICT (id) DO UPDATE SET total = {s}.totals.total + 1;
    PERFORM eventbox.send('{out}', msg.payload, key => msg.message_id);
    PERFORM eventbox.send('{audit}', msg.payload, msg.message_id, '{}', NULL,
                          publish_in_replay => true);
END $$;
GRANT USAGE ON SCHEMA eventbox TO {role};
GRANT EXECUTE ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid, boolean),
    eventbox.current_mode() TO {role};
"""


def msgs(first, n, partitions):
    return [Msg(str(uuid.uuid4()), i % partitions, "k%d" % i, {"seq": i}, None)
            for i in range(first, first + n)]


def checksums(c, hc):
    return query(c, hc.q("""
        SELECT (SELECT md5(string_agg(i::text, '|' ORDER BY message_id)) FROM eventbox.inbox i
                 WHERE i.subscription = '{sub}'),
               (SELECT md5(coalesce(string_agg(o::text, '|' ORDER BY id), '')) FROM eventbox.outbox o),
               (SELECT md5(coalesce(string_agg(s::text, '|' ORDER BY id), ''))
                  FROM eventbox.suppressed_sends s),
               (SELECT md5(string_agg(t::text, '|' ORDER BY id)) FROM {s}.totals t),
               (SELECT md5(string_agg(t::text, '|' ORDER BY n)) FROM {s}.seen t)"""))[0]


def test_backfill_switches_at_the_exact_offset_and_replays_suppress(case, new_topic):
    hc = case(2)
    out, audit = new_topic(1), new_topic(1)
    producer = Producer()
    history = msgs(0, 30, 2)
    assert producer.send(hc.topic, history) == 30
    hc.setup(MODES_DDL.replace("{out}", out).replace("{audit}", audit), sends=True,
             backfill=True)

    # The ingest worker records each partition's boundary when it first takes the partition.
    def boundaries(c):
        return dict(query(c, "SELECT \"partition\", backfill_until FROM eventbox.offsets "
                             "WHERE subscription = %s AND backfill_until IS NOT NULL", (hc.sub,)))
    wait_until(lambda: len(retry_conn(boundaries)) == 2, 60, 0.2, "both partitions' boundaries")
    assert retry_conn(boundaries) == {0: 15, 1: 15}
    live = msgs(30, 30, 2)
    assert producer.send(hc.topic, live) == 30
    producer.close()
    assert wait_settled(hc.sub, 60, timeout=120) == {"processed": 60}

    c = connect()
    try:
        rows = query(c, "SELECT \"partition\", \"offset\", mode, message_id FROM eventbox.inbox "
                        "WHERE subscription = %s", (hc.sub,))
        wrong = [r for r in rows if r[2] != ("backfill" if r[1] < 15 else "live")]
        assert not wrong, wrong
        assert {r[3] for r in rows if r[2] == "backfill"} == {m.mid for m in history}
        seen = dict(query(c, hc.q("SELECT message_id, mode FROM {s}.seen")))
        assert seen == {r[3]: r[2] for r in rows}  # current_mode() as recorded

        # Backfill sends are suppressed, live ones published; the audit send always goes out.
        wait_outbox_drained(timeout=120)
        assert sorted(r.key.decode() for r in read_topic(out)) == sorted(m.mid for m in live)
        assert len(read_topic(audit)) == 60
        suppressed = query(c, "SELECT convert_from(key, 'UTF8'), mode, caused_by, topic "
                              "FROM eventbox.suppressed_sends WHERE subscription = %s", (hc.sub,))
        assert sorted(suppressed) == sorted((m.mid, "backfill", m.mid, out) for m in history)

        # The handler "fixed": everything again, in mode 'replay'.
        assert query_one(c, "SELECT eventbox.reprocess(%s)", (hc.sub,)) == 60
        assert wait_settled(hc.sub, 60, timeout=120) == {"processed": 60}
        assert query_one(c, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s "
                            "AND mode = 'replay' AND attempts = 1", (hc.sub,)) == 60
        assert query_one(c, hc.q("SELECT count(*) FROM {s}.seen WHERE mode = 'replay'")) == 60
        wait_outbox_drained(timeout=120)
        assert len(read_topic(out)) == 30  # nothing more
        assert len(read_topic(audit)) == 120
        assert query_one(c, "SELECT count(*) FROM eventbox.suppressed_sends WHERE subscription = %s "
                            "AND mode = 'replay'", (hc.sub,)) == 60

        # A dry run of the current handler: a report, and every checksum as it was.
        before = checksums(c, hc)
        report_rows = query(c, "SELECT outcome, tables, jsonb_array_length(sends) "
                               "FROM eventbox.dry_run(%s, max_messages => 10)", (hc.sub,))
        assert len(report_rows) == 10
        for outcome, tables, n_sends in report_rows:
            assert outcome == "ok"
            assert tables[hc.schema + ".seen"]["inserted"] == 1, tables
            assert tables[hc.schema + ".totals"]["updated"] == 1, tables
            assert n_sends == 2
        assert checksums(c, hc) == before
    finally:
        c.close()
    report("modes_backfill_replay", messages=60, backfill=30, live_published=30,
           replayed=60, suppressed=90, dry_run=10)


SLOW_DDL = """
CREATE TABLE {s}.seen (message_id text, mode text, at timestamptz DEFAULT clock_timestamp(),
                       n bigserial);
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.seen (message_id, mode) VALUES (msg.message_id, msg.mode);
    PERFORM pg_sleep(0.001);
END $$;
"""


def test_reprocess_does_not_hold_live_messages_back(case):
    # One partition: the replays and the live records share a lane.
    hc = case(1)
    hc.setup(SLOW_DDL)
    producer = Producer()
    old = msgs(0, REPLAYS, 1)
    assert producer.send(hc.topic, old) == REPLAYS
    assert wait_settled(hc.sub, REPLAYS, timeout=180) == {"processed": REPLAYS}
    queued = retry_conn(lambda c: query_one(c, "SELECT eventbox.reprocess(%s)", (hc.sub,)))
    assert queued == REPLAYS
    live = msgs(REPLAYS, 20, 1)
    for m in live:
        producer.send(hc.topic, [m])
        time.sleep(0.05)
    producer.close()
    assert wait_settled(hc.sub, REPLAYS + 20, timeout=180) == {"processed": REPLAYS + 20}

    def figures(c):
        return query(c, hc.q("""
            SELECT l.message_id,
                   (SELECT count(*) FROM {s}.seen r
                     WHERE r.mode = 'replay' AND r.n < l.n AND r.at > i.received_at) AS overtaken_by,
                   (SELECT count(*) FROM {s}.seen r
                     WHERE r.mode = 'replay' AND r.at > i.received_at) AS replays_after_arrival
              FROM {s}.seen l JOIN eventbox.inbox i
                ON i.subscription = '{sub}' AND i.message_id = l.message_id
             WHERE l.mode = 'live' AND i."offset" >= %d""" % REPLAYS))
    rows = retry_conn(figures)
    assert len(rows) == 20
    worst = max(r[1] for r in rows)
    # Meaningful only if replays were still queued when live records arrived ...
    assert max(r[2] for r in rows) > PASS_SIZE, rows
    # ... and none of those waited behind more than one pass of them. (received_at is the
    # ingest transaction's start, a few milliseconds before the row is visible to a pass: the
    # replays that ran in those milliseconds count too, hence the small slack. Read in offset
    # order, the live records waited behind all of them.)
    assert worst <= PASS_SIZE + SLACK, rows
    report("modes_reprocess_live", replays=REPLAYS, live=20, worst_overtaken=worst,
           pass_size=PASS_SIZE)
