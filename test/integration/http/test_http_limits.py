"""Rate limits and the circuit breaker of HTTP destinations, against local endpoints (Python's
standard library): an endpoint that enforces a rate and answers 429 past it, endpoints that
announce their limit with RateLimit-* headers, and one that fails until the breaker opens. The
rules are docs/guide/http.md's ("Rate limits", "Circuit breaker")."""
import threading
import time

from eventbox_fixtures import query, query_one, report, wait_outbox_drained, wait_until


def send(conn, topic, n, start=0):
    return [r[0] for r in query(
        conn, "SELECT eventbox.send(%s, jsonb_build_object('i', i))::text "
              "FROM generate_series(%s, %s) i ORDER BY i", (topic, start, start + n - 1))]


class RateEnforcer:
    """The endpoint's own token bucket: `rate` per second, `burst`; 429 past it."""

    def __init__(self, rate, burst):
        self.rate, self.burst = rate, burst
        self.tokens, self.at = float(burst), time.monotonic()
        self.lock = threading.Lock()
        self.refused = 0

    def __call__(self, n, rec):
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens < 1:
                self.refused += 1
                return ("status", 429, {"Retry-After": "1"})
            self.tokens -= 1
        return ("status", 204)


WINDOW = 30.0  # seconds the rate is measured over


def test_rate_limit_holds_the_endpoints_rate(conn, endpoint, http_topic):
    """rate_limit 20/s (burst 5) to an endpoint that allows 20/s (burst 10): over 30 s the relay's
    request rate is within 5% of 20/s, and the endpoint never answers 429."""
    enforcer = RateEnforcer(20, 10)
    ep = endpoint(enforcer)
    topic = http_topic(ep.url, rate_limit=20, rate_burst=5)
    send(conn, topic, 900)
    wait_until(lambda: len(ep.snapshot()) > 0, timeout=30)
    first = ep.snapshot()[0].at
    time.sleep(max(0.0, first + WINDOW + 0.5 - time.monotonic()))
    reqs = ep.snapshot()
    in_window = [r for r in reqs if r.at - first < WINDOW]
    rate = (len(in_window) - 5) / WINDOW  # the burst goes at once, at the start
    report("http_rate_limit", limit=20, window_s=WINDOW, requests=len(in_window),
           rate="%.2f" % rate, refused_429=enforcer.refused)
    assert enforcer.refused == 0, "the relay went past the endpoint's limit"
    assert abs(rate - 20) <= 20 * 0.05, (len(in_window), rate)


def test_max_messages_per_second_with_bulk_requests(conn, endpoint, http_topic):
    """max_messages_per_second 200 with bulk requests of up to 50: over 5 s the endpoint gets
    one second's burst (200) and 5 s at 200/s, about 1,200 messages, not the 1,500 sent."""
    ep = endpoint()
    topic = http_topic(ep.url, batch_size=50, batch_wait="10ms", max_messages_per_second=200)
    send(conn, topic, 1500)
    wait_until(lambda: len(ep.snapshot()) > 0, timeout=30)
    first = ep.snapshot()[0].at
    time.sleep(max(0.0, first + 5.0 - time.monotonic()))
    messages = sum(len(r.json()) for r in ep.snapshot() if r.at - first < 5.0)
    assert 1100 <= messages <= 1250, messages


def test_limit_headers_pause_the_destination(conn, endpoint, http_topic):
    """An endpoint that says RateLimit-Remaining: 0 with RateLimit-Reset: 2 (and another time
    X-RateLimit-Remaining: 0 with X-RateLimit-Reset as epoch seconds) gets no request until the
    reset; the messages are delivered (2xx) all the same."""
    lock = threading.Lock()
    count = [0]

    def behaviour(n, rec):
        with lock:
            count[0] += 1
            k = count[0]
        if k == 3:
            return ("status", 200, {"RateLimit-Remaining": "0", "RateLimit-Reset": "2"})
        if k == 6:
            return ("status", 200, {"X-RateLimit-Remaining": "0",
                                    "X-RateLimit-Reset": str(int(time.time()) + 2)})
        return ("status", 200, {"RateLimit-Remaining": "5", "RateLimit-Reset": "1"})

    ep = endpoint(behaviour)
    topic = http_topic(ep.url, max_in_flight=1)
    send(conn, topic, 8)
    wait_outbox_drained(topic, timeout=60)
    at = [r.at for r in ep.snapshot()]
    assert len(at) == 8
    assert at[3] - at[2] >= 1.9, at
    assert at[6] - at[5] >= 0.9, at  # epoch seconds: the reset is 1 to 2 s away
    assert all(at[i + 1] - at[i] < 1.0 for i in (0, 1, 3, 4, 6)), at


def test_breaker_opens_probes_and_closes(conn, endpoint, http_topic):
    """breaker_failures 3, breaker_cooldown 2 s, against an endpoint that answers 503 until told
    otherwise: after 3 failures in a row no request for the cooldown, then one probe at a time;
    no attempt is spent while open; the first successful probe closes it and the rows flow."""
    up = threading.Event()
    ep = endpoint(lambda n, rec: ("status", 204) if up.is_set() else ("status", 503))
    topic = http_topic(ep.url, breaker_failures=3, breaker_cooldown="2 seconds",
                       max_in_flight=1)
    send(conn, topic, 20)
    wait_until(lambda: query_one(conn, "SELECT state FROM eventbox.http_breakers WHERE topic = %s",
                                 (topic,)) == "open", timeout=30)
    time.sleep(5.0)  # two cooldowns: two probes, both failing
    failed_requests = len(ep.snapshot())
    attempts = query_one(conn, "SELECT sum(attempts) FROM eventbox.outbox WHERE topic = %s",
                         (topic,))
    assert attempts == failed_requests, (attempts, failed_requests)
    assert 4 <= failed_requests <= 6, failed_requests
    at = [r.at for r in ep.snapshot()]
    for a, b in zip(at[2:], at[3:]):
        assert b - a >= 1.9, at  # open: nothing during a cooldown, then one probe
    up.set()
    wait_outbox_drained(topic, timeout=30)
    assert len(ep.snapshot()) == failed_requests + 20
    row = query(conn, "SELECT state, opened, half_opened, closed FROM eventbox.http_breakers "
                      "WHERE topic = %s", (topic,))[0]
    assert row[0] == "closed" and row[1] >= 2 and row[2] >= 2 and row[3] == 1, row
    metrics = query_one(conn, "SELECT eventbox.metrics()")
    assert 'eventbox_http_breaker_state{destination="%s"} 0' % topic in metrics
    assert 'eventbox_http_breaker_transitions_total{destination="%s",to="open"}' % topic in metrics
