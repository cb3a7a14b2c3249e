"""The extension as the sections drive it: settings, the relay, the ingest and handler workers,
subscriptions, and the handler objects the inbox sections share."""

import os
import re
import time

from .cluster import q1
from .common import REPO, BenchError

HANDLER_ROLE = "bench_handler"


# ---------------------------------------------------------------------------------------------
# settings


def alter_system(cur, name, value):
    """ALTER SYSTEM SET name = value (None: RESET) and a reload."""
    if value is None:
        cur.execute("ALTER SYSTEM RESET %s" % name)
    else:
        cur.execute("ALTER SYSTEM SET %s = %%s" % name, (value,))
    cur.execute("SELECT pg_reload_conf()")


def set_conf(cur, name, value):
    """alter_system(), then a moment for the workers to take the setting."""
    alter_system(cur, name, value)
    time.sleep(0.5)


def ingest_consumer_setting(name):
    """A librdkafka property the ingest consumer sets (read from the source, for the notes)."""
    try:
        with open(os.path.join(REPO, "src", "kafka/consumer.cpp")) as f:
            m = re.search(r'"%s",\s*"(\d+)"' % re.escape(name), f.read())
        return int(m.group(1)) if m else None
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------
# the outbox's tables

# What stores eventbox.outbox, a view since 0.6.0 (docs/design/outbox-rotation.md): the rotated
# tables of the messages, their ack tables, the held rows and the relay's positions.
OUTBOX_TABLES = (tuple("eventbox.outbox_rows_%d" % n for n in range(3)) +
                 tuple("eventbox.outbox_acks_%d" % n for n in range(3)) +
                 ("eventbox.outbox_held", "eventbox.outbox_state"))
OUTBOX_REGCLASSES = "ARRAY[%s]::regclass[]" % ", ".join("'%s'" % t for t in OUTBOX_TABLES)


def vacuum_outbox(cur):
    """VACUUM of the tables behind eventbox.outbox: what autovacuum leaves in the steady state
    (the rotated tables have nothing to reclaim; the held and state tables may)."""
    cur.execute("VACUUM " + ", ".join(OUTBOX_TABLES))


def outbox_sizes(cur):
    """Heap, table (with TOAST, free space and visibility maps) and index bytes of the tables
    behind eventbox.outbox, summed."""
    cur.execute("SELECT sum(pg_relation_size(t))::int8, sum(pg_table_size(t))::int8, "
                "sum(pg_indexes_size(t))::int8 FROM unnest(%s) t" % OUTBOX_REGCLASSES)
    heap, table, indexes = cur.fetchone()
    return {"heap": heap, "table": table, "indexes": indexes, "total": table + indexes}


def outbox_stat(cur, column):
    """A column of pg_stat_user_tables summed over the tables behind eventbox.outbox, as the
    statistics system has it now."""
    cur.execute("SELECT pg_stat_clear_snapshot()")
    return q1(cur, "SELECT coalesce(sum(%s), 0)::int8 FROM pg_stat_user_tables "
                   "WHERE relid = ANY(%s)" % (column, OUTBOX_REGCLASSES))


# ---------------------------------------------------------------------------------------------
# workers


def worker_pids(cur, *roles):
    """The pids of the workers of these roles in eventbox.workers."""
    cur.execute("SELECT pid FROM eventbox.workers WHERE role = ANY(%s)", (list(roles),))
    return [r[0] for r in cur.fetchall()]


def relay_info(cur):
    """(pid, state, messages, errors, last_error) of the relay."""
    cur.execute("SELECT pid, state, messages, errors, last_error FROM eventbox.workers "
                "WHERE role = 'relay'")
    return cur.fetchone()


def relay_pid(cur, timeout=30):
    """The relay's pid, once it runs."""
    deadline = time.monotonic() + timeout
    while True:
        pid = q1(cur, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventbox relay'")
        if pid:
            return pid
        if time.monotonic() > deadline:
            raise BenchError("no 'eventbox relay' in pg_stat_activity after %ds" % timeout)
        time.sleep(0.1)


def set_brokers(cur, value, want_state, timeout=30):
    """eventbox.brokers = value; with want_state, waits until the relay is in that state."""
    alter_system(cur, "eventbox.brokers", value)
    if want_state is None:
        return
    deadline = time.monotonic() + timeout
    while True:
        info = relay_info(cur)
        if info and info[1] == want_state:
            return
        if time.monotonic() > deadline:
            raise BenchError("relay did not reach state %r within %ds (now: %r)"
                             % (want_state, timeout, info))
        time.sleep(0.02)


def ingest_counters(cur):
    """(messages, duplicates, errors, a last error) summed over the ingest workers."""
    cur.execute("SELECT sum(messages)::int8, sum(duplicates)::int8, sum(errors)::int8, "
                "max(last_error), count(*) FROM eventbox.workers WHERE role = 'ingest'")
    row = cur.fetchone()
    if not row[4]:
        raise BenchError("no ingest worker in eventbox.workers")
    return row[:4]


def set_ingest_workers(cur, n, timeout=60):
    """eventbox.ingest_workers = n (a reload); waits until exactly n ingest workers run."""
    alter_system(cur, "eventbox.ingest_workers", str(n))
    deadline = time.monotonic() + timeout
    while True:
        cur.execute("SELECT count(*) FILTER (WHERE state <> 'starting'), count(*) "
                    "FROM eventbox.workers WHERE role = 'ingest'")
        ready, total = cur.fetchone()
        if ready == n and total == n:
            return
        if time.monotonic() > deadline:
            raise BenchError("eventbox.ingest_workers = %d: %d ingest workers after %ds"
                             % (n, total, timeout))
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------
# subscriptions


def create_disabled_subscription(cur, sub, topic, unhandled="keep", handler=None, batch=False):
    """Creates `sub` disabled in one transaction (no consumer is ever started for it), with
    `handler` (a regprocedure) registered to run as HANDLER_ROLE (as a batch handler with
    batch); unhandled None leaves the option at its default."""
    args = (sub, topic) if unhandled is None else (sub, topic, unhandled)
    sql = ["BEGIN",
           cur.mogrify("SELECT eventbox.create_subscription(%s, ARRAY[%s]"
                       + ("" if unhandled is None else ", unhandled => %s") + ")", args).decode(),
           cur.mogrify("SELECT eventbox.alter_subscription(%s, enabled => false)",
                       (sub,)).decode()]
    if handler:
        sql.append(cur.mogrify("SELECT eventbox.register_handler(%s, %s::regprocedure, "
                               "run_as => %s, batch => %s)",
                               (sub, handler, HANDLER_ROLE, batch)).decode())
    sql.append("COMMIT")
    cur.execute("; ".join(sql))


def set_enabled(cur, sub, enabled):
    cur.execute("SELECT eventbox.alter_subscription(%s, enabled => %s)", (sub, enabled))


def offsets_sum(cur, sub):
    """The stored next offsets of `sub`, added up over its partitions."""
    return int(q1(cur, "SELECT coalesce(sum(next_offset), 0) FROM eventbox.offsets "
                       "WHERE subscription = %s", (sub,)))


def wait_offsets(cur, sub, n, t0, base_messages, timeout, stall_s=None):
    """Polls (20 ms) until the stored offsets of `sub` add up to n. Returns (elapsed, first,
    first_count): first is when the ingest worker's message counter was first seen moved
    (consumer assigned and a batch committed) and first_count how far, both since t0. With
    stall_s: returns (None, None, None) when nothing moved for that long."""
    first = first_count = None
    deadline = t0 + timeout
    while True:
        time.sleep(0.02)
        now = time.monotonic()
        total = offsets_sum(cur, sub)
        if first is None:
            moved = ingest_counters(cur)[0] - base_messages
            if moved > 0:
                first, first_count = now - t0, moved
        if total >= n:
            return now - t0, first, first_count
        if stall_s is not None and first is None and now - t0 > stall_s:
            return None, None, None
        if now > deadline:
            raise BenchError("ingest of %s: offsets at %d of %d after %.0fs; ingest: %r"
                             % (sub, total, n, timeout, ingest_counters(cur)))


# ---------------------------------------------------------------------------------------------
# handler objects


def create_handler_role(cur):
    """The non-superuser role the bench's handlers run as."""
    if not q1(cur, "SELECT 1 FROM pg_roles WHERE rolname = %s", (HANDLER_ROLE,)):
        cur.execute("CREATE ROLE %s NOLOGIN" % HANDLER_ROLE)


def setup_handler_objects(cur):
    """The handlers of the inbox sections and their tables: bench_on_msg (one INSERT into
    bench_sink; bench_sink2 is the baselines' table of the same shape), bench_on_msgs (the same
    as a batch handler: one INSERT ... SELECT per chunk) and bench_on_e2e
    (records the send time of the payload and clock_timestamp() into bench_e2e)."""
    create_handler_role(cur)
    cur.execute("CREATE TABLE IF NOT EXISTS public.bench_sink (id text PRIMARY KEY, v bigint)")
    cur.execute("CREATE TABLE IF NOT EXISTS public.bench_sink2 (id text PRIMARY KEY, v bigint)")
    cur.execute("CREATE TABLE IF NOT EXISTS public.bench_e2e (id text PRIMARY KEY, "
                "sent float8, handled timestamptz)")
    cur.execute("GRANT INSERT ON public.bench_sink, public.bench_e2e TO %s" % HANDLER_ROLE)
    cur.execute("""
        CREATE OR REPLACE FUNCTION public.bench_on_msg(m eventbox.inbox) RETURNS void
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.bench_sink (id, v) VALUES (m.message_id, (m.payload->>'id')::bigint);
        END $$""")
    # bench_on_msg's INSERT as a batch handler: one INSERT ... SELECT per chunk.
    cur.execute("""
        CREATE OR REPLACE FUNCTION public.bench_on_msgs(ms eventbox.inbox[]) RETURNS void
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.bench_sink (id, v)
            SELECT m.message_id, (m.payload->>'id')::bigint FROM unnest(ms) AS m;
        END $$""")
    cur.execute("""
        CREATE OR REPLACE FUNCTION public.bench_on_e2e(m eventbox.inbox) RETURNS void
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.bench_e2e (id, sent, handled)
            VALUES (m.message_id, (m.payload->>'ts')::float8, clock_timestamp());
        END $$""")
