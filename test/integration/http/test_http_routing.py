"""Where the relay sends a message: to its topic's HTTP destination as of the message's commit,
to Kafka otherwise, and HTTP delivery without Kafka at all.

Before: with `eventbox.brokers` empty the relay did nothing, so rows for HTTP destinations
waited too (a team that only sends webhooks needed a Kafka broker); and the relay took the
destinations' generation before its snapshot while a destination's creation was between the
two (the generation had moved, the snapshot did not show the row yet), so that it routed later
messages of the new destination to Kafka, published and deleted, and never reloaded."""
import threading
import uuid

import pytest

from eventbox_fixtures import (cancel_unsent, connect, query, query_one, read_topic,
                               wait_outbox_drained, wait_until)

RELAY_STATE = "SELECT state FROM eventbox.workers WHERE role = 'relay'"


def send(conn, topic, n, tag):
    """Sends n JSON messages {"tag": tag, "i": i} with keys 'k0'..'k3'; returns their ids."""
    return [r[0] for r in query(
        conn, "SELECT eventbox.send(%s, jsonb_build_object('tag', %s::text, 'i', i), "
              "key => 'k' || (i %% 4))::text FROM generate_series(1, %s) i ORDER BY i",
        (topic, tag, n))]


def pending(conn, topic):
    """(pending rows, their highest attempts) of `topic`."""
    return tuple(query(conn, "SELECT count(*), coalesce(max(attempts), 0) FROM eventbox.outbox "
                             "WHERE topic = %s AND status = 'pending'", (topic,))[0])


def delivered_keys(ep):
    return {r.key for r in ep.snapshot()}


def test_http_delivered_without_brokers(conn, endpoint, http_topic, new_topic, settings,
                                        log_watch):
    """Item 7 of issue 27: with eventbox.brokers = '' the relay delivers to HTTP destinations;
    rows of topics without one stay pending (no attempt counted), with a log line and a state
    saying Kafka is not configured, and go to Kafka once brokers are set. Before, the relay
    idled: the HTTP rows were never delivered."""
    kafka_topic = new_topic(2)
    settings.set("eventbox.brokers", "")
    ep = endpoint()
    topic = http_topic(ep.url)
    hooks = send(conn, topic, 20, "hook")
    records = send(conn, kafka_topic, 10, "record")
    wait_outbox_drained(topic, timeout=60)
    assert sorted(delivered_keys(ep)) == sorted(hooks)
    assert len(ep.snapshot()) == 20, "each message once"

    wait_until(lambda: query(conn, RELAY_STATE) == [("HTTP only: no Kafka brokers",)], 30,
               what="the relay's state to say it has no Kafka brokers")
    # (the topic named is the first such row read: another test's may come first)
    log_watch.wait_for(r'eventbox relay: messages for topic "[^"]+" wait in the outbox: Kafka is '
                       r'not configured', 30)
    # Rows for Kafka wait untouched while later HTTP rows go out.
    more = send(conn, topic, 5, "more")
    wait_outbox_drained(topic, timeout=60)
    assert set(more) <= delivered_keys(ep)
    assert pending(conn, kafka_topic) == (10, 0)

    settings.reset("eventbox.brokers")
    wait_outbox_drained(kafka_topic, timeout=60)
    got = read_topic(kafka_topic)
    assert sorted(r.message_id for r in got) == sorted(records), "each record once"
    assert all(r.key.startswith(b"k") for r in got)


def hold_commits(settings):
    """From now on a transaction that commits with synchronous_commit = on waits (between the
    point where the destinations' generation moves and the point where its rows become visible)
    for a standby that never comes; the relay commits asynchronously and goes on."""
    settings.set("synchronous_standby_names", "eventbox_absent_standby")


def start_held(sql, args):
    """Runs `sql` in autocommit on a connection of its own, in a thread: its commit is held (see
    hold_commits). Returns (thread, errors)."""
    c = connect()
    pid = query_one(c, "SELECT pg_backend_pid()")
    errors = []

    def run():
        try:
            query(c, sql, args)
        except Exception as e:  # reported by the test
            errors.append(e)
        finally:
            c.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    probe = connect()
    try:
        wait_until(lambda: query_one(probe, "SELECT wait_event FROM pg_stat_activity "
                                            "WHERE pid = %s", (pid,)) == "SyncRep",
                   30, what="the destination change to wait in its commit")
    finally:
        probe.close()
    return t, errors


@pytest.mark.parametrize("change", ["create", "drop"])
def test_route_follows_a_change_committing_while_the_relay_loads(
        change, conn, endpoint, http_topic, broker, settings, log_watch):
    """Item 9 of issue 27, made deterministic: a destination change is held in its commit (its
    generation moved, its row not visible yet) while the relay reloads its destinations for
    another change; then it commits, and a message is sent to its topic. The message must go
    where the change says: created, to HTTP; dropped, to Kafka. Before, the relay kept the
    configuration of the snapshot that missed the change (the generation it had read already
    counted it) and never reloaded: the message went to Kafka (or was posted to the dropped
    destination)."""
    ep = endpoint()
    other = endpoint()
    trigger = http_topic(other.url)          # a change of it makes the relay reload
    topic = "h_%s" % uuid.uuid4().hex[:10]
    broker.create_topic(topic, 1)
    if change == "drop":
        query(conn, "SELECT eventbox.create_http_destination(%s, %s)", (topic, ep.url))
        sql = "SELECT eventbox.drop_http_destination(%s)"
        args = (topic,)
    else:
        sql = "SELECT eventbox.create_http_destination(%s, %s)"
        args = (topic, ep.url)
    try:
        hold_commits(settings)
        held, errors = start_held(sql, args)
        log_watch.mark()
        query(conn, "SET synchronous_commit = local")
        query(conn, "SELECT eventbox.alter_http_destination(%s, timeout => '5 s')", (trigger,))
        log_watch.wait_for(r"eventbox relay: delivering \d+ topic\(s\) to HTTP destinations", 30)
        settings.reset("synchronous_standby_names")
        held.join(30)
        assert not held.is_alive() and errors == []
        query(conn, "RESET synchronous_commit")

        mid = query_one(conn, "SELECT eventbox.send(%s, '{\"after\": true}'::jsonb)::text",
                        (topic,))
        wait_outbox_drained(topic, timeout=60)
        kafka = [r.message_id for r in read_topic(topic, missing_ok=True)]
        if change == "create":
            assert (mid in delivered_keys(ep), kafka) == (True, []), "not posted"
        else:
            assert (mid in delivered_keys(ep), kafka) == (False, [mid]), "not published"
    finally:
        cancel_unsent(conn, topic)
        if query_one(conn, "SELECT count(*) FROM eventbox.http_destinations WHERE topic = %s",
                     (topic,)):
            query(conn, "SELECT eventbox.drop_http_destination(%s)", (topic,))


def test_new_destinations_back_to_back(conn, endpoint, broker):
    """Item 9 of issue 27 as reported: two destinations created one after the other (each in
    autocommit), then a message to the second, 20 times with fresh topics: every message is
    posted, none published to Kafka. Before, some of them went to a Kafka topic of that name."""
    ep = endpoint()
    made, sent = [], {}
    try:
        for n in range(20):
            first, second = ("h_%s" % uuid.uuid4().hex[:10] for _ in range(2))
            broker.create_topic(second, 1)  # what the relay would publish to
            for t in (first, second):
                query(conn, "SELECT eventbox.create_http_destination(%s, %s)", (t, ep.url))
                made.append(t)
            sent[second] = query_one(conn, "SELECT eventbox.send(%s, jsonb_build_object('n', "
                                           "%s))::text", (second, n))
        for t in sent:
            wait_outbox_drained(t, timeout=60)
        published = [t for t in sent if read_topic(t, missing_ok=True)]
        posted = delivered_keys(ep)
        assert (len(published), sorted(m for m in sent.values() if m not in posted)) == (0, []), \
            "%d of 20 published to Kafka" % len(published)
    finally:
        for t in made:
            cancel_unsent(conn, t)
            query(conn, "SELECT eventbox.drop_http_destination(%s)", (t,))
