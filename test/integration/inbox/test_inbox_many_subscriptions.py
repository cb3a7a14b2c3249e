"""Many subscriptions share the ingest worker's one consumer (issue 13 #5): 150 subscriptions,
created by an admin role that is no superuser, all ingest every record of their topics while the
worker's fds stay far below the open-files limit (1024); and a subscription that cannot be
consumed (a topic the broker does not know, a batch that cannot be stored) shows its error in
eventbox.subscription_errors, is retried alone, and stops none of the others."""
import time
import uuid

import psycopg2

from inbox_kafka import end_offsets, json_value, produce
from inbox_support import (LogWatch, admin_role, caught_up, connect_as, create_subscriptions,
                           footprint, poll, report, unique_name)

SUBSCRIPTIONS = 150
TOPICS = 3
PARTITIONS = 4
RECORDS_PER_TOPIC = 200
FD_LIMIT = 1024


def records(tag, n):
    return [{"key": b"k%d" % (i % 13), "value": json_value({"tag": tag, "i": i}),
             "headers": [("message_id", ("%s-%d" % (tag, i)).encode())]} for i in range(n)]


def drop_all(db, names):
    db.rows_retry("SELECT eventbox.drop_subscription(name) FROM eventbox.subscriptions "
                  "WHERE name = ANY (%s)", (list(names),))


def test_150_subscriptions_of_a_non_superuser_admin_all_ingest(ib_db, ib_topic, ib_producer):
    run = uuid.uuid4().hex[:6]
    role = admin_role(ib_db, "eb_many_admin")
    topics = [ib_topic("many%d" % t, PARTITIONS) for t in range(TOPICS)]
    subs = [("ib_many_%s_%03d" % (run, i), [topics[i % TOPICS]]) for i in range(SUBSCRIPTIONS)]
    # A few read two topics, so that one record goes to subscriptions of different topic sets.
    subs[0] = (subs[0][0], topics[:2])
    subs[1] = (subs[1][0], topics)
    pid = ib_db.wait_ingest_worker()
    before = footprint(pid)
    admin = connect_as(role)
    log = LogWatch()
    try:
        t0 = time.monotonic()
        create_subscriptions(admin, subs)
        assert ib_db.value("SELECT count(*) FROM eventbox.subscriptions WHERE name LIKE %s",
                           ("ib_many_%s_%%" % run,)) == SUBSCRIPTIONS
        assert ib_db.value("SELECT count(DISTINCT owner) FROM eventbox.subscriptions "
                           "WHERE name LIKE %s", ("ib_many_%s_%%" % run,)) == 1
        for t, topic in enumerate(topics):
            produce(ib_producer, topic, records("%s-t%d" % (run, t), RECORDS_PER_TOPIC))
        ends = {topic: end_offsets(topic) for topic in topics}
        state = {}

        def all_caught_up():
            state["behind"] = caught_up(ib_db, ends, subs)
            return not state["behind"]

        poll(all_caught_up, 180, lambda: "all %d subscriptions caught up (%d behind, e.g. %s)"
             % (SUBSCRIPTIONS, len(state["behind"]), state["behind"][:3]), interval=0.5)
        took = time.monotonic() - t0
        during = footprint(pid)

        # Every subscription has every record of its topics, once.
        counts = dict(ib_db.rows(
            "SELECT subscription, count(*) FROM eventbox.inbox WHERE subscription LIKE %s "
            "GROUP BY subscription", ("ib_many_%s_%%" % run,)))
        want = {name: RECORDS_PER_TOPIC * len(ts) for name, ts in subs}
        wrong = {n: (counts.get(n, 0), want[n]) for n in want if counts.get(n, 0) != want[n]}
        assert not wrong, "subscriptions with missing or extra rows: %r" % dict(
            list(wrong.items())[:5])
        assert ib_db.value("SELECT count(*) FROM eventbox.subscription_errors "
                           "WHERE subscription LIKE %s", ("ib_many_%s_%%" % run,)) == 0
        # The admin sees the same through its grants.
        with admin.cursor() as cur:
            cur.execute("SELECT count(DISTINCT subscription), count(*) FILTER (WHERE lag <> 0) "
                        "FROM eventbox.lag WHERE subscription LIKE %s", ("ib_many_%s_%%" % run,))
            assert cur.fetchone() == (SUBSCRIPTIONS, 0)
        assert ib_db.counters()["pid"] == pid, "the ingest worker restarted"
        report("many_subscriptions", subscriptions=SUBSCRIPTIONS, topics=TOPICS,
               caught_up_s=round(took, 1), fds_before=before["fds"], fds=during["fds"],
               threads_before=before["threads"], threads=during["threads"],
               rss_kb=during["rss_kb"], anon_kb=during["anon_kb"])
        # One consumer whatever the number of subscriptions: a few fds per broker, not per
        # subscription (each one cost a pipe, sockets and threads: 1024 at ~120).
        assert during["fds"] < 100, during
        assert during["fds"] - before["fds"] < 20, (before, during)
        assert during["threads"] - before["threads"] < 10, (before, during)
        assert log.lines(r"eventbox ingest.*(ERROR|Too many open files)") == []
    finally:
        admin.close()
        drop_all(ib_db, [n for n, _ in subs])


LIST_OFFSETS = 2                   # Kafka API key
TOPIC_AUTHORIZATION_FAILED = 29    # Kafka error code


def test_a_broken_subscription_stops_no_other_and_shows_its_error(
        ib_db, ib_topic, ib_broker, ib_producer, ib_subscriptions):
    """Two ways to break one subscription: every batch of `refused` fails to store (a trigger
    raises: any ERROR); the broker refuses to tell where `late` (start_from 'latest') starts. (The
    dev broker creates any topic it is asked about, so an unknown topic cannot be shown here; it
    takes the same path as the refused start: the consumer retries it alone.)"""
    topic = ib_topic("broken_ok", 2)
    late_topic = ib_topic("broken_late", 2)
    ok = ib_subscriptions(unique_name("broken_ok"), [topic])
    refused = ib_subscriptions(unique_name("broken_refused"), [topic])
    pid = ib_db.wait_ingest_worker()
    log = LogWatch()
    produce(ib_producer, late_topic, records("before", 20))  # older than `late`: skipped
    # Storing the batches of `refused` fails (any ERROR will do): a trigger refuses its rows.
    ib_db.rows("""
        CREATE FUNCTION public.eb_refuse_rows() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'test refuses rows of %%', NEW.subscription;
        END $$;
        CREATE TRIGGER eb_refuse_rows BEFORE INSERT ON eventbox.inbox FOR EACH ROW
            WHEN (NEW.subscription = %s) EXECUTE FUNCTION public.eb_refuse_rows();
    """, (refused,))
    late = None
    try:
        produce(ib_producer, topic, records("ok", 300))
        ends = end_offsets(topic)
        # Every offset lookup is refused from now on (end_offsets() would be too: not until
        # clear_errors).
        ib_broker.inject_errors(LIST_OFFSETS, [TOPIC_AUTHORIZATION_FAILED] * 2000)
        time.sleep(0.05)
        late = ib_subscriptions(unique_name("broken_late"), [late_topic], start_from="latest")
        time.sleep(0.05)
        produce(ib_producer, late_topic, records("after", 30))
        ib_db.wait_caught_up(ok, ends, timeout=60)
        assert ib_db.inbox_count(ok) == 300

        def errors():
            return {r[0]: r[1:] for r in ib_db.rows(
                "SELECT subscription, error, attempts, next_retry_at IS NOT NULL, ingest_worker "
                "FROM eventbox.subscription_errors WHERE subscription IN (%s, %s, %s)",
                (ok, refused, late))}

        shown = poll(lambda: (lambda e: e if {late, refused} <= set(e) else None)(errors()),
                     30, "both broken subscriptions in eventbox.subscription_errors")
        assert ok not in shown
        assert "start_from 'latest'" in shown[late][0], shown
        assert "authorization failed" in shown[late][0].lower(), shown
        assert "test refuses rows of %s" % refused in shown[refused][0], shown
        assert shown[refused][1] >= 1 and shown[refused][2], shown  # attempts, next retry
        assert shown[refused][3] == 1, shown                          # the ingest worker
        assert ib_db.inbox_count(refused) == 0
        assert ib_db.stored_offsets(refused) == {}
        assert ib_db.inbox_count(late) == 0
        # The others go on meanwhile.
        produce(ib_producer, topic, records("ok2", 100))
        poll(lambda: ib_db.inbox_count(ok) == 400, 60, "400 rows of the healthy subscription")
        # Retried with a growing backoff (1, 2, 4, 8 s), not on every loop.
        time.sleep(6)
        attempts = errors()[refused][1]
        assert 2 <= attempts <= 5, attempts
    finally:
        ib_broker.clear_errors(LIST_OFFSETS)
        ib_db.rows("DROP TRIGGER IF EXISTS eb_refuse_rows ON eventbox.inbox; "
                   "DROP FUNCTION IF EXISTS public.eb_refuse_rows()")

    # Repaired: both catch up on their own, without a restart, and leave the view.
    ib_db.wait_caught_up(refused, end_offsets(topic), timeout=90)
    ib_db.wait_caught_up(late, end_offsets(late_topic), timeout=90)
    assert ib_db.inbox_count(refused) == 400
    assert ib_db.value("SELECT count(DISTINCT message_id) FROM eventbox.inbox "
                       "WHERE subscription = %s", (refused,)) == 400
    assert sorted(r[0] for r in ib_db.rows(
        "SELECT message_id FROM eventbox.inbox WHERE subscription = %s", (late,))) == sorted(
        "after-%d" % i for i in range(30))
    poll(lambda: not errors(), 30, "eventbox.subscription_errors emptied")
    assert ib_db.counters()["pid"] == pid, "the ingest worker restarted"
    # Bounded logs: a handful of lines about the broken ones, not one per retry and loop.
    lines = log.lines(r"eventbox ingest.*(%s|%s)" % (late, refused))
    report("broken_subscription", log_lines=len(lines), attempts_after_6s=attempts)
    assert len(lines) <= 12, "\n".join(lines)
    assert log.lines(r"eventbox ingest.*ERROR") == []


def test_subscription_errors_view_is_not_public(ib_db):
    role = "eb_errors_nobody"
    if not ib_db.value("SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)):
        ib_db.rows("CREATE ROLE %s LOGIN" % role)
    c = connect_as(role)
    try:
        with c.cursor() as cur:
            try:
                cur.execute("SELECT * FROM eventbox.subscription_errors")
                raise AssertionError("PUBLIC can read eventbox.subscription_errors")
            except psycopg2.errors.InsufficientPrivilege:
                pass
    finally:
        c.close()
