"""A handler cannot escape eventbox.handler_timeout by catching its cancel.

Before: the timeout cancelled once; a handler with
`EXCEPTION WHEN query_canceled` swallowed it, ran on (12 s past a 2 s timeout
was seen) and its message was marked `processed`. Now a handler that returns
after its timeout fired has failed its attempt (rolled back, 57014); one that
keeps catching is cancelled again after 0.5 s and its backend terminated 2 s
after the timeout (FATAL, which nothing catches): a worker restarts and its
committed claim counts the attempt; a session calling process() loses its
connection, so it cannot run forever either.
"""

import time
import uuid

import psycopg2
import pytest

from eventbox_fixtures import query, query_one
from eventbox_handler_lib import Msg, ScratchDatabase, produce, retry_conn, wait_settled

DB = "eventbox_timeouts"

# The error of an attempt whose handler caught every cancel (timeout in ms).
TERMINATED = ("57014: handler ran past eventbox.handler_timeout (%d ms) and ignored the cancel: "
              "its backend was terminated")

CATCH_AND_RETURN = """
CREATE FUNCTION t.catch_and_return(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.effects VALUES (msg.message_id);
    BEGIN
        PERFORM pg_sleep(5);
    EXCEPTION WHEN query_canceled THEN
        RETURN;   -- swallows the cancel and returns as if all went well
    END;
END $$;
"""

CATCH_FOREVER = """
CREATE FUNCTION t.catch_forever(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t.effects VALUES (msg.message_id);
    LOOP
        BEGIN
            PERFORM pg_sleep(0.05);
        EXCEPTION WHEN query_canceled THEN
            NULL;  -- and again, and again
        END;
    END LOOP;
END $$;
"""


@pytest.fixture
def timeout_db(extension, settings):
    settings.set("eventbox.handler_timeout", "500ms")
    db = ScratchDatabase(DB, "eb_timeout_role", """
        CREATE SCHEMA t;
        GRANT USAGE ON SCHEMA t TO eb_timeout_role;
        CREATE TABLE t.effects (message_id text);
        GRANT INSERT ON t.effects TO eb_timeout_role;
    """ + CATCH_AND_RETURN + CATCH_FOREVER)
    yield db
    db.drop()


def subscription_with(c, sub, handler):
    query(c, "SELECT eventbox.create_subscription(%s, ARRAY['t'], max_attempts => 5)", (sub,))
    query(c, "SELECT eventbox.register_handler(%s, %s::regprocedure, run_as => 'eb_timeout_role')",
          (sub, "t.%s(eventbox.inbox)" % handler))
    query(c, """INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset",
                                            payload) VALUES (%s, 'm1', 't', 0, 0, '{}')""", (sub,))


def test_handler_returning_after_its_timeout_failed_its_attempt(timeout_db):
    c = timeout_db.connect()
    try:
        subscription_with(c, "catch_return", "catch_and_return")
        t0 = time.monotonic()
        query(c, "SELECT eventbox.process('catch_return')")
        took = time.monotonic() - t0
        status, attempts, last_error = query(
            c, "SELECT status, attempts, last_error FROM eventbox.inbox "
               "WHERE subscription = 'catch_return'")[0]
        assert status == "retry", (status, last_error)
        assert attempts == 1
        assert last_error.startswith("57014") and "handler_timeout" in last_error, last_error
        # Its effects were rolled back with the attempt, and it did not sleep its 5 s.
        assert query_one(c, "SELECT count(*) FROM t.effects") == 0
        assert took < 4, took
    finally:
        c.close()


def test_handler_catching_every_cancel_is_terminated_in_process(timeout_db):
    c = timeout_db.connect()
    subscription_with(c, "catch_forever", "catch_forever")
    t0 = time.monotonic()
    with pytest.raises(psycopg2.OperationalError):
        query(c, "SELECT eventbox.process('catch_forever')")
    took = time.monotonic() - t0
    # 0.5 s timeout + 2 s escalation; never the handler's endless loop.
    assert took < 8, took
    c2 = timeout_db.connect()
    try:
        status = query_one(c2, "SELECT status FROM eventbox.inbox WHERE subscription = 'catch_forever'")
        assert status == "received", status   # process()'s transaction was rolled back
        assert query_one(c2, "SELECT count(*) FROM t.effects") == 0
    finally:
        c2.close()


def test_worker_running_a_handler_that_catches_every_cancel_goes_on(case, settings):
    """In the workers: the catching handler's message ends dead after its attempts
    (each one terminated 2 s after the timeout and counted through the claim), and
    the other messages of the subscription are handled meanwhile. Its last_error
    names the timeout (57014 and its value): before, it said that the attempt never
    finished because its backend "crashed or was killed"."""
    settings.set("eventbox.handler_timeout", "500ms")
    hc = case(2)
    hc.setup("""
        CREATE TABLE {s}.ledger (message_id text);
        CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO {s}.ledger VALUES (msg.message_id);
            IF msg.payload ? 'stuck' THEN
                LOOP
                    BEGIN
                        PERFORM pg_sleep(0.05);
                    EXCEPTION WHEN query_canceled THEN
                        NULL;
                    END;
                END LOOP;
            END IF;
        END $$;
    """, max_attempts=2, backoff="50 ms", backoff_max="100 ms")
    stuck = Msg(str(uuid.uuid4()), 0, "s", {"stuck": True}, None)
    others = [Msg(str(uuid.uuid4()), 1, "o%d" % i, {"n": i}, None) for i in range(50)]
    produce(hc.topic, [stuck] + others)
    status = wait_settled(hc.sub, 1 + len(others), timeout=90)
    row = retry_conn(lambda c: query(
        c, "SELECT status, attempts, last_error FROM eventbox.inbox "
           "WHERE subscription = %s AND message_id = %s", (hc.sub, stuck.mid))[0])
    assert row[0] == "dead" and row[1] == 2, row
    # Its error names the setting that cut it off (before: "attempt 2 never finished: the
    # backend running it crashed or was killed", which reads as a crash).
    assert row[2] == TERMINATED % 500, row
    assert status.get("processed") == len(others), status
    done = retry_conn(lambda c: query_one(
        c, hc.q("SELECT count(DISTINCT message_id) FROM {s}.ledger")))
    assert done == len(others)   # the stuck one's effects were rolled back with each attempt


def test_terminated_handler_is_not_retried_when_57014_is_non_retryable(case, settings):
    """The attempt a termination cut short fails like the cancel's 57014: with
    non_retryable '{57}', the message is dead at its first attempt (before: it ran
    again, up to max_attempts, each time read as a crash)."""
    settings.set("eventbox.handler_timeout", "300ms")
    hc = case(1)
    hc.setup("""
        CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
        BEGIN
            LOOP
                BEGIN
                    PERFORM pg_sleep(0.05);
                EXCEPTION WHEN query_canceled THEN
                    NULL;
                END;
            END LOOP;
        END $$;
    """, max_attempts=5, non_retryable="{57}")
    stuck = Msg(str(uuid.uuid4()), 0, "s", {"stuck": True}, None)
    produce(hc.topic, [stuck])
    wait_settled(hc.sub, 1, timeout=60)
    row = retry_conn(lambda c: query(
        c, "SELECT status, attempts, last_error FROM eventbox.inbox "
           "WHERE subscription = %s AND message_id = %s", (hc.sub, stuck.mid))[0])
    assert row == ("dead", 1, TERMINATED % 300 + " (not retried: non_retryable)"), row
