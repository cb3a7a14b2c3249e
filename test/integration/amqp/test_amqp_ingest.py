"""RabbitMQ -> inbox (source 'amqp'): queues consumed with acks after the inbox commit,
handlers run once, a poison message stored unparsable, the ingest worker SIGKILLed while
consuming, the broker restarted while consuming, a queue deleted and declared again, a stream
replayed from offset 0. Each reports lost / duplicated counts (pika publishes)."""
import json
import time
import uuid

import pika
import psycopg2

from eventbox_fixtures import (connect, connection_lost, query, query_one, report, sigkill,
                               wait_until)


def row(c, sql, args=None):
    rows = query(c, sql, args)
    return tuple(rows[0]) if rows else None


def fresh_queue(channel, stream=False):
    name = "q_%s" % uuid.uuid4().hex[:8]
    args = {"x-queue-type": "stream"} if stream else None
    channel.queue_declare(name, durable=True, arguments=args)
    return name


def publish(channel, queue, ids, body=None):
    for i in ids:
        channel.basic_publish("", queue, body if body is not None else json.dumps({"id": i}),
                              pika.BasicProperties(message_id=i, delivery_mode=2,
                                                   type="test.event"))


def subscribe(queues, **options):
    name = "s_%s" % uuid.uuid4().hex[:8]
    c = connect()
    try:
        query(c, "SELECT eventbox.create_subscription(%s, %s, source => 'amqp', "
                 "batch_size => %s)", (name, queues, options.get("batch_size", 100)))
    finally:
        c.close()
    return name


def drop(name):
    c = connect()
    try:
        query(c, "SELECT eventbox.drop_subscription(%s)", (name,))
    finally:
        c.close()


def stored(sub):
    try:
        return _stored(sub)
    except psycopg2.Error as e:
        if connection_lost(e):  # the server restarting after a SIGKILL
            return {}
        raise


def _stored(sub):
    c = connect()
    try:
        return dict(query(c, "SELECT message_id, count(*) FROM eventbox.inbox "
                             "WHERE subscription = %s GROUP BY 1", (sub,)))
    finally:
        c.close()


def wait_stored(sub, ids, timeout=120):
    wait_until(lambda: set(ids) <= set(stored(sub)), timeout, interval=0.3,
               what="the messages in the inbox of %s" % sub)


def counts(sub, ids):
    rows = stored(sub)
    lost = len([i for i in ids if i not in rows])
    duplicated = sum(n - 1 for n in rows.values()) + len(set(rows) - set(ids))
    return lost, duplicated


def ingest_pids():
    try:
        return _ingest_pids()
    except psycopg2.Error as e:
        if connection_lost(e):  # the server restarting after a SIGKILL
            return []
        raise


def _ingest_pids():
    c = connect()
    try:
        return [r[0] for r in query(c, "SELECT pid FROM pg_stat_activity "
                                       "WHERE backend_type = 'eventbox ingest'")]
    finally:
        c.close()


def queue_depth(rabbit, queue):
    out = rabbit.ctl("list_queues", "name", "messages_ready", "messages_unacknowledged")
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == queue:
            return int(parts[1]), int(parts[2])
    return None


def test_queue_to_inbox_with_handler(extension, channel, rabbit):
    queue = fresh_queue(channel)
    sub = subscribe([queue])
    c = connect()
    table = "amqp_effects_%s" % sub[2:]
    try:
        query(c, "CREATE TABLE public.%s (message_id text, n int)" % table)
        query(c, "CREATE FUNCTION public.%s_fn(m eventbox.inbox) RETURNS void LANGUAGE sql AS "
                 "$$ INSERT INTO public.%s VALUES (m.message_id, 1) $$" % (table, table))
        role = "amqp_handler_%s" % sub[2:]
        query(c, "CREATE ROLE %s NOLOGIN" % role)
        query(c, "GRANT INSERT ON public.%s TO %s" % (table, role))
        query(c, "SELECT eventbox.register_handler(%s, %s::regprocedure, run_as => %s)",
              (sub, "public.%s_fn(eventbox.inbox)" % table, role))
        ids = ["m%04d" % i for i in range(500)]
        publish(channel, queue, ids)
        publish(channel, queue, ids[:50])             # copies with the same message_id
        publish(channel, queue, ["poison"], body=b"\x00 not json")
        wait_stored(sub, ids + ["poison"])
        wait_until(lambda: query_one(c, "SELECT count(*) FROM public.%s" % table) >= 500,
                   120, what="the handler's effects")
        time.sleep(1)
        effects = dict(query(c, "SELECT message_id, count(*) FROM public.%s GROUP BY 1" % table))
        poison = row(c, "SELECT status, raw_payload IS NOT NULL, event_type FROM "
                              "eventbox.inbox WHERE subscription = %s AND message_id = 'poison'",
                           (sub,))
        one = row(c, "SELECT event_type, topic, \"partition\" FROM eventbox.inbox "
                           "WHERE subscription = %s AND message_id = 'm0001'", (sub,))
        # Everything acknowledged: nothing ready, nothing unacknowledged.
        wait_until(lambda: queue_depth(rabbit, queue) == (0, 0), 60, what="an empty queue")
        lost, duplicated = counts(sub, ids + ["poison"])
        effects_twice = sum(n - 1 for n in effects.values())
        report("amqp queue -> inbox + handler", sent=551, unique=501, lost=lost,
               duplicated_rows=duplicated, effects=len(effects), effects_twice=effects_twice)
        assert (lost, duplicated) == (0, 0)
        assert len(effects) == 500 and effects_twice == 0
        assert poison == ("unparsable", True, "test.event")
        assert one == ("test.event", queue, 0)
    finally:
        drop(sub)
        query(c, "DROP TABLE public.%s" % table)
        query(c, "DROP FUNCTION public.%s_fn(eventbox.inbox)" % table)
        query(c, "DROP ROLE IF EXISTS amqp_handler_%s" % sub[2:])
        c.close()
        channel.queue_delete(queue)


def test_ingest_worker_killed_while_consuming(extension, rabbit):
    """SIGKILLed three times while 3,000 messages are consumed: kills land before and after
    batches' commits; what was not acknowledged is redelivered and deduplicated."""
    channel = rabbit.channel()
    queue = fresh_queue(channel)
    channel.connection.close()
    sub = subscribe([queue], batch_size=50)
    ids = ["k%05d" % i for i in range(3000)]
    try:
        kills = 0
        for chunk in range(3):
            channel = rabbit.channel()  # a connection per chunk: no heartbeats missed meanwhile
            publish(channel, queue, ids[chunk * 1000:(chunk + 1) * 1000])
            wait_until(lambda: len(stored(sub)) > chunk * 1000 + 100, 120,
                       what="consumption under way")
            channel.connection.close()
            pids = ingest_pids()
            assert pids, "no ingest worker"
            for pid in pids:
                sigkill(pid)
                kills += 1
            wait_until(lambda: ingest_pids() and ingest_pids() != pids, 120,
                       what="a restarted ingest worker")
        wait_stored(sub, ids, timeout=180)
        wait_until(lambda: queue_depth(rabbit, queue) == (0, 0), 60, what="an empty queue")
        lost, duplicated = counts(sub, ids)
        c = connect()
        try:
            redelivered = query_one(
                c, "SELECT coalesce(sum(value), 0) FROM eventbox.metrics "
                   "WHERE name = 'eventbox_ingest_redelivered_total' "
                   "AND labels->>'subscription' = %s", (sub,))
        finally:
            c.close()
        report("amqp ingest worker SIGKILLed", sent=3000, kills=kills, lost=lost,
               duplicated_rows=duplicated, redelivered=int(redelivered))
        assert (lost, duplicated) == (0, 0)
    finally:
        drop(sub)
        channel = rabbit.channel()
        channel.queue_delete(queue)
        channel.connection.close()


def test_broker_restart_while_consuming(extension, rabbit):
    ch = rabbit.channel()
    queue = fresh_queue(ch)
    sub = subscribe([queue], batch_size=50)
    ids = ["r%05d" % i for i in range(2000)]
    try:
        publish(ch, queue, ids[:1000])
        wait_until(lambda: len(stored(sub)) > 100, 120, what="consumption under way")
        ch.connection.close()
        rabbit.restart()
        ch = rabbit.channel()
        publish(ch, queue, ids[1000:])
        wait_stored(sub, ids, timeout=180)
        lost, duplicated = counts(sub, ids)
        report("amqp broker restarted while consuming", sent=2000, lost=lost,
               duplicated_rows=duplicated)
        assert (lost, duplicated) == (0, 0)
    finally:
        drop(sub)
        try:
            ch.queue_delete(queue)
            ch.connection.close()
        except Exception:
            pass


def test_queue_deleted_and_declared_again(extension, channel):
    queue = fresh_queue(channel)
    sub = subscribe([queue])
    first = ["d%04d" % i for i in range(200)]
    second = ["e%04d" % i for i in range(200)]
    try:
        publish(channel, queue, first)
        wait_stored(sub, first)
        channel.queue_delete(queue)
        time.sleep(1)
        channel.queue_declare(queue, durable=True)
        publish(channel, queue, second)
        wait_stored(sub, second, timeout=120)  # consumed again after the backoff
        lost, duplicated = counts(sub, first + second)
        report("amqp queue deleted and declared again", sent=400, lost=lost,
               duplicated_rows=duplicated)
        assert (lost, duplicated) == (0, 0)
    finally:
        drop(sub)
        channel.queue_delete(queue)


def test_stream_replayed_from_zero(extension, channel):
    queue = fresh_queue(channel, stream=True)
    ids = ["s%04d" % i for i in range(300)]
    publish(channel, queue, ids)
    sub = subscribe([queue])
    c = connect()
    try:
        wait_stored(sub, ids)
        offsets = query(c, "SELECT topic, \"partition\", next_offset FROM eventbox.offsets "
                           "WHERE subscription = %s", (sub,))
        assert offsets == [(queue, 0, 300)]
        rows = query(c, "SELECT min(\"offset\"), max(\"offset\") FROM eventbox.inbox "
                        "WHERE subscription = %s", (sub,))
        assert rows == [(0, 299)]

        def duplicates():
            return query_one(c, "SELECT coalesce(sum(value), 0) FROM eventbox.metrics "
                                "WHERE name = 'eventbox_ingest_duplicates_total' "
                                "AND labels->>'subscription' = %s", (sub,))

        before = duplicates()
        query(c, "SELECT eventbox.replay(%s, %s, 0, 0)", (sub, queue))
        # Read again from 0: every delivery a duplicate, the offset back at 300.
        wait_until(lambda: duplicates() - before >= 300, 120, what="the stream read again")
        publish(channel, queue, ["s_after"])
        wait_stored(sub, ids + ["s_after"])
        lost, duplicated = counts(sub, ids + ["s_after"])
        report("amqp stream replayed from offset 0", sent=301, reread=int(duplicates() - before),
               lost=lost, duplicated_rows=duplicated)
        assert (lost, duplicated) == (0, 0)
        assert query(c, "SELECT next_offset FROM eventbox.offsets WHERE subscription = %s",
                     (sub,)) == [(301,)]
    finally:
        drop(sub)
        c.close()
        channel.queue_delete(queue)


def test_source_is_checked(extension):
    c = connect()
    try:
        for sql, code in [
                ("SELECT eventbox.create_subscription('s_bad', ARRAY['q'], source => 'sqs')",
                 "22023"),
                ("SELECT eventbox.create_subscription('s_bad', ARRAY['q'], source => 'amqp', "
                 "backfill => true)", "0A000")]:
            try:
                query(c, sql)
                raise AssertionError("accepted: " + sql)
            except Exception as e:  # psycopg2.Error
                assert getattr(e, "pgcode", None) == code, e
    finally:
        c.close()
