"""Helpers of the relay's integration tests: a relay known to be publishing, one-row commits
at a steady rate, and the statistics views read once the relay's counts reached them."""
import time

from eventbox_fixtures import query, query_one, wait_for_ids


def warm_relay(conn, topic):
    """Sends one message to `topic` and waits for it in Kafka: the relay runs and its producer is
    connected (after a setting that recreates it, too)."""
    wait_for_ids(topic, [query_one(conn, "SELECT eventbox.send(%s, '{}'::jsonb)", (topic,))])


def relay_stat(c, sql):
    """The one value `sql` reads from the statistics views once the relay's counts reached them:
    it reports them at most once a second, at its next pass (an idle one at least every poll
    interval)."""
    time.sleep(2.5)
    query(c, "SELECT pg_stat_clear_snapshot()")
    return query_one(c, sql)


def send_paced(c, topic, n, rate, key_of=None):
    """Sends n messages through the autocommit connection c, one eventbox.send() per
    transaction, `rate` transactions a second (each due at its time from the start); message i
    has the payload {"seq": i} and the key key_of(i) (none without key_of). Returns their ids,
    in order."""
    ids = []
    t0 = time.monotonic()
    for i in range(n):
        pause = t0 + i / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        ids.append(str(query_one(
            c, "SELECT eventbox.send(%s, jsonb_build_object('seq', %s::int), key => %s)",
            (topic, i, key_of(i) if key_of else None))))
    return ids
