"""A record whose headers the ingest worker's client cannot parse is kept
visibly, never as if it had no headers.

Before: librdkafka refused to parse the headers of a record with 100,001 of
them (kafka-python writes such records), and the record was stored with no
headers and no note: its message_id and event_type were lost without trace,
so it was deduplicated by its transport id and routed as untyped. Now it is
stored `unparsable` (no handler runs a message whose identity and type are
unknown), with its value's bytes, a note in last_error and its transport id
(counted in eventbox.workers.transport_ids).
"""

import json

from kafka import KafkaProducer

from eventbox_fixtures import env, query, query_one, wait_until


def test_record_with_unreadable_headers_is_unparsable_with_a_note(conn, new_topic):
    topic = new_topic(1)
    sub = "unreadable_" + topic[-8:]
    query(conn, "SELECT eventbox.create_subscription(%s, ARRAY[%s])", (sub, topic))
    transport_before = query_one(conn, "SELECT coalesce(sum(transport_ids), 0) "
                                       "FROM eventbox.workers WHERE role = 'ingest'")
    producer = KafkaProducer(bootstrap_servers=env("EVENTBOX_BOOTSTRAP"), acks="all",
                             max_request_size=16 * 1024 * 1024)
    try:
        many = [("message_id", b"m-many"), ("event_type", b"OrderCreated")]
        many += [("h%d" % i, b"") for i in range(100000)]
        value = json.dumps({"id": 1, "type": "OrderCreated"}).encode()
        producer.send(topic, value=value, headers=many, partition=0).get(timeout=60)
        # A normal record after it: ingest goes on.
        producer.send(topic, value=b'{"id": 2}', headers=[("message_id", b"m-next")],
                      partition=0).get(timeout=60)
        producer.flush(60)
    finally:
        producer.close(10)
    try:
        wait_until(lambda: query_one(conn, "SELECT count(*) FROM eventbox.inbox "
                                           "WHERE subscription = %s", (sub,)) == 2,
                   60, what="both records to be stored")
        rows = query(conn, """SELECT message_id, status, payload IS NULL, raw_payload, event_type,
                                     headers, last_error
                                FROM eventbox.inbox WHERE subscription = %s ORDER BY "offset" """,
                     (sub,))
        mid, status, payload_null, raw, event_type, headers, last_error = rows[0]
        assert mid == "%s/0/0" % topic, mid
        assert status == "unparsable"
        assert payload_null and bytes(raw) == value
        assert event_type is None
        assert headers == {}
        assert last_error.startswith("headers could not be read"), last_error
        assert rows[1][0] == "m-next" and rows[1][1] == "received", rows[1]
        transport_after = query_one(conn, "SELECT coalesce(sum(transport_ids), 0) "
                                          "FROM eventbox.workers WHERE role = 'ingest'")
        assert transport_after >= transport_before + 1
    finally:
        query(conn, "SELECT eventbox.drop_subscription(%s)", (sub,))
