"""Lineage without effort (issue 17): eventbox.send() called by a handler adds causation_id,
correlation_id and traceparent. Three subscriptions in a chain (topic 1 -> handler -> topic 2
-> handler -> topic 3 -> handler) carry one correlation id and one trace end to end; the first
records come from confluent_kafka (librdkafka), an independent producer."""

import json
import re
import uuid

import confluent_kafka

from eventbox_fixtures import env, query, report
from eventbox_handler_lib import retry_conn, wait_settled

FORWARD_DDL = """
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM eventbox.send('{next}', msg.payload, key => convert_from(msg.key, 'UTF8'),
                          headers => '{"event_type": "Hop"}');
END $$;
"""
LAST_DDL = """
CREATE TABLE {s}.seen (message_id text, headers jsonb);
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.seen VALUES (msg.message_id, msg.headers);
END $$;
"""
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
N = 40


def test_three_subscriptions_carry_one_correlation_id(case):
    first, second, third = case(2), case(2), case(2)
    third.setup(LAST_DDL)
    second.setup(FORWARD_DDL.replace("{next}", third.topic), sends=True)
    first.setup(FORWARD_DDL.replace("{next}", second.topic), sends=True)

    # Half the records are in a conversation with a trace; the others carry no lineage.
    producer = confluent_kafka.Producer({"bootstrap.servers": env("EVENTBOX_BOOTSTRAP"),
                                         "acks": "all", "client.id": "eventbox-lineage-test"})
    origin = {}
    for i in range(N):
        mid = str(uuid.uuid4())
        headers = [("message_id", mid.encode())]
        if i % 2 == 0:
            headers += [("correlation_id", ("conversation-%d" % i).encode()),
                        ("traceparent", ("00-%s-%016x-01" % (TRACE_ID, i + 1)).encode())]
        origin[mid] = i
        producer.produce(first.topic, value=json.dumps({"seq": i}).encode(),
                         key=("k%d" % (i % 5)).encode(), headers=headers)
    assert producer.flush(60) == 0

    for hc in (first, second, third):
        status = wait_settled(hc.sub, N, timeout=120)
        assert status == {"processed": N}, (hc.sub, status)

    def rows(c, sub):
        return {m: h for m, h in query(c, "SELECT message_id, headers FROM eventbox.inbox "
                                          "WHERE subscription = %s", (sub,))}
    hop2 = retry_conn(lambda c: rows(c, second.sub))
    seen = retry_conn(lambda c: dict(query(c, third.q("SELECT message_id, headers FROM {s}.seen"))))
    assert len(hop2) == N and len(seen) == N

    traced = 0
    for mid, headers in seen.items():
        # One step back: the second subscription's message that caused this one, whose own
        # cause is an original record.
        cause = headers["causation_id"]
        assert cause in hop2, headers
        root = hop2[cause]["causation_id"]
        assert root in origin, hop2[cause]
        i = origin[root]
        want = "conversation-%d" % i if i % 2 == 0 else root
        assert headers["correlation_id"] == want, (i, headers)
        assert hop2[cause]["correlation_id"] == want, (i, hop2[cause])
        assert headers["event_type"] == "Hop"
        if i % 2 == 0:
            spans = ["%016x" % (i + 1)]
            for h in (hop2[cause], headers):
                m = re.fullmatch(r"00-([0-9a-f]{32})-([0-9a-f]{16})-01", h["traceparent"])
                assert m and m.group(1) == TRACE_ID, h
                spans.append(m.group(2))
            assert len(set(spans)) == 3, spans  # a new parent span at every hop
            traced += 1
        else:
            assert "traceparent" not in headers and "traceparent" not in hop2[cause], headers
    assert traced == N // 2
    report("lineage_chain", messages=N, hops=3, traced=traced)
