"""Rows the producer refuses before they reach the broker, and what send()
accepts so that it never creates one.

Before: the relay wrote the outcomes of a pass first and cleared them all when
the pass committed, so a failure recorded while that pass offered rows (a
record librdkafka refused at once, e.g. too large) was dropped: the row stayed
`pending` with attempts 0 and no last_error, nothing was logged, and the
later rows of its key waited behind it forever.
"""

import uuid

from confluent_kafka import Consumer, TopicPartition

from eventbox_fixtures import (env, query, query_one, read_topic, wait_for_ids, wait_until)


def test_row_refused_by_the_producer_is_recorded_fails_and_releases_its_key(
        conn, new_topic, settings):
    """A row larger than the producer accepts (inserted directly, as a row
    stored before eventbox.max_message_bytes was lowered would be): every
    attempt is written, it ends `failed` after eventbox.relay_max_attempts,
    and the next row of its key is delivered."""
    topic = new_topic(1)
    settings.set("eventbox.relay_max_attempts", "2")
    settings.set("eventbox.relay_retry_backoff", "100ms")
    big_id = str(uuid.uuid4())
    # The producer's message.max.bytes is max(eventbox.max_message_bytes + 64 KiB, 1000000).
    query(conn, """
        INSERT INTO eventbox.outbox (message_id, topic, key, payload, headers)
        VALUES (%s, %s, 'k', convert_to(repeat('x', 3000000), 'UTF8'), '{}')""",
          (big_id, topic))
    after = query_one(conn, "SELECT eventbox.send(%s, '{\"n\": 2}'::jsonb, key => 'k')",
                      (topic,))

    def status():
        return query(conn, "SELECT status, attempts, last_error FROM eventbox.outbox "
                           "WHERE message_id = %s", (big_id,))[0]
    wait_until(lambda: status()[0] == "failed", 60,
               what="the refused row to end failed: %r" % (status(),))
    st, attempts, last_error = status()
    assert attempts == 2, (st, attempts, last_error)
    assert last_error and "too large" in last_error.lower(), last_error
    # Its key moves on: the later row is delivered (and the refused one never is).
    wait_for_ids(topic, {after}, timeout=60)
    ids = [r.message_id for r in read_topic(topic)]
    assert ids == [after], ids


def test_a_thousand_headers_reach_every_client_with_their_message_id(conn, new_topic):
    """The documented limit (1000 headers besides message_id) is readable by
    kafka-python and by librdkafka (confluent_kafka), message_id included;
    one more is refused by send() with 54000."""
    topic = new_topic(1)
    headers = "{%s}" % ",".join('"h%d": "v%d"' % (i, i) for i in range(1000))
    mid = query_one(conn, "SELECT eventbox.send(%s, '{\"n\": 1}'::jsonb, headers => %s::jsonb)",
                    (topic, headers))
    wait_for_ids(topic, {mid}, timeout=60)
    rec = read_topic(topic)[0]
    assert rec.message_id == mid
    assert len(rec.headers) == 1001

    c = Consumer({"bootstrap.servers": env("EVENTBOX_BOOTSTRAP"), "group.id": "hdr-" + topic,
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        msg = None
        for _ in range(100):
            msg = c.poll(0.5)
            if msg is not None and not msg.error():
                break
        assert msg is not None and not msg.error(), msg and msg.error()
        got = dict((k, v) for k, v in msg.headers())
        assert got["message_id"].decode() == mid
        assert len(msg.headers()) == 1001
    finally:
        c.close()

    too_many = "{%s}" % ",".join('"h%d": ""' % i for i in range(1001))
    try:
        query(conn, "SELECT eventbox.send(%s, '{}'::jsonb, headers => %s::jsonb)",
              (topic, too_many))
        raise AssertionError("1001 headers were accepted")
    except Exception as e:  # psycopg2 error carrying the SQLSTATE
        assert getattr(e, "pgcode", None) == "54000", e
