"""The relay of a topic with a registry format (eventbox.set_topic_format(), docs/guide/formats.md)
SIGKILLed while its encoding waits for a Schema Registry that is down (connections refused) and
then hangs (every request outlasts the 10 s request timeout); the registry comes back. Every
message is then in Kafka at least once (counted by distinct message id, duplicates reported),
in the wire format with the subject's schema id, decodable by python3-avro (an implementation
independent of the extension) into the payload sent, in its key's order.

Each SIGKILL makes the postmaster restart the server; the killed pids are recorded in
$EVENTBOX_KILLED_PIDS for the run's log scan."""
import collections
import json
import time

import pytest

from eventbox_fixtures import (connect, count_ids, query, query_one, read_topic, report, sigkill,
                               wait_outbox_drained, wait_relay, wait_until)
from schema_registry import SchemaRegistry, avro_decode

MESSAGES = 3_000
KEYS = 40
PARTITIONS = 4
HANGING_S = 30.0  # above the registry's 10 s default request.timeout.ms

EVENT = json.dumps({
    "type": "record", "name": "Event", "namespace": "com.example.fault",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "key", "type": "string"},
        {"name": "seq", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ]})


@pytest.fixture
def registry(settings):
    r = SchemaRegistry().start()
    settings.set("eventbox.schema_registry_url", r.url)
    # The relay's backoff is not under test: a short cap keeps the recovery after the outage
    # within seconds.
    settings.set("eventbox.relay_retry_backoff_max", "2s")
    yield r
    r.stop()


def attempted_with_error(topic):
    c = connect()
    try:
        return query_one(c, "SELECT count(*) FROM eventbox.outbox WHERE topic = %s "
                            "AND status = 'pending' AND last_error LIKE %s",
                         (topic, "%schema registry%"))
    finally:
        c.close()


def test_sigkill_relay_while_encoding_waits_for_the_registry(extension, new_topic, registry,
                                                            log_watch):
    topic = new_topic(PARTITIONS)
    sid = registry.register(topic + "-value", EVENT)
    subject_path = "/subjects/%s-value/versions/" % topic
    c = connect()
    try:
        query(c, "SELECT eventbox.set_topic_format(%s, 'registry')", (topic,))
        registry.stop()  # down: connections refused
        for start in range(0, MESSAGES, 500):
            query(c, "SELECT eventbox.send(%s, jsonb_build_object('id', 'e-' || g, "
                     "'key', 'k' || (g %% %s), 'seq', g, 'note', "
                     "CASE WHEN g %% 3 = 0 THEN 'n' || g END), key => 'k' || (g %% %s)) "
                     "FROM generate_series(%s, %s) g",
                  (topic, KEYS, KEYS, start, min(start + 500, MESSAGES) - 1))
        ids = [r[0] for r in query(
            c, "SELECT message_id::text FROM eventbox.outbox WHERE topic = %s", (topic,))]
    finally:
        c.close()
    assert len(ids) == MESSAGES

    killed = []
    # 1. Down: the relay's attempts fail with the registry's reason; kill it meanwhile.
    wait_until(lambda: attempted_with_error(topic) > 0, 60,
               what="the relay to report the registry outage")
    pid = wait_relay()
    killed.append(pid)
    sigkill(pid)
    pid = wait_relay(not_pid=pid, timeout=120)
    # 2. Hanging: the registry accepts connections and answers after the request timeout; kill
    # the relay while its fetch of the subject is in flight.
    registry.delay = HANGING_S
    registry.start()
    asked = registry.count(subject_path)
    wait_until(lambda: registry.count(subject_path) > asked, 60,
               what="the relay to ask the hanging registry")
    pending_at_kill = attempted_with_error(topic)
    killed.append(pid)
    sigkill(pid)
    pid = wait_relay(not_pid=pid, timeout=120)
    asked = registry.count(subject_path)
    wait_until(lambda: registry.count(subject_path) > asked, 60,
               what="the new relay to ask the hanging registry")
    c = connect()
    try:
        # Sent rows leave the outbox: all must still be there, pending.
        pending_while_down = query_one(c, "SELECT count(*) FROM eventbox.outbox "
                                          "WHERE topic = %s AND status = 'pending'", (topic,))
    finally:
        c.close()
    # 3. Back.
    registry.delay = 0.0
    back = time.monotonic()
    wait_outbox_drained(topic, timeout=180)
    drained_s = time.monotonic() - back

    recs = read_topic(topic)
    lost, dups, unexpected = count_ids(recs, ids)
    bad, first_seq = [], collections.defaultdict(list)
    seen = set()
    for r in recs:
        if r.value[:5] != b"\x00" + sid.to_bytes(4, "big"):
            bad.append((r.message_id, r.value[:5]))
            continue
        d = avro_decode(EVENT, r.value[5:])
        g = d["seq"]
        want = {"id": "e-%d" % g, "key": "k%d" % (g % KEYS), "seq": g,
                "note": "n%d" % g if g % 3 == 0 else None}
        if d != want or r.key != want["key"].encode():
            bad.append((r.message_id, d))
        if r.message_id not in seen:
            seen.add(r.message_id)
            first_seq[(r.partition, r.key)].append(g)
    # Per key (one partition each): the first copies in the order they were sent.
    disorder = [k for k, seqs in first_seq.items() if seqs != sorted(seqs)]
    c = connect()
    try:
        statuses = query(c, "SELECT status, count(*) FROM eventbox.outbox WHERE topic = %s "
                            "GROUP BY 1 ORDER BY 1", (topic,))
    finally:
        c.close()
    report("fault_registry_relay", messages=MESSAGES, kills=len(killed), records=len(recs),
           lost=lost, duplicated=dups, unexpected=unexpected, undecodable=len(bad),
           keys_out_of_order=len(disorder), pending_while_down=pending_while_down,
           pending_with_registry_error_at_kill2=pending_at_kill,
           drained_after_back_s="%.1f" % drained_s)
    assert pending_while_down == MESSAGES, "rows left the outbox while the registry was down"
    assert lost == 0 and unexpected == 0, (lost, unexpected)
    assert bad == [], bad[:5]
    assert disorder == [], disorder[:5]
    assert all(s != "failed" for s, _ in statuses), statuses
    crashes = [ln for ln in log_watch.lines(r"terminated by signal|server process \(PID")
               if not any("(PID %d)" % p in ln for p in killed)]
    assert not crashes, "unexpected crash lines:\n" + "\n".join(crashes)
