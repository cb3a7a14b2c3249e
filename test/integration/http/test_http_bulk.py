"""Bulk requests and signed webhooks end to end, against local endpoints (Python's standard
library): per-record partial failures in every supported shape (json_array by position, ndjson by
message id as an array, ndjson as NDJSON lines typed or not, sObject Collections), a 207 with
garbage, and Standard Webhooks signatures checked with Python's hmac. The rules are
docs/guide/http.md's: the failed records are retried alone, the good ones never resent, each key
at most once per request, nothing is taken as delivered without a readable result."""
import base64
import collections
import hashlib
import hmac
import json
import threading

import pytest

from eventbox_fixtures import query, wait_outbox_drained


def send(conn, topic, n, keys=None, start=0):
    """n JSON messages {"i": k} (key 'k<i % keys>', or no key) in one transaction; their ids."""
    key = "'k' || (i %%%% %d)" % keys if keys else "NULL"
    return [r[0] for r in query(
        conn, "SELECT eventbox.send(%%s, jsonb_build_object('i', i), key => %s)::text "
              "FROM generate_series(%%s, %%s) i ORDER BY i" % key,
        (topic, start, start + n - 1))]


def rows_left(conn, topic, timeout=60):
    wait_outbox_drained(topic, timeout=timeout)
    return query(conn, "SELECT message_id::text, status, attempts, last_error FROM eventbox.outbox "
                       "WHERE topic = %s ORDER BY id", (topic,))


@pytest.fixture
def fast_retries(settings):
    settings.set("eventbox.relay_retry_backoff", "50ms")
    settings.set("eventbox.relay_retry_backoff_max", "200ms")
    settings.set("eventbox.relay_max_attempts", "3")
    return settings


class Records:
    """Per message id: how often the endpoint saw it, and what it answered each time."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seen = collections.defaultdict(list)  # message id -> answers ("ok", "retry", ...)

    def attempt(self, mid, answer_for):
        with self.lock:
            n = len(self.seen[mid]) + 1
            answer = answer_for(n)
            self.seen[mid].append(answer)
            return answer


def check_settled_alone(rec, reqs):
    """A record answered "ok" is never sent again; every record was answered "ok" once at most."""
    for mid, answers in rec.seen.items():
        if "ok" in answers:
            assert answers.index("ok") == len(answers) - 1, (mid, answers)
    for r in reqs:
        assert r.headers.get("eventbox-message-count") is not None


def test_json_array_partial_failures_by_position(conn, endpoint, http_topic, fast_retries):
    """207 with [{"status": ...}] in request order: 503 records are retried alone until they
    pass, a 422 record ends failed after relay_max_attempts with its error; the rest are sent
    once. Each key appears at most once per request, records in id order."""
    rec = Records()
    plan = {3: ["retry", "retry"], 10: ["retry"], 17: ["reject"] * 9}

    def behaviour(n, r):
        results = []
        for item in r.json():
            i = item["payload"]["i"]
            steps = plan.get(i, [])
            a = rec.attempt(item["id"], lambda k: steps[k - 1] if k <= len(steps) else "ok")
            results.append({"ok": {"status": 201}, "retry": {"status": 503, "error": "busy"},
                            "reject": {"status": 422, "error": "total must be positive"}}[a])
        return ("status", 207, {"Content-Type": "application/json"},
                json.dumps(results).encode())

    ep = endpoint(behaviour)
    topic = http_topic(ep.url, batch_size=20, batch_wait="50ms")
    ids = send(conn, topic, 40, keys=40)
    rows = rows_left(conn, topic)
    assert [(r[0], r[1], r[2]) for r in rows] == [(ids[17], "failed", 3)]
    assert "HTTP 207, record:" in rows[0][3] and "total must be positive" in rows[0][3]
    reqs = ep.snapshot()
    assert len(reqs) < 15, "bulk: far fewer requests than messages"
    for r in reqs:
        assert r.headers["content-type"] == "application/json"
        body = r.json()
        assert [x["id"] for x in body] == sorted((x["id"] for x in body), key=ids.index)
        assert len({x["key"] for x in body}) == len(body)
        assert r.headers["eventbox-message-count"] == str(len(body))
        assert r.headers["eventbox-topic"] == topic
    check_settled_alone(rec, reqs)
    for i, mid in enumerate(ids):
        steps = plan.get(i, [])
        expected = 3 if i == 17 else len(steps) + 1
        assert len(rec.seen[mid]) == expected, (i, rec.seen[mid])


def test_ndjson_results_by_message_id(conn, endpoint, http_topic, fast_retries):
    """ndjson requests answered 200 with results naming message ids in any order; a record the
    response does not mention is retried (never taken as delivered)."""
    rec = Records()
    skipped = set()

    def behaviour(n, r):
        assert r.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(line) for line in r.body.decode().splitlines()]
        results = []
        for item in lines:
            i = item["payload"]["i"]
            if i % 7 == 0 and item["id"] not in skipped:
                skipped.add(item["id"])
                rec.attempt(item["id"], lambda k: "unmentioned")
                continue
            if i % 5 == 0:
                a = rec.attempt(item["id"], lambda k: "ok" if k > 1 else "retry")
            else:
                a = rec.attempt(item["id"], lambda k: "ok")
            results.append({"id": item["id"], "success": a == "ok",
                            "status": 200 if a == "ok" else 429})
        results.reverse()
        return ("status", 200, {}, json.dumps(results).encode())

    ep = endpoint(behaviour)
    topic = http_topic(ep.url, batch_size=50, batch_wait="20ms", batch_format="ndjson")
    ids = send(conn, topic, 60)
    assert rows_left(conn, topic) == []
    check_settled_alone(rec, ep.snapshot())
    for i, mid in enumerate(ids):
        assert rec.seen[mid][-1] == "ok"
        assert len(rec.seen[mid]) == (2 if i % 7 == 0 or i % 5 == 0 else 1), (i, rec.seen[mid])


@pytest.mark.parametrize("shape", ["typed_by_position", "untyped_by_id"])
def test_ndjson_results_as_ndjson_lines(conn, endpoint, http_topic, fast_retries, shape):
    """ndjson requests answered with NDJSON per-record results, one JSON object a line: either
    Content-Type application/x-ndjson in request order, or no NDJSON type, naming message ids in
    reverse order. 503 records are retried alone until they pass, a 422 record ends failed after
    relay_max_attempts with its error, the good ones are sent once."""
    rec = Records()
    plan = {4: ["retry", "retry"], 11: ["retry"], 23: ["reject"] * 9}
    answers = {"ok": {"status": 201}, "retry": {"status": 503, "error": "busy"},
               "reject": {"status": 422, "error": "total must be positive"}}

    def behaviour(n, r):
        assert r.headers["content-type"] == "application/x-ndjson"
        lines = []
        for line in r.body.decode().splitlines():
            item = json.loads(line)
            steps = plan.get(item["payload"]["i"], [])
            a = rec.attempt(item["id"], lambda k: steps[k - 1] if k <= len(steps) else "ok")
            entry = dict(answers[a])
            if shape == "untyped_by_id":
                entry["id"] = item["id"]
            lines.append(json.dumps(entry))
        if shape == "typed_by_position":
            return ("status", 200, {"Content-Type": "application/x-ndjson"},
                    ("\n".join(lines) + "\n").encode())
        lines.reverse()
        return ("status", 200, {"Content-Type": "text/plain"}, ("\r\n".join(lines)).encode())

    ep = endpoint(behaviour)
    topic = http_topic(ep.url, batch_size=20, batch_wait="50ms", batch_format="ndjson")
    ids = send(conn, topic, 40, keys=40)
    rows = rows_left(conn, topic)
    assert [(r[0], r[1], r[2]) for r in rows] == [(ids[23], "failed", 3)]
    assert "HTTP 200, record:" in rows[0][3] and "total must be positive" in rows[0][3]
    reqs = ep.snapshot()
    assert len(reqs) < 15, "bulk: far fewer requests than messages"
    check_settled_alone(rec, reqs)
    for i, mid in enumerate(ids):
        steps = plan.get(i, [])
        expected = 3 if i == 23 else len(steps) + 1
        assert len(rec.seen[mid]) == expected, (i, rec.seen[mid])
        if i not in plan:
            assert rec.seen[mid] == ["ok"], (i, rec.seen[mid])


def test_sobject_collections(conn, endpoint, http_topic, fast_retries):
    """sObject Collections: {"allOrNone": false, "records": [payload...]} and the response
    [{"id", "success", "errors"}] by position; a record refused with errors ends failed with
    them in last_error; a non-object payload is failed at once without a request."""
    def behaviour(n, r):
        body = r.json()
        assert body["allOrNone"] is False
        out = []
        for k, record in enumerate(body["records"]):
            if record.get("Name") is None:
                out.append({"success": False, "errors": [{
                    "statusCode": "REQUIRED_FIELD_MISSING",
                    "message": "Required fields are missing: [Name]", "fields": ["Name"]}]})
            else:
                out.append({"id": "001%012d" % k, "success": True, "errors": []})
        return ("status", 200, {}, json.dumps(out).encode())

    ep = endpoint(behaviour)
    topic = http_topic(ep.url, batch_size=200, batch_wait="20ms",
                       batch_format="sobject_collections")
    good = [r[0] for r in query(
        conn, "SELECT eventbox.send(%s, jsonb_build_object('attributes', "
              "jsonb_build_object('type', 'Account'), 'Name', 'acct ' || i, 'Ext__c', i))::text "
              "FROM generate_series(1, 30) i", (topic,))]
    bad = [r[0] for r in query(conn, "SELECT eventbox.send(%s, '{\"Phone\": \"1\"}'::jsonb)::text",
                               (topic,))]
    arr = [r[0] for r in query(conn, "SELECT eventbox.send(%s, '[1, 2]'::jsonb)::text", (topic,))]
    rows = {r[0]: r for r in rows_left(conn, topic)}
    assert set(rows) == set(bad + arr)
    assert rows[bad[0]][1] == "failed" and "REQUIRED_FIELD_MISSING" in rows[bad[0]][3]
    assert rows[arr[0]][1] == "failed" and "JSON object" in rows[arr[0]][3]
    names = collections.Counter(rec["Name"] for r in ep.snapshot() for rec in r.json()["records"]
                                if "Name" in rec)
    assert len(names) == len(good) and set(names.values()) == {1}


def test_207_with_garbage_is_retried_not_delivered(conn, endpoint, http_topic, fast_retries):
    """A 207 whose body is not a result array, an array of the wrong length, and a 200 whose
    array is cut short: the records are retried (same message ids inside), none is lost and none
    is taken as delivered on such an answer."""
    answers = [b"<html>upstream error</html>", b"[{\"status\":200}]", b"[{\"status\":200},"]
    lock = threading.Lock()
    count = [0]

    def behaviour(n, r):
        with lock:
            count[0] += 1
            k = count[0]
        if k <= len(answers):
            return ("status", 207 if k < 3 else 200, {}, answers[k - 1])
        return ("status", 200, {}, json.dumps([{"status": 200}] * len(r.json())).encode())

    ep = endpoint(behaviour)
    topic = http_topic(ep.url, batch_size=10, batch_wait="500ms", max_in_flight=1)
    ids = send(conn, topic, 10)
    assert rows_left(conn, topic) == []
    reqs = ep.snapshot()
    assert len(reqs) == 4, [r.body[:80] for r in reqs]
    # The same records each time, with the same ids and the same request key.
    assert all([x["id"] for x in r.json()] == ids for r in reqs)
    assert len({r.key for r in reqs}) == 1


def verify(secret, headers, body):
    """An independent Standard Webhooks verifier: Python's hmac over id.timestamp.body."""
    key = base64.b64decode(secret[len("whsec_"):])
    signed = b"%s.%s.%s" % (headers["webhook-id"].encode(), headers["webhook-timestamp"].encode(),
                            body)
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(sig == "v1," + expected for sig in headers["webhook-signature"].split(" "))


SECRET_NEW = "whsec_" + base64.b64encode(b"n" * 32).decode()
SECRET_OLD = "whsec_" + base64.b64encode(b"o" * 24).decode()


@pytest.mark.parametrize("bulk", [False, True])
def test_signatures_verify_with_python_hmac(conn, endpoint, http_topic, bulk):
    ep = endpoint()
    options = dict(batch_size=25, batch_wait="20ms") if bulk else {}
    topic = http_topic(ep.url, signing_secret=SECRET_NEW, **options)
    ids = send(conn, topic, 20, keys=5)
    assert rows_left(conn, topic) == []
    reqs = ep.snapshot()
    for r in reqs:
        assert verify(SECRET_NEW, r.headers, r.body)
        assert not verify(SECRET_OLD, r.headers, r.body)
        assert r.headers["webhook-signature"].count("v1,") == 1
        if not bulk:
            assert r.headers["webhook-id"] == r.key
    if not bulk:
        assert sorted(r.headers["webhook-id"] for r in reqs) == sorted(ids)
    # A rotation: two secrets, two signatures, either verifies.
    query(conn, "SELECT eventbox.alter_http_destination(%s, signing_secret => %s)",
          (topic, SECRET_NEW + " " + SECRET_OLD))
    before = len(reqs)
    send(conn, topic, 5, keys=5, start=100)
    assert rows_left(conn, topic) == []
    later = ep.snapshot()[before:]
    assert later
    for r in later:
        assert r.headers["webhook-signature"].count("v1,") == 2
        assert verify(SECRET_NEW, r.headers, r.body) and verify(SECRET_OLD, r.headers, r.body)
        # A tampered body fails.
        assert not verify(SECRET_NEW, r.headers, r.body + b" ")
