"""eventbox_e2e_seconds, the end-to-end latency of docs/reference/metrics.md: a handler that sends
one message to an HTTP destination (a local endpoint that answers after a delay) and one to Kafka
per inbox message is observed once per message sent, from the inbox message's received_at to the
destination's acknowledgement; messages sent outside a handler are not observed."""
import pathlib
import sys
import time
import uuid

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "http"))

from http_support import Endpoint  # noqa: E402
from eventbox_fixtures import cancel_unsent, connect, query, query_one, wait_outbox_drained, wait_until  # noqa: E402,E501
from eventbox_handler_lib import Msg, produce, wait_settled  # noqa: E402

HANDLER_SLEEP = 0.05  # seconds in the handler, per message
HTTP_DELAY = 0.3      # seconds the endpoint waits before its 2xx

SEND_DDL = """
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(%s);
    PERFORM eventbox.send('{http}', jsonb_build_object('in', msg.message_id),
                          key => msg.message_id);
    PERFORM eventbox.send('{kafka}', jsonb_build_object('in', msg.message_id),
                          key => msg.message_id);
END $$;
""" % HANDLER_SLEEP


def histogram(conn, sub):
    """(count, sum, {le: cumulative count}) of eventbox_e2e_seconds{subscription=sub}."""
    rows = query(conn, "SELECT name, labels->>'le', value FROM eventbox.metrics "
                       "WHERE name LIKE 'eventbox_e2e_seconds%%' "
                       "AND labels->>'subscription' = %s", (sub,))
    count = total = 0.0
    buckets = {}
    for name, le, value in rows:
        if name == "eventbox_e2e_seconds_count":
            count = value
        elif name == "eventbox_e2e_seconds_sum":
            total = value
        elif name == "eventbox_e2e_seconds_bucket":
            buckets[le] = value
    return count, total, buckets


def test_e2e_histogram_counts_each_handler_send_until_its_ack(conn, case, new_topic):
    def answer(n, rec):
        time.sleep(HTTP_DELAY)
        return ("status", 204)

    ep = Endpoint(answer)
    http_topic = "h_e2e_%s" % uuid.uuid4().hex[:10]
    kafka_topic = new_topic(2, suffix="_out")
    hc = case(2)
    query(conn, "SELECT eventbox.create_http_destination(%s, %s)", (http_topic, ep.url))
    try:
        hc.setup(SEND_DDL.replace("{http}", http_topic).replace("{kafka}", kafka_topic),
                 sends=True)
        # Sent outside a handler, to both destinations: delivered, never observed.
        query(conn, "SELECT eventbox.send(t, '{\"outside\": true}'::jsonb) "
                    "FROM unnest(ARRAY[%s, %s]) t, generate_series(1, 5)",
                    (http_topic, kafka_topic))
        wait_outbox_drained(http_topic, timeout=60)
        wait_outbox_drained(kafka_topic, timeout=60)
        assert len(ep.snapshot()) == 5
        assert histogram(conn, hc.sub)[0] == 0

        n = 20
        t0 = time.monotonic()
        produce(hc.topic, [Msg(str(uuid.uuid4()), i % 2, "k%d" % i, {"i": i}, None)
                           for i in range(n)])
        status = wait_settled(hc.sub, n, timeout=120)
        assert status.get("processed") == n, status
        wait_outbox_drained(http_topic, timeout=60)
        wait_outbox_drained(kafka_topic, timeout=60)
        wait_until(lambda: histogram(conn, hc.sub)[0] >= 2 * n, 30,
                   what="%d observations of eventbox_e2e_seconds" % (2 * n))
        elapsed = time.monotonic() - t0
        count, total, buckets = histogram(conn, hc.sub)
        received = query(conn, "SELECT extract(epoch FROM max(received_at) - min(received_at)) "
                               "FROM eventbox.inbox WHERE subscription = %s", (hc.sub,))
        print("e2e: count %d sum %.3f s (mean %.3f s), buckets %s, test %.1f s, received over "
              "%s s" % (count, total, total / max(count, 1), buckets, elapsed, received[0][0]))
        # One observation per message sent by a handler: n to HTTP, n to Kafka, none of the
        # 10 sent outside.
        assert count == 2 * n
        assert buckets["+Inf"] == count
        # Every message waited at least for its handler's sleep, the HTTP ones also for the
        # endpoint's delay; none took longer than the test.
        assert total >= n * (HANDLER_SLEEP + HTTP_DELAY) + n * HANDLER_SLEEP
        assert total <= 2 * n * elapsed
        assert buckets["0.025"] == 0
        assert buckets["0.25"] <= n  # the HTTP sends all took over 0.3 s
        assert len(ep.snapshot()) == 5 + n
        # Every message was delivered (and its row deleted).
        assert query_one(conn, "SELECT count(*) FROM eventbox.outbox WHERE topic IN (%s, %s)",
                         (http_topic, kafka_topic)) == 0
    finally:
        c = connect()
        try:
            cancel_unsent(c, http_topic)
            query(c, "SELECT eventbox.drop_http_destination(%s)", (http_topic,))
        finally:
            c.close()
        ep.close()


def test_send_in_a_handler_records_its_cause(conn, case, new_topic):
    """The outbox row of a handler's send carries the subscription and received_at of the
    message handled (read in the handler's own transaction, before the relay can take it)."""
    out = new_topic(1, suffix="_out")
    hc = case(1)
    hc.setup("""
CREATE TABLE {s}.seen (cause_subscription text, cause_received_at timestamptz,
                       received_at timestamptz);
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    sent uuid;
BEGIN
    sent := eventbox.send('%s', '{}'::jsonb);
    INSERT INTO {s}.seen
    SELECT o.cause_subscription, o.cause_received_at, msg.received_at
      FROM eventbox.outbox o WHERE o.message_id = sent;
END $$;
""" % out, sends=True)
    produce(hc.topic, [Msg(str(uuid.uuid4()), 0, "k", {"i": 1}, None)])
    wait_settled(hc.sub, 1, timeout=120)
    rows = query(conn, hc.q("SELECT cause_subscription, cause_received_at = received_at "
                            "FROM {s}.seen"))
    assert rows == [(hc.sub, True)]
    wait_outbox_drained(out, timeout=60)
