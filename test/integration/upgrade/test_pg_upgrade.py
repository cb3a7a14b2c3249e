"""pg_upgrade of a cluster using pg_eventbox at its current version (same binaries, initdb'ed target): --check
passes, the upgrade runs, and the new cluster delivers and handles what the old one left
waiting, from the stored offsets. A 0.1.0 install with a registered handler (a regprocedure
column) is refused by pg_upgrade --check: why 0.2.0 stores handlers as text."""

import collections
import os
import re
import uuid

from clusters import (HANDLER_DDL, PGBIN, Elapsed, as_postgres, duplicates, query,
                             query_one, report, wait_settled, wait_until, wait_workers)

SNAPSHOTS = {
    "subscriptions": "SELECT name, topics, owner::text, created_at FROM eventbox.subscriptions",
    "handlers": "SELECT subscription, event_type, handler, run_as::text, registered_by::text, "
                "to_regprocedure(handler)::text FROM eventbox.handlers",
    "offsets": "SELECT topic, \"partition\", next_offset FROM eventbox.offsets ORDER BY 1, 2",
    "inbox": "SELECT message_id, \"offset\", status, received_at FROM eventbox.inbox "
             "ORDER BY message_id",
}


def pg_upgrade(old, new, *extra, check=True):
    return as_postgres([os.path.join(PGBIN, "pg_upgrade"), "-b", PGBIN, "-B", PGBIN,
                        "-d", old.datadir, "-D", new.datadir, "-p", str(old.port),
                        "-P", str(new.port), "-U", "postgres"] + list(extra),
                       cwd=new.dir, check=check)


def target(clusters, kafka, name):
    """An initdb'ed cluster configured like cluster.sh's, workers preloaded (pg_upgrade loads
    the old cluster's libraries in the new one)."""
    return clusters(name).initdb(conf=[
        "shared_preload_libraries = 'pg_eventbox'", "eventbox.database = 'app'",
        "eventbox.brokers = '%s'" % kafka.bootstrap])


def test_pg_upgrade_keeps_waiting_work(clusters, kafka):
    in_topic, pre, out = kafka.topic("orders"), kafka.topic("pre"), kafka.topic("out")
    # No handler workers on the old cluster, so that ingested messages wait.
    old = clusters("pgu-old").start(db="app", brokers=kafka.bootstrap,
                                    conf=["eventbox.handler_workers=0"])
    c = old.connect()
    query(c, "CREATE EXTENSION pg_eventbox")
    query(c, "CREATE ROLE app_handler NOLOGIN")
    query(c, HANDLER_DDL.replace("{out}", out).replace("{role}", "app_handler"))
    query(c, "SELECT eventbox.create_subscription('billing', ARRAY[%s], backoff => '100 ms', "
             "backoff_max => '1 s')", (in_topic,))
    query(c, "SELECT eventbox.register_handler('billing', "
             "'shop.on_order(eventbox.inbox)'::regprocedure, run_as => 'app_handler')")
    wait_workers(old, handlers=0)
    in_ids = [str(uuid.uuid4()) for _ in range(16)]
    kafka.produce(in_topic, [(m, i % 4, "k%d" % i, {"n": i}, "OrderCreated")
                             for i, m in enumerate(in_ids)])
    wait_until(lambda: query_one(c, "SELECT sum(next_offset) FROM eventbox.offsets") == 16, 30,
               what="old cluster to ingest 16 records")
    # The relay goes idle (no brokers) and sends wait in the outbox.
    query(c, "ALTER SYSTEM SET eventbox.brokers = ''")
    query(c, "SELECT pg_reload_conf()")
    wait_until(lambda: query(c, "SELECT state FROM eventbox.workers WHERE role = 'relay'")
               == [("idle: no brokers",)], 30, what="relay idle")
    pre_ids = [r[0] for r in query(c, "SELECT eventbox.send(%s, jsonb_build_object('n', g)) "
                                      "FROM generate_series(1, 25) g", (pre,))]
    snap = {k: query(c, q) for k, q in SNAPSHOTS.items()}
    assert [r[2] for r in snap["inbox"]] == ["received"] * 16
    assert snap["handlers"][0][5] == "shop.on_order(eventbox.inbox)"
    c.close()
    old.pg_ctl_stop()

    new = target(clusters, kafka, "pgu-new")
    el = Elapsed()
    p = pg_upgrade(old, new, "--check")
    check_s = el()
    assert "Clusters are compatible" in p.stdout, p.stdout
    p = pg_upgrade(old, new)
    upgrade_s = el() - check_s
    assert "Upgrade Complete" in p.stdout, p.stdout
    new.db = "app"
    new.pg_ctl_start()
    started = Elapsed()
    wait_workers(new, timeout=30)
    n = new.connect()
    for k in ("subscriptions", "handlers", "offsets"):
        assert query(n, SNAPSHOTS[k]) == snap[k], k

    # The outbox rows left waiting: delivered once each.
    recs = kafka.wait_ids(pre, pre_ids, timeout=30)
    mids = collections.Counter(r.message_id for r in recs)
    assert set(mids) == set(pre_ids) and not duplicates(mids)
    # The inbox rows left waiting: handled once each, as app_handler, by the same handler.
    status = wait_settled(n, "billing", 16, timeout=60)
    settled_s = started()
    assert status == {"processed": 16}, status
    runs = query(n, "SELECT message_id, ran_as FROM shop.handled")
    ran = collections.Counter(m for m, _ in runs)
    assert set(ran) == set(in_ids) and not duplicates(ran)
    assert {r for _, r in runs} == {"app_handler"}
    # New records: read from the stored offsets (nothing read twice).
    more = [str(uuid.uuid4()) for _ in range(8)]
    kafka.produce(in_topic, [(m, i % 4, "k%d" % i, {"n": i}, "OrderCreated")
                             for i, m in enumerate(more)])
    wait_settled(n, "billing", 24, timeout=60)
    ingest = query(n, "SELECT messages, duplicates FROM eventbox.workers WHERE role = 'ingest'")
    assert ingest == [(8, 0)], ingest
    assert query_one(n, "SELECT sum(next_offset) FROM eventbox.offsets") == 24
    ran = collections.Counter(m for m, in query(n, "SELECT message_id FROM shop.handled"))
    assert set(ran) == set(in_ids) | set(more) and not duplicates(ran)
    report("pg_upgrade", check_s="%.1f" % check_s, upgrade_s="%.1f" % upgrade_s,
           settled_after_start_s="%.1f" % settled_s, outbox_rows=len(pre_ids),
           inbox_rows=len(in_ids), lost=0, duplicated=0)
    n.close()


def test_pg_upgrade_check_refuses_0_1_0_handlers(clusters, kafka):
    # The old cluster's workers serve `postgres` (no extension there): nothing runs.
    old = clusters("pgu-010").start(db="postgres")
    old.sql("CREATE DATABASE legacy")
    old.sql("""
        CREATE EXTENSION pg_eventbox VERSION '0.1.0';
        CREATE ROLE legacy_handler NOLOGIN;
        CREATE FUNCTION public.on_msg(msg eventbox.inbox) RETURNS void LANGUAGE sql AS 'SELECT';
        SELECT eventbox.create_subscription('legacy', ARRAY['orders']);
        SELECT eventbox.register_handler('legacy', 'public.on_msg(eventbox.inbox)'::regprocedure,
                                         run_as => 'legacy_handler');""", dbname="legacy")
    assert old.sql("SELECT pg_typeof(handler)::text FROM eventbox.handlers",
                   dbname="legacy") == [("regprocedure",)]
    old.pg_ctl_stop()
    new = target(clusters, kafka, "pgu-010new")
    p = pg_upgrade(old, new, "--check", check=False)
    assert p.returncode != 0, p.stdout
    assert "reg* data types in user tables" in p.stdout, p.stdout
    m = re.search(r"(/\S+/tables_using_reg\.txt)", p.stdout)
    assert m, p.stdout
    with open(m.group(1)) as f:
        listed = f.read()
    assert "In database: legacy" in listed and "eventbox.handlers.handler" in listed, listed
    report("pg_upgrade_check_0_1_0", refused=True, listed=" ".join(listed.split()))
