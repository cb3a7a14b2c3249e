"""HTTP destinations end to end: a local endpoint (Python's standard library) answers 2xx, 500,
429 with Retry-After, 400, hangs past the timeout, closes the connection mid-response, or is
down; every message must reach it exactly as often as the rules say, per-key order must hold
across retries, permanent failures end `failed` with the status recorded, and a hanging endpoint
must not hold up a Kafka topic."""
import collections
import json
import re
import threading
import time
import uuid

import pytest

from eventbox_fixtures import (query, query_one, wait_until, wait_outbox_drained, wait_for_ids,
                               LogWatcher)
from http_support import free_port


def send(conn, topic, n, keys=4, start=0, headers=None):
    """Sends n JSON messages {"i": start+k} with key 'k<i % keys>' in one transaction; returns
    their message ids in order."""
    return [r[0] for r in query(
        conn, "SELECT eventbox.send(%s, jsonb_build_object('i', i), key => 'k' || (i %% %s), "
              "headers => %s)::text FROM generate_series(%s, %s) i ORDER BY i",
        (topic, keys, json.dumps(headers or {}), start, start + n - 1))]


def wait_status(conn, topic, n, timeout=60):
    """Waits until no row of `topic` is pending (delivered rows are deleted) and returns the
    rows left: (message_id, status, attempts, last_error)."""
    wait_outbox_drained(topic, timeout=timeout)
    return query(conn, "SELECT message_id::text, status, attempts, last_error FROM eventbox.outbox "
                       "WHERE topic = %s ORDER BY id", (topic,))


@pytest.fixture
def fast_retries(settings):
    settings.set("eventbox.relay_retry_backoff", "50ms")
    settings.set("eventbox.relay_retry_backoff_max", "200ms")
    settings.set("eventbox.relay_max_attempts", "3")
    return settings


def test_delivered_once_with_body_and_headers(conn, endpoint, http_topic):
    ep = endpoint()
    topic = http_topic(ep.url, headers=json.dumps({"Authorization": "Bearer abc123"}))
    ids = send(conn, topic, 30, headers={"event_type": "InvoiceCreated", "odd name/x": "v"})
    raw = query_one(conn, "SELECT eventbox.send(%s, '\\x00ff01'::bytea, key => 'raw')::text",
                    (topic,))
    tomb = query_one(conn, "SELECT eventbox.send(%s, NULL::jsonb)::text", (topic,))
    assert wait_status(conn, topic, 32) == []
    reqs = ep.snapshot()
    by_key = {r.key: r for r in reqs}
    assert sorted(by_key) == sorted(ids + [raw, tomb])
    assert len(reqs) == 32, "every message exactly once"
    for i, mid in enumerate(ids):
        r = by_key[mid]
        assert r.method == "POST" and r.path == "/hook"
        assert r.headers["idempotency-key"] == '"%s"' % mid
        assert r.headers["content-type"] == "application/json"
        assert json.loads(r.body) == {"i": i}
        assert r.headers["eventbox-header-event_type"] == "InvoiceCreated"
        assert r.headers["eventbox-header-odd%20name%2fx"] == "v"
        assert r.headers["eventbox-topic"] == topic
        assert r.headers["authorization"] == "Bearer abc123"
    assert by_key[raw].body == b"\x00\xff\x01"
    assert by_key[raw].headers["content-type"] == "application/octet-stream"
    assert by_key[tomb].body == b"" and "content-type" not in by_key[tomb].headers
    # Kept-alive connections: far fewer than requests.
    assert ep.connections <= 32


def test_transient_failures_retry_in_key_order(conn, endpoint, http_topic, fast_retries):
    """500, 429 + Retry-After, 503, a hang past the timeout and a connection closed mid-response
    are retried until delivered; a key's later message is never requested before its earlier one
    was delivered, and each message is answered 2xx exactly once."""
    plan = {3: [("status", 500)], 7: [("status", 429, {"Retry-After": "1"})],
            8: [("status", 503, {}, b"maintenance")] * 2, 12: [("hang", 3)],
            17: [("close",)], 21: [("status", 500), ("close",), ("status", 502)]}

    def behaviour(n, rec):
        steps = plan.get(rec.json()["i"], [])
        return steps[n - 1] if n <= len(steps) else ("status", 200)

    ep = endpoint(behaviour)
    topic = http_topic(ep.url, timeout="1 second")
    ids = send(conn, topic, 40, keys=4)
    assert wait_status(conn, topic, 40, timeout=90) == []
    reqs = ep.snapshot()
    attempts = collections.Counter(r.json()["i"] for r in reqs)
    for i in range(40):
        assert attempts[i] == len(plan.get(i, [])) + 1, (i, attempts[i])
    # Per key, requests arrive in message order: retries never let a later message overtake.
    per_key = collections.defaultdict(list)
    for r in reqs:
        per_key[r.json()["i"] % 4].append(r.json()["i"])
    for key, seq in per_key.items():
        assert seq == sorted(seq), (key, seq)
    # Retry-After: 1 was honoured (the backoff alone is at most 200 ms).
    at7 = [r.at for r in reqs if r.json()["i"] == 7]
    assert at7[1] - at7[0] >= 0.9, at7
    assert {r.key for r in reqs} == set(ids)


def test_permanent_failure_marks_failed_and_key_moves_on(conn, endpoint, http_topic,
                                                         fast_retries):
    """A 400 is permanent: after eventbox.relay_max_attempts (3) attempts the row is `failed` with
    the status and the start of the body in last_error; the later messages of its key are then
    delivered (the same rule as a Kafka permanent failure)."""
    body = b'{"error": "invoice total must be positive"}' + b"x" * 500

    def behaviour(n, rec):
        return ("status", 400, {}, body) if rec.json()["i"] == 2 else ("status", 201)

    ep = endpoint(behaviour)
    topic = http_topic(ep.url)
    ids = send(conn, topic, 10, keys=2)
    rows = wait_status(conn, topic, 10)
    assert len(rows) == 1
    mid, status, attempts, last_error = rows[0]
    assert (mid, status, attempts) == (ids[2], "failed", 3)
    assert last_error.startswith('HTTP 400: {"error": "invoice total must be positive"}xxx')
    assert len(last_error) < 300
    reqs = ep.snapshot()
    assert collections.Counter(r.key for r in reqs)[ids[2]] == 3
    # Key k0 (messages 0, 2, 4, 6, 8): 4..8 only after 2 was given up.
    k0 = [r.json()["i"] for r in reqs if r.json()["i"] % 2 == 0]
    assert k0 == [0, 2, 2, 2, 4, 6, 8], k0


def test_endpoint_down_then_up(conn, endpoint, http_topic, fast_retries):
    """Connection refused is transient: rows stay pending with the error recorded, attempts
    growing, and are delivered once the endpoint is up."""
    port = free_port()
    topic = http_topic("http://127.0.0.1:%d/hook" % port)
    ids = send(conn, topic, 6, keys=2)
    # Only each key's first message is tried: the others wait behind it, never attempted.
    heads = (ids[0], ids[1])
    wait_until(lambda: query_one(
        conn, "SELECT min(attempts) FROM eventbox.outbox WHERE message_id = ANY(%s::uuid[])",
        (list(heads),)) >= 3, 30, what="attempts against a closed port")
    rows = query(conn, "SELECT message_id::text, status, attempts, last_error "
                       "FROM eventbox.outbox WHERE topic = %s", (topic,))
    assert all(s == "pending" for _, s, _, _ in rows), rows
    assert all(re.search(r"connect", e, re.I) for m, _, _, e in rows if m in heads), rows
    assert all(a == 0 for m, _, a, _ in rows if m not in heads), rows
    ep = endpoint(port=port)
    assert wait_status(conn, topic, 6, timeout=60) == []
    assert sorted(r.key for r in ep.snapshot()) == sorted(ids)


def test_hanging_endpoint_does_not_delay_kafka(conn, endpoint, http_topic, new_topic):
    """Requests to an endpoint that never answers wait out their timeout while a Kafka topic sent
    to at the same time flows as usual."""
    release = threading.Event()

    def behaviour(n, rec):
        release.wait(30)
        return ("status", 204)

    ep = endpoint(behaviour)
    topic = http_topic(ep.url, timeout="20 seconds", max_in_flight=4)
    http_ids = send(conn, topic, 50, keys=50)
    wait_until(lambda: len(ep.snapshot()) >= 4, 10, what="requests to reach the hanging endpoint")
    kafka_topic = new_topic(partitions=4)
    start = time.monotonic()
    kafka_ids = send(conn, kafka_topic, 500, keys=20)
    wait_for_ids(kafka_topic, kafka_ids, timeout=15)
    kafka_s = time.monotonic() - start
    # Still hanging: nothing of the HTTP topic was answered meanwhile.
    assert len(ep.snapshot()) == 4
    assert query_one(conn, "SELECT count(*) FROM eventbox.outbox WHERE topic = %s",
                     (topic,)) == 50
    release.set()
    assert wait_status(conn, topic, 50, timeout=60) == []
    assert sorted({r.key for r in ep.snapshot()}) == sorted(http_ids)
    print("kafka: 500 messages in %.2f s while the HTTP endpoint hung" % kafka_s)


def test_credentials_never_in_errors_or_logs(conn, endpoint, http_topic, fast_retries):
    secret = "TOPSECRET-" + uuid.uuid4().hex
    log = LogWatcher()

    def behaviour(n, rec):
        return ("status", 500, {}, b"server error") if n == 1 else ("status", 204)

    ep = endpoint(behaviour)
    topic = http_topic(ep.url, headers=json.dumps({"X-Api-Key": secret}))
    send(conn, topic, 5)
    assert wait_status(conn, topic, 5) == []
    assert all(r.headers["x-api-key"] == secret for r in ep.snapshot())
    # A bad alter is refused without echoing the value.
    with pytest.raises(Exception) as e:
        query(conn, "SELECT eventbox.alter_http_destination(%s, headers => %s)",
              (topic, json.dumps({"X-Api-Key": secret + "\r\nX-Evil: 1"})))
    assert secret not in str(e.value)
    assert query_one(conn, "SELECT headers->>'X-Api-Key' FROM eventbox.http_destinations "
                           "WHERE topic = %s", (topic,)) == "********"
    time.sleep(0.5)
    assert "server error" in log.text() or "failed delivery" in log.text()
    assert secret not in log.text()


def test_metrics_per_destination(conn, endpoint, http_topic, fast_retries):
    def behaviour(n, rec):
        return ("status", 503) if n == 1 and rec.json()["i"] % 2 else ("status", 200)

    ep = endpoint(behaviour)
    topic = http_topic(ep.url)
    send(conn, topic, 10)
    assert wait_status(conn, topic, 10) == []
    rows = dict(((n, json.dumps(l, sort_keys=True)), v) for n, l, v in query(
        conn, "SELECT name, labels, value FROM eventbox.metrics "
              "WHERE labels->>'destination' = %s", (topic,)))
    d = json.dumps({"destination": topic})
    assert rows[("eventbox_http_requests_total", d)] == 15 == len(ep.snapshot())
    assert rows[("eventbox_http_retries_total", d)] == 5
    cls = lambda c: json.dumps({"class": c, "destination": topic}, sort_keys=True)  # noqa: E731
    assert rows[("eventbox_http_responses_total", cls("2xx"))] == 10
    assert rows[("eventbox_http_responses_total", cls("5xx"))] == 5
    assert rows[("eventbox_http_request_duration_seconds_count", d)] == 15
    text = query_one(conn, "SELECT eventbox.metrics()")
    assert 'eventbox_http_requests_total{destination="%s"} 15' % topic in text


def test_tls_verified_by_default(conn, endpoint, http_topic, fast_retries):
    """An https endpoint whose certificate nobody vouches for gets no request: the handshake fails
    verification, which is a transient failure recorded in last_error."""
    ep = endpoint(tls=True)
    topic = http_topic(ep.url)
    send(conn, topic, 1)
    wait_until(lambda: query_one(conn, "SELECT attempts FROM eventbox.outbox WHERE topic = %s",
                                 (topic,)) >= 2, 30, what="failed TLS attempts")
    status, error = query(conn, "SELECT status, last_error FROM eventbox.outbox WHERE topic = %s",
                          (topic,))[0]
    assert status == "pending"
    assert re.search(r"certificate", error, re.I), error
    assert ep.snapshot() == []


def test_keyless_messages_go_in_parallel(conn, endpoint, http_topic):
    """Rows without a key have no order to keep: up to max_in_flight requests are open at once."""
    release = threading.Event()
    ep = endpoint(lambda n, rec: (release.wait(10), ("status", 204))[1])
    topic = http_topic(ep.url, max_in_flight=5)
    query(conn, "SELECT eventbox.send(%s, jsonb_build_object('i', i)) FROM generate_series(1, 12) i",
          (topic,))
    wait_until(lambda: len(ep.snapshot()) >= 5, 10, what="5 parallel requests")
    time.sleep(0.3)
    assert len(ep.snapshot()) == 5  # not more than max_in_flight
    release.set()
    assert wait_status(conn, topic, 12) == []
    assert len(ep.snapshot()) == 12
