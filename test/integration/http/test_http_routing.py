"""Where the relay sends a message: to its topic's HTTP destination as of the message's commit,
to Kafka otherwise.

Before: the relay took the destinations' generation before its snapshot while a destination's
creation was between the two (the generation had moved, the snapshot did not show the row
yet), so that it routed later messages of the new destination to Kafka, published and deleted,
and never reloaded."""
import threading
import uuid

import pytest

from eventbox_fixtures import (connect, query, query_one, read_topic, wait_outbox_drained,
                               wait_until)

def delivered_keys(ep):
    return {r.key for r in ep.snapshot()}


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
        query(conn, "DELETE FROM eventbox.outbox WHERE topic = %s", (topic,))
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
            query(conn, "DELETE FROM eventbox.outbox WHERE topic = %s", (t,))
            query(conn, "SELECT eventbox.drop_http_destination(%s)", (t,))
