"""The relay flushes the WAL up to what its snapshot can see before it publishes (a row committed
asynchronously must not reach Kafka and then vanish in a crash). When the WAL's insert position
sits exactly on a page boundary, PostgreSQL reports where the next record will start, past the
page header that is not written yet; flushing to that failed the relay's pass ("xlog flush
request ... is not satisfied") and rows in flight were published twice.

Here transactions are made to end exactly on a WAL page boundary: after eventbox.send(), a
non-transactional logical message pads the WAL so that the commit record ends on the boundary,
so the relay, woken by the commit, takes its snapshot right there.

The padding needs a quiet WAL: an idle relay writes none (its pass used to lock its own
eventbox.outbox_state row each second, which also spoiled the padding here)."""
import re
import time
import uuid

from eventbox_fixtures import (connect, count_ids, query, query_one, read_topic, report,
                               settled_below, wait_outbox_drained, wait_until)

PAGE = 8192
ROUNDS = 12


def wait_settled(c):
    """Waits until the relay has nothing left to write: every row sent is settled, and its
    settled position W (which moves in the pass after the acknowledgements) is past them."""
    wait_outbox_drained()
    top = query_one(c, "SELECT coalesce(max(id), 0) FROM eventbox._outbox_rows")
    wait_until(lambda: settled_below(c) > top, 30,
               what="the relay's settled position past id %d" % top)


def lsn(c):
    return int(query_one(c, "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn"))


def pad(c, length):
    query_one(c, "SELECT pg_logical_emit_message(false, 'eventbox-test-pad', repeat('x', %s))",
              (length,))


def pad_size(c, length):
    """The WAL bytes a padding record of `length` payload bytes takes: the smallest of a few
    measurements, since WAL written meanwhile by other sessions (workers, autovacuum) can only
    inflate one."""
    sizes = []
    for _ in range(5):
        before = lsn(c)
        pad(c, length)
        sizes.append(lsn(c) - before)
    return min(sizes)


def record_overhead(c):
    """{short, long}: bytes of a padding record beyond its payload, before MAXALIGN (payloads up
    to 255 bytes have a shorter data header)."""
    out = {}
    for name, base in (("short", 0), ("long", 400)):
        for _ in range(5):
            sizes = [pad_size(c, base + extra) for extra in range(9)]
            first = sizes[0]
            grow = next((i for i, s in enumerate(sizes) if s > first), None)
            # Nine payload sizes span a MAXALIGN step exactly once, by 8 bytes; anything else
            # means concurrent WAL spoiled every measurement of one size: measure again.
            if grow is not None and sizes[grow:] == [first + 8] * (9 - grow) and \
                    sizes[:grow] == [first] * grow:
                break
        else:
            raise AssertionError("could not measure a padding record's size: %r" % sizes)
        # MAXALIGN(overhead + base + grow) first exceeds `first`: overhead + base + grow = first + 1.
        out[name] = first + 1 - grow - base
    return out


def test_commits_ending_on_a_wal_page_boundary_are_published_once(conn, new_topic, log_watch):
    topic = new_topic(1)
    probe = connect(autocommit=True)
    c = connect(autocommit=False)
    try:
        overhead = record_overhead(probe)
        # The size of the commit record of a transaction like the ones below: measured on a few
        # of them (the smallest seen, in case something else wrote WAL meanwhile).
        sent, commit_sizes = [], []
        for _ in range(3):
            mid = str(uuid.uuid4())
            query_one(c, "SELECT eventbox.send(%s, '{\"calibrate\": 1}'::jsonb, message_id => %s)",
                      (topic, mid))
            before = lsn(c)
            c.commit()
            commit_sizes.append(lsn(probe) - before)
            sent.append(mid)
            wait_outbox_drained(topic)
        commit = min(commit_sizes)
        assert commit % 8 == 0 and 0 < commit < 1024, commit_sizes

        hits = 0
        for i in range(ROUNDS):
            wait_settled(c)
            mid = str(uuid.uuid4())
            query_one(c, "SELECT eventbox.send(%s, jsonb_build_object('round', %s::int), "
                         "message_id => %s)", (topic, i, mid))
            sent.append(mid)
            here = lsn(c)
            room = PAGE - here % PAGE
            if room < commit + 512:  # too little room for a padding record: go to the next page
                pad(c, 600)
                here = lsn(c)
                room = PAGE - here % PAGE
            record = room - commit  # the padding record's size, so that the commit ends on the page
            payload = record - overhead["long" if record - overhead["short"] > 255 else "short"]
            pad(c, payload)
            c.commit()
            end = lsn(probe)
            hits += end % PAGE == 24  # the next record starts right after a page header
        wait_outbox_drained(topic)
        recs = read_topic(topic)
        lost, dups, unexpected = count_ids(recs, sent)
        flush_errors = log_watch.lines(r"xlog flush request .* is not satisfied")
        report("relay_wal_page_boundary", rounds=ROUNDS, commits_on_boundary=hits,
               commit_record_bytes=commit, lost=lost, duplicated=dups, unexpected=unexpected,
               flush_errors=len(flush_errors))
        # The padding must actually have put commits on page boundaries, or this proves nothing.
        assert hits >= ROUNDS // 2, "only %d of %d commits ended on a WAL page boundary" % (
            hits, ROUNDS)
        assert flush_errors == []
        assert (lost, dups, unexpected) == (0, 0, 0)
    finally:
        c.close()
        probe.close()


def outbox_relfilenodes(c):
    """relfilenode -> name of every table and index behind eventbox.outbox."""
    return {int(n): name for n, name in query(
        c, "SELECT c.relfilenode, c.relname FROM pg_class c "
           "JOIN pg_namespace s ON s.oid = c.relnamespace "
           "WHERE s.nspname = 'eventbox' AND c.relkind IN ('r', 'i', 't') "
           "AND c.relname LIKE 'outbox%'")}


def test_an_idle_relay_writes_no_wal(conn, new_topic, settings):
    topic = new_topic(1)
    # Its rotation is work an idle relay still has (the open table holds rows): not now.
    settings.set("eventbox.outbox_rotation_interval", "1h")
    c = connect(autocommit=True)
    try:
        query_one(c, "CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        for i in range(20):
            query_one(c, "SELECT eventbox.send(%s, jsonb_build_object('n', %s::int))", (topic, i))
        wait_outbox_drained(topic)
        wait_settled(c)
        # A table closed before the setting took effect is truncated once settled: let it be.
        wait_until(lambda: query_one(c, "SELECT count(*) = 0 FROM eventbox.outbox_state "
                                        "WHERE state = 'closed'"), 30, what="no closed table")
        nodes = outbox_relfilenodes(c)
        start = query_one(c, "SELECT pg_current_wal_insert_lsn()")
        time.sleep(4.0)  # several idle passes (one per second at least)
        # A transaction that writes WAL commits synchronously, so what is read below is flushed
        # (and not empty: it ends with this record).
        query_one(c, "SELECT pg_logical_emit_message(true, 'eventbox-test-flush', '')")
        end = query_one(c, "SELECT pg_current_wal_flush_lsn()")
        records = query(c, "SELECT resource_manager, record_type, block_ref "
                           "FROM pg_get_wal_records_info(%s, %s)", (start, end))
        touched = sorted({nodes[int(m)] for _, _, ref in records if ref
                          for m in re.findall(r"rel \d+/\d+/(\d+)", ref) if int(m) in nodes})
        report("relay_idle_wal", records=len(records), outbox_records=len(touched))
        assert touched == [], "an idle relay wrote WAL for %s: %r" % (touched, records)
    finally:
        query_one(c, "DROP EXTENSION IF EXISTS pg_walinspect")
        c.close()


