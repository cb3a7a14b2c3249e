"""Membership 'group' (issue 33): three PostgreSQL clusters hold a subscription of the same name
and group_id over one 8-partition topic, and their ingest workers share the partitions through
one Kafka consumer group (docs/guide/scaling.md).

- all partitions are assigned, each to one cluster, and each record is stored by one cluster;
- a cluster stopped fast commits what it stored to the group and stops; its partitions move to
  the others once its session ends, 0 records lost, none stored twice unless the group was
  rebalancing when it committed (then at most one batch, as for an immediate stop);
- a cluster stopped immediately (no shutdown at all): its partitions move once its session ends,
  0 lost, and the records stored by both clusters are counted and stay within the documented
  window (one batch per ingest worker: the batch whose group commit had not been acknowledged);
  over the whole test, at most one batch per membership change;
- the stopped clusters come back and get partitions again.

The dev broker is librdkafka's mock cluster: each join waits about the session timeout (10 s)
and it ignores group.instance.id, so a restarted cluster joins as a new member (a rebalance)
instead of resuming its static membership; the figures printed are the mock's. What real Kafka
does with static members is not shown here (see docs/guide/scaling.md)."""

import os
import time
import uuid

from clusters import Cluster, Kafka, port_free, query, query_one, report, wait_until

SUB = "orders"
GROUP = "eventbox-group-test"
PARTITIONS = 8
BATCH = 50  # batch_size: the bound of what one stop can have stored twice (per ingest worker)
# How long a stopped cluster's partitions may take to move on the mock broker: its session
# timeout (10 s), then a rebalance the mock holds about as long again (documented; the test's
# deadline adds slack for a loaded machine).
MOVE_DEADLINE = 60
# Membership changes of the test (3 joins, 2 stops, 2 restarts): each can move partitions away
# from a member whose last batch the group had not acknowledged yet (one batch at most, the
# subscription being held until it is), so at most one batch stored twice per change.
CHANGES = 7


def ports():
    """Three ports after $EVENTBOX_PORT when they are free (a run's own range), else any."""
    base = int(os.environ.get("EVENTBOX_PORT", "0") or 0)
    return [base + k if base and port_free(base + k) else None for k in (1, 2, 3)]


def subscribe(cluster, topic):
    c = cluster.connect()
    query(c, "CREATE EXTENSION IF NOT EXISTS pg_eventbox")
    query(c, "SELECT eventbox.create_subscription(%s, ARRAY[%s], group_id => %s, "
             "membership => 'group', batch_size => %s)", (SUB, topic, GROUP, BATCH))
    c.close()


def stored(cluster):
    """{message_id: partition} of the records this cluster stored."""
    c = cluster.connect()
    try:
        return dict(query(c, "SELECT message_id, \"partition\" FROM eventbox.inbox "
                             "WHERE subscription = %s", (SUB,)))
    finally:
        c.close()


def partition_of(k):
    """The partition of the k-th record of a wave()."""
    return k % PARTITIONS


def wave(kafka, topic, n):
    """n records spread over the partitions; returns their ids."""
    ids = [str(uuid.uuid4()) for _ in range(n)]
    kafka.produce(topic, [(m, partition_of(i), "k%d" % i, {"n": i}, "OrderCreated")
                          for i, m in enumerate(ids)])
    return ids


def wait_all(clusters, ids, timeout, what):
    """Waits until every id is stored by one of `clusters`; returns [{id: partition}] of each
    and the seconds it took."""
    want = set(ids)
    seen = []
    t0 = time.monotonic()

    def probe():
        nonlocal seen
        seen = [stored(c) for c in clusters]
        got = set()
        for s in seen:
            got |= want & s.keys()
        return got == want

    wait_until(probe, timeout, interval=0.5, what=what,
               explain=lambda: why_missing(clusters, ids, seen))
    return seen, time.monotonic() - t0


def why_missing(clusters, ids, seen):
    """What a timed-out wait_all() leaves to read: the partitions of the records no cluster
    stored, what each cluster stored of `ids`, and each cluster's last group log lines."""
    got = set().union(*(s.keys() for s in seen)) if seen else set()
    missing = sorted({partition_of(k) for k, m in enumerate(ids) if m not in got})
    lines = ["records not stored: %d, of partitions %s; stored by partition: %s"
             % (len(set(ids) - got), missing, holders(seen, ids))]
    for c in clusters:
        group = c.log_lines(r"consumer group|committing offsets|ERROR|WARNING|FATAL")
        lines.append("--- %s (%s), last group log lines:" % (c.name, c.log))
        lines += group[-15:]
    return "\n".join(lines)


def overlap(seen, ids):
    """Ids of `ids` stored by more than one cluster."""
    count = {}
    for s in seen:
        for i in set(ids) & s.keys():
            count[i] = count.get(i, 0) + 1
    return {i for i, n in count.items() if n > 1}


def holders(seen, ids):
    """{cluster index: partitions it stored records of `ids` from}."""
    want = set(ids)
    return {k: sorted({p for i, p in s.items() if i in want}) for k, s in enumerate(seen)}


def uncommitted(cluster):
    c = cluster.connect()
    try:
        return query_one(c, "SELECT coalesce(sum(value), 0)::int8 FROM eventbox.metrics "
                            "WHERE name = 'eventbox_ingest_group_uncommitted'")
    finally:
        c.close()


def test_three_clusters_share_a_subscription_through_one_group(tmp_path):
    kafka = Kafka(str(tmp_path))
    clusters = [Cluster("group%d" % k, port=p) for k, p in enumerate(ports())]
    try:
        topic = kafka.topic("group_in", partitions=PARTITIONS)
        for c in clusters:
            # DEBUG1: the ingest workers' group events (assigned, revoked) reach the log.
            c.start(brokers=kafka.bootstrap, conf=("log_min_messages=debug1",))
            subscribe(c, topic)

        # 1. Every partition assigned, each to one cluster, every record stored once. The
        # group settles after the joins (each one a rebalance the mock holds ~10 s): waves until
        # every cluster stores some partitions and no partition is stored by two.
        all_ids = []
        deadline = time.monotonic() + 120
        while True:
            ids = wave(kafka, topic, 400)
            all_ids += ids
            seen, _ = wait_all(clusters, ids, 90, "the first records stored")
            owners = holders(seen, ids)
            shared = [p for p in range(PARTITIONS)
                      if sum(p in parts for parts in owners.values()) > 1]
            if all(owners.values()) and not shared:
                break
            assert time.monotonic() < deadline, "the group did not settle: %s" % owners
            time.sleep(2)
        assert sorted(p for parts in owners.values() for p in parts) == list(range(PARTITIONS))
        # Each join is a membership change: a member the group declares lost meanwhile (the mock
        # does, when a rebalance outlasts a session) leaves at most one batch to another.
        joining_twice = overlap(seen, all_ids)
        assert len(joining_twice) <= 3 * BATCH, \
            "stored twice while joining: %d > %d" % (len(joining_twice), 3 * BATCH)
        settled = {k: len(v) for k, v in owners.items()}

        # 2. Cluster 2 stopped fast: it commits what it stored to the group and stops; its
        # partitions move once its session ends (a static member does not leave the group).
        gone = owners[2]
        clusters[2].pg_ctl_stop("fast")
        fast_ids = wave(kafka, topic, 400)
        seen, fast_move_s = wait_all(clusters[:2], fast_ids, MOVE_DEADLINE,
                                     "cluster 2's partitions moved (fast stop)")
        assert set(gone) <= {p for parts in holders(seen, fast_ids).values() for p in parts}

        # 3. Cluster 1 stopped immediately while it stores a wave: what it stored and the group
        # did not acknowledge is stored again by cluster 0 (at most one batch); the rest of its
        # partitions move once its session ends.
        before = len(stored(clusters[1]))
        busy_ids = wave(kafka, topic, 3000)
        wait_until(lambda: len(stored(clusters[1])) > before, 30,
                   what="cluster 1 storing the wave")
        window = uncommitted(clusters[1])
        clusters[1].pg_ctl_stop("immediate")
        after_ids = wave(kafka, topic, 400)
        _, immediate_move_s = wait_all(clusters[:1], after_ids, MOVE_DEADLINE,
                                       "cluster 1's partitions moved (immediate stop)")

        # 4. Both come back (cluster 1 through crash recovery: it keeps the rows it had flushed,
        # which are those whose offsets it committed to the group) and get partitions again.
        clusters[1].pg_ctl_start()
        clusters[2].pg_ctl_start()
        deadline = time.monotonic() + 150
        while True:
            ids = wave(kafka, topic, 400)
            all_ids += ids
            seen, _ = wait_all(clusters, ids, 90, "records after the restarts")
            owners = holders(seen, ids)
            if all(owners.values()):
                break
            assert time.monotonic() < deadline, "the restarted clusters got nothing: %s" % owners
            time.sleep(2)

        all_ids += fast_ids + busy_ids + after_ids
        seen, _ = wait_all(clusters, all_ids, 30, "every record stored")
        lost = set(all_ids) - set().union(*(s.keys() for s in seen))
        fast_twice = overlap(seen, fast_ids)
        immediate_twice = overlap(seen, busy_ids + after_ids)
        report("group", records=len(all_ids), settled=settled,
               fast_stop_move_s="%.1f" % fast_move_s,
               immediate_stop_move_s="%.1f" % immediate_move_s,
               uncommitted_at_immediate_stop=window,
               stored_twice_fast=len(fast_twice), stored_twice_immediate=len(immediate_twice),
               stored_twice_all=len(overlap(seen, all_ids)), lost=len(lost))
        assert lost == set(), "lost: %d" % len(lost)
        # A fast stop commits what it stored before leaving; should the group be rebalancing
        # then (the commit refused), one batch is the bound as for any move.
        assert len(fast_twice) <= BATCH, \
            "stored twice across the fast stop: %d > %d" % (len(fast_twice), BATCH)
        assert len(immediate_twice) <= BATCH, \
            "stored twice across the immediate stop: %d > %d" % (len(immediate_twice), BATCH)
        assert len(overlap(seen, all_ids)) <= CHANGES * BATCH
        for c in (clusters[0], clusters[2]):
            assert c.crash_lines() == [], c.crash_lines()
    finally:
        for c in clusters:
            c.stop()
        kafka.close()
