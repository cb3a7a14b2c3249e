"""pg_dump -Fc of a database using pg_eventbox, pg_restore into a fresh database of another
cluster whose workers serve it: configuration, roles (by name), offsets and waiting messages come
back, and the workers deliver and handle them once. A restore without a role a handler runs as
fails loudly and runs nothing as anyone else."""

import collections
import os
import uuid

from clusters import (HANDLER_DDL, Elapsed, duplicates, query, query_one, report,
                             wait_settled, wait_workers)

SNAPSHOTS = {
    "subscriptions": "SELECT name, topics, owner::text, start_from, ordering, max_attempts, "
                     "backoff, backoff_max, unhandled, batch_size, enabled, created_at "
                     "FROM eventbox.subscriptions ORDER BY name",
    "handlers": "SELECT subscription, event_type, handler, run_as::text, registered_by::text, "
                "created_at FROM eventbox.handlers ORDER BY handler",
    "offsets": "SELECT subscription, topic, \"partition\", next_offset FROM eventbox.offsets "
               "ORDER BY 1, 2, 3",
    "outbox": "SELECT id, message_id::text, topic, key, payload, headers, status "
              "FROM eventbox.outbox ORDER BY id",
    "inbox": "SELECT subscription, message_id, topic, \"partition\", \"offset\", payload, status, "
             "attempts, received_at FROM eventbox.inbox ORDER BY \"offset\"",
}


def snapshot(c):
    return {k: query(c, q) for k, q in SNAPSHOTS.items()}


def make_source(cluster, kafka, in_topic, pre, out):
    """Database `app` of `cluster` (not served by its workers, so that everything waits):
    roles, a subscription owned by sub_owner, a handler registered by registrar to run as
    handler_role, 30 pending outbox rows, 10 of the 20 records of `in_topic` in the inbox with
    their offset."""
    cluster.sql("CREATE DATABASE app")
    c = cluster.connect("app")
    query(c, "CREATE EXTENSION pg_eventbox")
    query(c, """
        CREATE ROLE sub_owner NOLOGIN;
        CREATE ROLE handler_role NOLOGIN;
        CREATE ROLE registrar NOLOGIN IN ROLE sub_owner, handler_role;
        GRANT USAGE ON SCHEMA eventbox TO sub_owner;
        GRANT EXECUTE ON FUNCTION eventbox.create_subscription,
            eventbox.register_handler(text, regprocedure, text, name, boolean) TO sub_owner;""")
    query(c, HANDLER_DDL.replace("{out}", out).replace("{role}", "handler_role"))
    query(c, "SET ROLE sub_owner; SELECT eventbox.create_subscription('restored', ARRAY[%s], "
             "backoff => '100 ms', backoff_max => '1 s'); RESET ROLE", (in_topic,))
    query(c, "SET ROLE registrar; SELECT eventbox.register_handler('restored', "
             "'shop.on_order(eventbox.inbox)'::regprocedure, run_as => 'handler_role'); "
             "RESET ROLE")
    pre_ids = [r[0] for r in query(c, "SELECT eventbox.send(%s, jsonb_build_object('n', g), "
                                      "key => 'k' || g %% 5) FROM generate_series(1, 30) g",
                                   (pre,))]
    in_ids = [str(uuid.uuid4()) for _ in range(20)]
    kafka.produce(in_topic, [(m, 0, "k%d" % i, {"n": i}, "OrderCreated")
                             for i, m in enumerate(in_ids)])
    for i, m in enumerate(in_ids[:10]):
        query(c, "INSERT INTO eventbox.inbox (subscription, message_id, topic, \"partition\", "
                 "\"offset\", key, headers, payload, event_type, received_at) "
                 "VALUES ('restored', %s, %s, 0, %s, convert_to(%s, 'UTF8'), %s, %s, "
                 "'OrderCreated', now() - interval '1 hour')",
              (m, in_topic, i, "k%d" % i, '{"message_id": "%s"}' % m, '{"n": %d}' % i))
    query(c, "INSERT INTO eventbox.offsets (subscription, topic, \"partition\", next_offset) "
             "VALUES ('restored', %s, 0, 10)", (in_topic,))
    snap = snapshot(c)
    seq = query_one(c, "SELECT last_value FROM eventbox.outbox_id_seq")
    c.close()
    return pre_ids, in_ids, snap, seq


def test_dump_restore_into_served_database(clusters, kafka):
    in_topic, pre, out = kafka.topic("orders", 1), kafka.topic("pre"), kafka.topic("out")
    # The source's workers serve `postgres`, which has no extension: nothing runs on `app`.
    src = clusters("dumpsrc").start(db="postgres", brokers=kafka.bootstrap)
    pre_ids, in_ids, snap, seq = make_source(src, kafka, in_topic, pre, out)
    assert len(snap["outbox"]) == 30 and len(snap["inbox"]) == 10
    dump = os.path.join(src.dir, "app.dump")
    src.tool("pg_dump", "-Fc", "-d", "app", "-f", dump)

    dst = clusters("dumpdst").start(db="app", brokers=kafka.bootstrap)
    d = dst.connect("postgres")
    query(d, "CREATE ROLE sub_owner NOLOGIN; CREATE ROLE registrar NOLOGIN IN ROLE sub_owner")

    # 1. handler_role is missing: pg_restore says so and fails; no handler runs as anyone else.
    query(d, "CREATE DATABASE app_norole")
    p = dst.tool("pg_restore", "-d", "app_norole", dump, check=False)
    assert p.returncode != 0, p.stderr
    assert 'role "handler_role" does not exist' in p.stderr, p.stderr
    n = dst.connect("app_norole")
    norole_handlers = query(n, "SELECT run_as::text FROM eventbox.handlers")
    assert all(r == ("handler_role",) for r in norole_handlers), norole_handlers
    norole_outbox = query_one(n, "SELECT count(*) FROM eventbox.outbox")
    n.close()
    errors = [ln for ln in p.stderr.splitlines() if "error" in ln.lower()]

    # 2. With every role: the restore is clean, into the database the workers serve.
    query(d, "CREATE ROLE handler_role NOLOGIN; GRANT handler_role TO registrar")
    el = Elapsed()
    p = dst.tool("pg_restore", "-d", "app", dump, check=False)
    restore_s = el()
    assert p.returncode == 0 and p.stderr == "", p.stderr
    c = dst.connect("app")
    # Configuration, by role name, exactly as dumped (it does not change while running).
    for k in ("subscriptions", "handlers"):
        assert query(c, SNAPSHOTS[k]) == snap[k], k
    assert query_one(c, "SELECT to_regprocedure(handler)::text FROM eventbox.handlers") == \
        "shop.on_order(eventbox.inbox)"
    workers_s = wait_workers(dst, timeout=30, dbname="app")

    # Waiting outbox rows: delivered once each.
    recs = kafka.wait_ids(pre, pre_ids, timeout=30)
    delivered_s = el()
    mids = collections.Counter(r.message_id for r in recs)
    assert set(mids) == set(pre_ids) and not duplicates(mids)

    # The restored inbox rows and the records after the restored offset: handled once each, as
    # handler_role; the restored rows were not ingested again.
    status = wait_settled(c, "restored", 20, timeout=60)
    handled_s = el()
    assert status == {"processed": 20}, status
    runs = query(c, "SELECT message_id, ran_as, out_id::text FROM shop.handled")
    ran = collections.Counter(m for m, *_ in runs)
    assert set(ran) == set(in_ids) and not duplicates(ran), (len(ran), duplicates(ran))
    assert {r[1] for r in runs} == {"handler_role"}
    assert query(c, "SELECT \"offset\", received_at FROM eventbox.inbox WHERE \"offset\" < 10 "
                    "ORDER BY 1") == [(r[4], r[8]) for r in snap["inbox"]]
    assert query(c, SNAPSHOTS["offsets"]) == [("restored", in_topic, 0, 20)]
    ingest = query(c, "SELECT messages, duplicates FROM eventbox.workers WHERE role = 'ingest'")
    assert ingest == [(10, 0)], ingest   # read from the restored offset 10, not from 0
    outs = collections.Counter(r.message_id for r in kafka.wait_ids(out, [r[2] for r in runs]))
    assert not duplicates(outs)

    # The id sequence continues after the restored ids; message ids stay unique.
    c.autocommit = False
    new_mid = query_one(c, "SELECT eventbox.send(%s, '{\"after\": \"restore\"}'::jsonb)", (pre,))
    new_id = query_one(c, "SELECT id FROM eventbox.outbox WHERE message_id = %s", (new_mid,))
    c.commit()
    c.autocommit = True
    assert new_id > max(r[0] for r in snap["outbox"]) and new_id > seq, (new_id, seq)
    assert new_mid not in set(pre_ids)
    recs = kafka.wait_ids(pre, [new_mid], timeout=30)
    mids = collections.Counter(r.message_id for r in recs)
    assert set(mids) == set(pre_ids) | {new_mid} and not duplicates(mids)
    report("dump_restore", restore_s="%.1f" % restore_s, workers_s="%.1f" % workers_s,
           outbox_delivered_s="%.1f" % delivered_s, inbox_settled_s="%.1f" % handled_s,
           norole_errors=len(errors), norole_handler_rows=len(norole_handlers),
           norole_outbox_rows=norole_outbox, lost=0, duplicated=0)
    c.close()
    d.close()
