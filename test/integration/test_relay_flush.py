"""The relay flushes the WAL only as far as the rows it publishes need (docs/design/relay.md, "A
pass", step 3): the commit records of the transactions that wrote them, when these committed
asynchronously. A synchronous commit was flushed before its row became visible, so rows of
synchronous commits cost the relay no flush at all, and the WAL the relay writes itself (its
outcomes, its asynchronous commits) is never what it waits for.

With the WAL's insert position after the pass's snapshot as the bound, every pass that wrote
outcomes (the previous row's acknowledgement) and then offered a row flushed the WAL it had just
written: one fdatasync per pass besides the senders' own. Counted here as the WAL syncs of the
whole cluster (pg_stat_wal) over 600 one-row synchronous commits 5 ms apart, a pass every 5 ms
writing the acknowledgements of the rows before: 926 with the insert position as the bound, 610
and 615 now (the senders' own, and the WAL writer's few). The second test checks the other side:
a row committed asynchronously is not published before its commit is flushed (the fault test
test_fault_relay_durable.py crashes the server around such commits)."""

from eventbox_fixtures import connect, query, query_one, report, wait_for_ids
from relay_sending import relay_stat, send_paced, warm_relay

SENDS = 600
RATE = 200.0  # one-row commits a second: a pass (5 ms apart) writes the acks of the last ones
# and offers the new


def wal_syncs(c):
    """The cluster's WAL syncs, the relay's counted in."""
    return relay_stat(c, "SELECT wal_sync FROM pg_stat_wal")


def test_rows_of_synchronous_commits_cost_the_relay_no_wal_flush(conn, new_topic):
    topic = new_topic(1)
    warm_relay(conn, topic)
    c = connect(autocommit=True)
    try:
        before = wal_syncs(c)
        wait_for_ids(topic, send_paced(c, topic, SENDS, RATE))
        syncs = wal_syncs(c) - before
    finally:
        c.close()
    report("test_rows_of_synchronous_commits_cost_the_relay_no_wal_flush", commits=SENDS,
           wal_syncs=syncs)
    # Each commit syncs once itself; a flush per pass of the relay's would double that.
    assert syncs < SENDS * 1.3, "%d WAL syncs for %d one-row commits" % (syncs, SENDS)


def test_a_row_committed_asynchronously_is_flushed_before_it_is_published(conn, new_topic,
                                                                          settings):
    topic = new_topic(1)
    # The WAL writer flushes a partly filled page only every 10 s: the relay's flush is what
    # makes the commit durable before the row is published.
    settings.set("wal_writer_delay", "10s")
    c = connect(autocommit=False)
    try:
        query(c, "SET synchronous_commit = off")
        c.commit()
        mid = str(query_one(c, "SELECT eventbox.send(%s, '{\"async\": true}'::jsonb)", (topic,)))
        # Where the WAL stood before the commit record: once the row is in Kafka, the WAL must
        # be flushed past it (nothing else here flushes within 10 s).
        before_commit = query_one(c, "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
        c.commit()
        wait_for_ids(topic, [mid])
        flushed = query_one(c, "SELECT pg_current_wal_flush_lsn() - '0/0'::pg_lsn")
        c.commit()
    finally:
        c.close()
    report("test_a_row_committed_asynchronously_is_flushed_before_it_is_published",
           flushed_past_commit=int(flushed - before_commit))
    assert flushed > before_commit, "published at flush %d, commit after %d" % (flushed,
                                                                             before_commit)
