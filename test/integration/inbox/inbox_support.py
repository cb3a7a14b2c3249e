"""Helpers of the inbox integration and fault tests (test/integration/inbox, test/fault/inbox).

The tests run against an environment started by tools/cluster.sh whose `env` file has been
exported (PGHOST, PGPORT, PGDATABASE, EVENTBOX_LOG, EVENTBOX_BOOTSTRAP, EVENTBOX_CONTROL_HOST,
EVENTBOX_CONTROL_PORT, EVENTBOX_KILLED_PIDS, ...). Messages are produced with kafka-python, a
client independent of the extension's librdkafka; topics are created through the dev broker's
control interface. The environment and polling are in inbox_env.py, the Kafka side in
inbox_kafka.py (tests import from there what they produce and read with).

Everything polls with a deadline; nothing asserts on a bare sleep.
"""

import os
import re
import signal
import time

import psycopg2
import psycopg2.errors
import psycopg2.extras
import pytest

from inbox_env import REQUIRED_ENV, poll, unique_name

from eventbox_fixtures import CRASH_RE, connection_lost, env
from inbox_kafka import devbroker, new_producer

# Figures printed in the terminal summary (seen with -q too).
REPORTS = []


def report(test, **figures):
    line = "%s: %s" % (test, ", ".join("%s=%s" % kv for kv in figures.items()))
    REPORTS.append(line)
    print("REPORT " + line)


def terminal_summary(terminalreporter, config):
    if getattr(config, "_eventbox_inbox_reported", False) or not REPORTS:
        return
    config._eventbox_inbox_reported = True
    terminalreporter.section("eventbox inbox figures")
    for line in REPORTS:
        terminalreporter.write_line(line)


# ---------------------------------------------------------------------------------------------
# PostgreSQL


def connect(timeout=90.0):
    """A new autocommit connection; retries while the server starts or recovers from a crash."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            c = psycopg2.connect("", connect_timeout=10, application_name="eventbox-inbox-tests")
            c.autocommit = True
            return c
        except psycopg2.OperationalError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


class Db:
    """One autocommit connection that is re-opened after the server restarted.

    rows()/value() raise on a broken connection (after dropping it, so the next call
    reconnects); the *_retry variants retry read-only queries across a crash restart."""

    def __init__(self):
        self._conn = None

    def conn(self):
        if self._conn is None or self._conn.closed:
            self._conn = connect()
        return self._conn

    def close(self):
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
        self._conn = None

    def rows(self, sql, args=None):
        try:
            with self.conn().cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchall() if cur.description is not None else None
        except psycopg2.Error as e:
            if connection_lost(e):
                self.close()
            raise

    def value(self, sql, args=None):
        rows = self.rows(sql, args)
        return rows[0][0] if rows else None

    def rows_retry(self, sql, args=None, timeout=120.0):
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.rows(sql, args)
            except psycopg2.DatabaseError:
                if self._conn is not None or time.monotonic() >= deadline:
                    raise  # a real SQL error, or out of time
                time.sleep(0.2)

    def value_retry(self, sql, args=None, timeout=120.0):
        rows = self.rows_retry(sql, args, timeout)
        return rows[0][0] if rows else None

    # --- eventbox ------------------------------------------------------------------------

    def ingest_worker(self):
        """(pid, state, messages, duplicates, transport_ids, errors) of the ingest worker, when
        exactly one runs (per pg_stat_activity and eventbox.workers); else None."""
        rows = self.rows(
            "SELECT w.pid, w.state, w.messages, w.duplicates, w.transport_ids, w.errors "
            "FROM eventbox.workers w WHERE w.role = 'ingest' AND w.pid IN "
            "(SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventbox ingest')")
        n = self.value("SELECT count(*) FROM pg_stat_activity "
                       "WHERE backend_type = 'eventbox ingest'")
        if len(rows) != 1 or n != 1:
            return None
        return rows[0]

    def counters(self):
        w = self.ingest_worker()
        assert w is not None, "no (single) ingest worker running"
        return {"pid": w[0], "state": w[1], "messages": w[2], "duplicates": w[3],
                "transport_ids": w[4], "errors": w[5]}

    def wait_ingest_worker(self, timeout=120.0, not_pid=None):
        """Waits until exactly one ingest worker runs (other than not_pid); returns its pid."""
        def probe():
            try:
                w = self.ingest_worker()
            except psycopg2.DatabaseError:
                if self._conn is not None:  # e.g. the extension is being created
                    self.close()
                return None
            if w is None or w[0] == not_pid or w[1] == "starting":
                return None
            return w[0]
        return poll(probe, timeout, "an eventbox ingest worker (not pid %s)" % not_pid, 0.2)

    def create_subscription(self, name, topics, **options):
        # These tests check what ingestion stores; handler workers run too, and without
        # unhandled => 'keep' they would mark handler-less rows 'ignored' under the tests' feet.
        options.setdefault("unhandled", "keep")
        args = ["%(name)s", "%(topics)s::text[]"]
        params = {"name": name, "topics": list(topics)}
        for key, value in options.items():
            assert re.fullmatch(r"[a-z_]+", key), key
            args.append("%s => %%(%s)s" % (key, key))
            params[key] = value
        self.rows("SELECT eventbox.create_subscription(%s)" % ", ".join(args), params)

    def alter_subscription(self, name, **options):
        args = ["%(name)s"]
        params = {"name": name}
        for key, value in options.items():
            assert re.fullmatch(r"[a-z_]+", key), key
            cast = "::text[]" if key == "topics" else ""
            args.append("%s => %%(%s)s%s" % (key, key, cast))
            params[key] = value
        self.rows("SELECT eventbox.alter_subscription(%s)" % ", ".join(args), params)

    def drop_subscription(self, name):
        self.rows("SELECT eventbox.drop_subscription(%s)", (name,))

    def inbox_count(self, subscription):
        return self.value("SELECT count(*) FROM eventbox.inbox WHERE subscription = %s",
                          (subscription,))

    def stored_offsets(self, subscription):
        """{(topic, partition): next_offset} of a subscription."""
        return {(t, p): n for t, p, n in self.rows(
            'SELECT topic, "partition", next_offset FROM eventbox.offsets '
            "WHERE subscription = %s", (subscription,))}

    def inbox_rows(self, subscription, columns="*"):
        with self.conn().cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
            cur.execute("SELECT %s FROM eventbox.inbox WHERE subscription = %%s" % columns,
                        (subscription,))
            return [dict(r) for r in cur.fetchall()]

    def wait_rows(self, subscription, n, timeout=60.0):
        """Waits until the subscription has at least n inbox rows; returns the count."""
        state = {"count": None}

        def probe():
            state["count"] = self.inbox_count(subscription)
            return state["count"] >= n

        poll(probe, timeout, lambda: "%d inbox rows of %s (have %s; offsets %r)" % (
            n, subscription, state["count"], self.stored_offsets(subscription)))
        return state["count"]

    def wait_caught_up(self, subscription, ends, timeout=60.0):
        """Waits until eventbox.offsets of `subscription` reach `ends` ({(topic, partition): end
        offset}) for every partition with an end > 0; returns the stored offsets."""
        want = {tp: end for tp, end in ends.items() if end > 0}
        state = {}

        def probe():
            state["stored"] = self.stored_offsets(subscription)
            return all(state["stored"].get(tp) == end for tp, end in want.items())

        deadline = time.monotonic() + timeout
        while not probe():
            if time.monotonic() >= deadline:
                behind = {"%s[%d]" % tp: (state["stored"].get(tp), end)
                          for tp, end in want.items() if state["stored"].get(tp) != end}
                pytest.fail("subscription %s not caught up after %.0f s; (stored next_offset, "
                            "end offset) of the partitions behind: %r; inbox rows: %d"
                            % (subscription, timeout, behind, self.inbox_count(subscription)))
            time.sleep(0.1)
        return state["stored"]

    def setting(self, name):
        return self.value("SELECT setting FROM pg_settings WHERE name = %s", (name,))

    def set_setting(self, name, value, expect):
        """ALTER SYSTEM SET name = value (value None: RESET) and reload; waits until new
        sessions see the setting as `expect` (pg_settings.setting), i.e. until the postmaster
        has re-read the configuration and signalled the workers. Returns the server's clock
        from before the reload (for wait_worker_reloaded)."""
        assert re.fullmatch(r"[a-z_.]+", name), name
        since = self.value("SELECT clock_timestamp()")
        if value is None:
            self.rows("ALTER SYSTEM RESET %s" % name)
        else:
            self.rows("ALTER SYSTEM SET %s = %%s" % name, (str(value),))
        self.rows("SELECT pg_reload_conf()")

        def seen():
            c = connect()
            try:
                with c.cursor() as cur:
                    cur.execute("SELECT setting FROM pg_settings WHERE name = %s", (name,))
                    return cur.fetchone()[0] == str(expect)
            finally:
                c.close()
        poll(seen, 30, "%s = %r in new sessions" % (name, expect))
        return since

    def wait_worker_reloaded(self, since):
        """Waits until the ingest worker reloaded its subscriptions after `since` (a timestamptz
        of the server): eventbox.workers.last_activity moves at every reload, and at nothing
        else while the worker has no records to read."""
        poll(lambda: self.value(
            "SELECT last_activity > %s FROM eventbox.workers WHERE role = 'ingest'", (since,)),
            30, "the ingest worker to reload its configuration")



# ---------------------------------------------------------------------------------------------
# server log and processes


class LogWatch:
    """What the server log ($EVENTBOX_LOG) got since the watch was made."""

    def __init__(self):
        self.path = env("EVENTBOX_LOG")
        self.start = os.path.getsize(self.path)

    def lines(self, pattern=None):
        with open(self.path, "rb") as f:
            f.seek(self.start)
            text = f.read().decode("utf-8", "replace")
        rx = re.compile(pattern) if pattern else None
        return [ln for ln in text.splitlines() if rx is None or rx.search(ln)]

    def crash_lines(self, allowed_pids=()):
        """Crash lines whose "(PID n)" is not in allowed_pids."""
        out = []
        for ln in self.lines():
            if not CRASH_RE.search(ln):
                continue
            m = re.search(r"\(PID (\d+)\)", ln)
            if m and int(m.group(1)) in allowed_pids:
                continue
            out.append(ln)
        return out


def sigkill(pid):
    """SIGKILLs a server process on purpose, after recording its pid in $EVENTBOX_KILLED_PIDS
    (the run's log scan ignores crash lines of those pids)."""
    with open(env("EVENTBOX_KILLED_PIDS"), "a") as f:
        f.write("%d\n" % pid)
        f.flush()
        os.fsync(f.fileno())
    os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# fixtures (imported by both conftest.py files)


@pytest.fixture(scope="session")
def ib_env():
    """The environment, with pg_eventbox created and the ingest worker running."""
    for name in REQUIRED_ENV:
        env(name)
    db = Db()
    try:
        db.rows("CREATE EXTENSION IF NOT EXISTS pg_eventbox")
    except psycopg2.errors.UniqueViolation:
        pass  # created concurrently by another session
    # The launcher starts about 10 s after the test database was created.
    db.wait_ingest_worker(timeout=120)
    db.close()
    return dict(os.environ)


@pytest.fixture
def ib_db(ib_env):
    db = Db()
    yield db
    db.close()


@pytest.fixture(scope="session")
def ib_broker(ib_env):
    b = devbroker()
    assert b.ping() == "pong"
    yield b
    b.close()


@pytest.fixture(scope="session")
def ib_producer(ib_env):
    p = new_producer()
    yield p
    p.close(timeout=10)


@pytest.fixture
def ib_subscriptions(ib_env):
    """create(name, topics, **options) creates a subscription that is dropped after the test
    (so that idle subscriptions of earlier tests do not add to the worker's counters)."""
    db = Db()
    created = []

    def create(name, topics, **options):
        db.create_subscription(name, topics, **options)
        created.append(name)
        return name

    yield create
    for name in created:
        try:
            db.rows_retry("SELECT eventbox.drop_subscription(name) FROM eventbox.subscriptions "
                          "WHERE name = %s", (name,))
        except psycopg2.Error:
            pass
    db.close()


@pytest.fixture
def ib_topic(ib_broker):
    """new(label, partitions) creates a topic with a unique name and returns the name."""
    def new(label, partitions=4):
        name = unique_name(label)
        ib_broker.create_topic(name, partitions)
        return name
    return new


# ---------------------------------------------------------------------------------------------
# many subscriptions: the ingest worker's footprint, an admin role without superuser


def footprint(pid):
    """{fds, rel_fds, threads, rss_kb, anon_kb} of a server process (/proc). rel_fds are the
    fds of relation files (PostgreSQL's file cache: one per relation fork and segment touched, up
    to max_files_per_process); anon_kb (RssAnon) is its private memory: RSS also counts the
    shared buffers it has touched, which grows with the data it reads, not with what it keeps."""
    rel_fds = 0
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if re.search(r"/(base|global)/\d+(/\d+)?(_\w+)?(\.\d+)?$", target):
            rel_fds += 1
    status = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            key, _, value = line.partition(":")
            status[key] = value.strip()
    return {"fds": len(os.listdir("/proc/%d/fd" % pid)), "rel_fds": rel_fds,
            "threads": int(status["Threads"]),
            "rss_kb": int(status["VmRSS"].split()[0]),
            "anon_kb": int(status["RssAnon"].split()[0])}


# The admin role's grants of docs/guide/security.md that the inbox tests need.
ADMIN_GRANTS = """
GRANT USAGE ON SCHEMA eventbox TO {role};
GRANT EXECUTE ON FUNCTION
    eventbox.create_subscription,
    eventbox.alter_subscription,
    eventbox.drop_subscription(text),
    eventbox.register_handler(text, regprocedure, text, name, boolean),
    eventbox.unregister_handler(text, regprocedure, text),
    eventbox.process(text, integer), eventbox.retry(text, text), eventbox.redrive(text, text),
    eventbox.skip(text, text), eventbox.replay(text, text, integer, bigint)
  TO {role};
GRANT SELECT ON eventbox.subscriptions, eventbox.handlers, eventbox.inbox, eventbox.offsets,
                eventbox.inbox_stats, eventbox.lag, eventbox.outbox, eventbox.outbox_stats,
                eventbox.workers, eventbox.subscription_errors TO {role};
GRANT EXECUTE ON FUNCTION eventbox.workers() TO {role};
"""


def admin_role(db, role):
    """Creates (once) a LOGIN role that is no superuser, with the admin grants above."""
    assert re.fullmatch(r"[a-z_0-9]+", role), role
    if not db.value("SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)):
        db.rows("CREATE ROLE %s LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE" % role)
    db.rows(ADMIN_GRANTS.format(role=role))
    return role


def connect_as(role):
    c = psycopg2.connect("", user=role, connect_timeout=10,
                         application_name="eventbox-inbox-tests")
    c.autocommit = True
    return c


def create_subscriptions(conn, names_topics, **options):
    """Creates subscriptions [(name, [topics])] on `conn` (unhandled => 'keep', see
    Db.create_subscription), in one transaction per 50."""
    options.setdefault("unhandled", "keep")
    keys = sorted(options)
    for key in keys:
        assert re.fullmatch(r"[a-z_]+", key), key
    sql = "SELECT eventbox.create_subscription(%s, %s::text[]" + "".join(
        ", %s => %%s" % k for k in keys) + ")"
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            for i, (name, topics) in enumerate(names_topics):
                cur.execute(sql, [name, list(topics)] + [options[k] for k in keys])
                if i % 50 == 49:
                    conn.commit()
        conn.commit()
    finally:
        conn.autocommit = True


def caught_up(db, ends_by_topic, subs_topics):
    """Subscriptions [(name, [topics])] whose stored offsets are not yet the topics' ends."""
    stored = {}
    for sub, topic, p, n in db.rows('SELECT subscription, topic, "partition", next_offset '
                                    "FROM eventbox.offsets"):
        stored[(sub, topic, p)] = n
    behind = []
    for name, topics in subs_topics:
        for t in topics:
            for (topic, p), end in ends_by_topic[t].items():
                if end > 0 and stored.get((name, topic, p)) != end:
                    behind.append(name)
                    break
    return sorted(set(behind))
