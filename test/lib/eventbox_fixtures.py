"""Shared helpers and pytest fixtures for test/integration and test/fault.

The tests run against an environment started by tools/cluster.sh (directly or
through tools/run_tests.sh), whose `env` file has been exported: PGHOST,
PGPORT, PGUSER, PGDATABASE, EVENTBOX_LOG, EVENTBOX_BOOTSTRAP,
EVENTBOX_CONTROL_HOST, EVENTBOX_CONTROL_PORT, EVENTBOX_DEVBROKER,
EVENTBOX_KILLED_PIDS, ...

Kafka is read with an independent client, kafka-python (confluent_kafka is
used as a cross-check in one test). A conftest.py binds the fixtures with
``eventbox_fixtures.bind_fixtures(globals())`` after putting test/lib on sys.path.

Everything here polls with a deadline; nothing asserts on a bare sleep.
"""

import collections
import os
import pathlib
import re
import signal
import sys
import threading
import time
import uuid

import psycopg2
import psycopg2.errors
import pytest

LIB = pathlib.Path(__file__).resolve().parent
if str(LIB) not in sys.path:
    sys.path.insert(0, str(LIB))

from devbroker import DevBroker  # noqa: E402

from kafka import KafkaConsumer, TopicPartition  # noqa: E402  (kafka-python)

__all__ = [
    "Rec", "env", "connect", "query", "query_one", "pending_count",
    "wait_outbox_drained", "read_topic", "wait_for_ids", "relay_pids",
    "wait_relay", "sigkill", "wait_until", "LogWatcher", "StreamSender",
    "count_ids", "java_partition", "report", "pytest_terminal_summary", "pytest_sessionfinish",
    # fixtures
    "eventbox_env", "extension", "conn", "broker", "new_topic", "settings",
    "log_watch", "restore_broker_state",
]


def bind_fixtures(namespace):
    """Binds the names of __all__ (the fixtures and the terminal-summary hook among them) into a
    conftest's namespace, as ``from eventbox_fixtures import *`` would: pytest looks for
    fixtures and hooks among a conftest's names, and pyflakes cannot check a * import."""
    namespace.update((name, globals()[name]) for name in __all__)


# ---------------------------------------------------------------------------
# environment

# Lines of the server log that mean a process crashed (as tools/check_log.sh scans them).
CRASH_RE = re.compile(r"terminated by signal|server process \(PID \d+\) was terminated|"
                      r"PANIC:|TRAP:")


def env(name):
    value = os.environ.get(name)
    if not value:
        pytest.fail("environment variable %s is not set: run through tools/run_tests.sh "
                    "or export the env file written by tools/cluster.sh start" % name)
    return value


def wait_until(predicate, timeout, interval=0.1, what="condition", explain=None):
    """Polls predicate() until it returns a truthy value; returns that value.
    Fails the test with `what` after `timeout` seconds, followed by the text explain() returns
    then, when given (the state as it is at the timeout, for a failure one can name)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            message = "timed out after %.0f s waiting for %s" % (timeout, what)
            if explain is not None:
                message += "\n" + explain()
            pytest.fail(message)
        time.sleep(interval)


# ---------------------------------------------------------------------------
# PostgreSQL


def connect(autocommit=True, timeout=90.0):
    """A new psycopg2 connection to the test database (libpq reads PG* from the
    environment). Retries while the server is starting or recovering, e.g.
    after a crash restart caused by a SIGKILLed worker."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            c = psycopg2.connect("", connect_timeout=10,
                                 application_name="eventbox-tests")
            c.autocommit = autocommit
            return c
        except psycopg2.OperationalError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def query(conn, sql, args=None):
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description is not None else None


def cancel_unsent(conn, topic):
    """A test's cleanup: deletes the topic's outbox rows not sent yet (pending or failed), which
    would otherwise be delivered after it. Sent rows cannot be deleted (they leave with their
    rotated table); a row the relay sends while this runs is deleted as the pending row it was
    read as, or left, never an error."""
    query(conn, "DELETE FROM eventbox.outbox WHERE topic = %s AND status <> 'sent'", (topic,))


def query_one(conn, sql, args=None):
    rows = query(conn, sql, args)
    return rows[0][0] if rows else None


def connection_lost(e):
    """Whether psycopg2 error `e` is a connection lost (the server restarting after a crash):
    refused or closed (OperationalError, InterfaceError), closed under the query, which psycopg2
    may raise as a plain DatabaseError without SQLSTATE (an error the server reported has one),
    or ended by the server's shutdown (57P01-57P03)."""
    if isinstance(e, (psycopg2.OperationalError, psycopg2.InterfaceError)):
        return True
    return isinstance(e, psycopg2.DatabaseError) and (e.pgcode is None
                                                      or e.pgcode.startswith("57P"))


def with_fresh_connection(fn, timeout=90.0, connect_fn=None):
    """Runs fn(conn) on a short-lived connection (connect_fn(timeout=...), this environment's
    cluster by default), retrying across crash restarts."""
    deadline = time.monotonic() + timeout
    while True:
        c = None
        try:
            c = (connect_fn or connect)(timeout=max(1.0, deadline - time.monotonic()))
            return fn(c)
        except psycopg2.Error as e:
            if not connection_lost(e) or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)
        finally:
            if c is not None:
                try:
                    c.close()
                except Exception:
                    pass


def settled_below(conn):
    """The relay's settled position W (0 before the relay stored one)."""
    return query_one(conn, "SELECT coalesce((SELECT settled_below FROM eventbox.outbox_state "
                           "WHERE n = -1), 0)")


def pending_count(topic=None, conn=None):
    sql = "SELECT count(*) FROM eventbox.outbox WHERE status = 'pending'"
    args = None
    if topic is not None:
        sql += " AND topic = %s"
        args = (topic,)
    if conn is not None:
        return query_one(conn, sql, args)
    return with_fresh_connection(lambda c: query_one(c, sql, args))


def wait_outbox_drained(topic=None, timeout=120.0):
    """Waits until no row of `topic` (any topic when None) is pending in the outbox."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = pending_count(topic)
        if last == 0:
            return
        if time.monotonic() >= deadline:
            failed = with_fresh_connection(lambda c: query(
                c, "SELECT status, count(*), max(attempts), max(last_error) "
                   "FROM eventbox.outbox WHERE %s IS NULL OR topic = %s GROUP BY status",
                (topic, topic)))
            pytest.fail("outbox still has %s pending row(s) for topic %s after %.0f s: %r"
                        % (last, topic, timeout, failed))
        time.sleep(0.1)


def relay_pids(conn=None):
    sql = ("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventbox relay' "
           "ORDER BY pid")
    if conn is not None:
        return [r[0] for r in query(conn, sql)]
    return with_fresh_connection(lambda c: [r[0] for r in query(c, sql)])


def wait_relay(timeout=90.0, not_pid=None):
    """Waits until exactly one relay runs (per pg_stat_activity and
    eventbox.workers, state 'running') whose pid differs from not_pid;
    returns its pid."""
    def probe(c):
        pids = relay_pids(c)
        if len(pids) != 1 or pids[0] == not_pid:
            return None
        rows = query(c, "SELECT pid, state FROM eventbox.workers WHERE role = 'relay'")
        if rows != [(pids[0], "running")]:
            return None
        return pids[0]

    deadline = time.monotonic() + timeout
    while True:
        try:
            pid = with_fresh_connection(probe, timeout=max(1.0, deadline - time.monotonic()))
        except (psycopg2.OperationalError, psycopg2.InterfaceError):
            pid = None
        except psycopg2.Error:
            # e.g. the extension is being created by another session
            pid = None
        if pid:
            return pid
        if time.monotonic() >= deadline:
            state = with_fresh_connection(lambda c: (
                query(c, "SELECT pid, backend_type FROM pg_stat_activity "
                         "WHERE backend_type LIKE 'eventbox%%'"),
                query(c, "SELECT * FROM eventbox.workers")))
            pytest.fail("no running eventbox relay (other than pid %s) after %.0f s: %r"
                        % (not_pid, timeout, state))
        time.sleep(0.2)


def sigkill(pid):
    """SIGKILLs a server process on purpose, after recording its pid in
    $EVENTBOX_KILLED_PIDS so the log scan does not report the crash."""
    path = env("EVENTBOX_KILLED_PIDS")
    with open(path, "a") as f:
        f.write("%d\n" % pid)
        f.flush()
        os.fsync(f.fileno())
    os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------
# Kafka (kafka-python)

# One record as read back: headers as a list of (name, bytes) pairs.
Rec = collections.namedtuple(
    "Rec", "topic partition offset key value headers message_id")


def _rec(r):
    mid = None
    for name, value in r.headers or ():
        if name == "message_id":
            mid = value.decode()
    return Rec(r.topic, r.partition, r.offset, r.key, r.value, list(r.headers or ()), mid)


def read_topic(topic, bootstrap=None, timeout=120.0, missing_ok=False):
    """Reads the whole topic (every partition from the beginning up to the end
    offsets found when reading starts) with kafka-python; returns a list of Rec
    in (partition, offset) order. With missing_ok, a topic the broker does not
    know yields []."""
    bootstrap = bootstrap or env("EVENTBOX_BOOTSTRAP")
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             client_id="eventbox-tests", max_poll_records=5000,
                             fetch_max_bytes=16 * 1024 * 1024,
                             max_partition_fetch_bytes=8 * 1024 * 1024,
                             request_timeout_ms=30000)
    try:
        deadline = time.monotonic() + timeout
        parts = None
        while True:
            parts = consumer.partitions_for_topic(topic)
            if parts or missing_ok or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if not parts:
            if missing_ok:
                return []
            pytest.fail("topic %s not found on %s" % (topic, bootstrap))
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        out = []
        while any(consumer.position(tp) < end[tp] for tp in tps):
            if time.monotonic() >= deadline:
                pytest.fail("reading %s: end offsets %r not reached in %.0f s (got %d records)"
                            % (topic, end, timeout, len(out)))
            for _tp, records in consumer.poll(timeout_ms=500).items():
                out.extend(_rec(r) for r in records)
        out.sort(key=lambda r: (r.partition, r.offset))
        return out
    finally:
        consumer.close(autocommit=False)


def wait_for_ids(topic, ids, timeout=60.0, bootstrap=None):
    """Re-reads a (small) topic until every message id in `ids` is in it;
    returns the records."""
    want = set(str(i) for i in ids)
    deadline = time.monotonic() + timeout
    while True:
        recs = read_topic(topic, bootstrap=bootstrap, timeout=max(5.0, deadline - time.monotonic()),
                          missing_ok=True)
        if want <= {r.message_id for r in recs}:
            return recs
        if time.monotonic() >= deadline:
            missing = want - {r.message_id for r in recs}
            pytest.fail("%d message(s) not in topic %s after %.0f s, e.g. %s"
                        % (len(missing), topic, timeout, sorted(missing)[:5]))
        time.sleep(0.2)


def count_ids(recs, expected_ids):
    """Returns (lost, duplicates, unexpected) for records against expected ids:
    lost = expected ids never seen, duplicates = extra copies of seen ids,
    unexpected = ids seen that were not expected."""
    counts = collections.Counter(r.message_id for r in recs)
    expected = set(str(i) for i in expected_ids)
    lost = len(expected - set(counts))
    dups = sum(n - 1 for n in counts.values() if n > 1)
    unexpected = len(set(counts) - expected)
    return lost, dups, unexpected


def java_partition(key, partitions):
    """The partition Kafka's Java default partitioner picks for a key."""
    from kafka.partitioner.default import murmur2
    return (murmur2(key) & 0x7FFFFFFF) % partitions


# ---------------------------------------------------------------------------
# figures reported at the end of the run (lost / duplicated counts)

_REPORTS = []


def report(test, **figures):
    """Records figures of a test; printed now (seen with -s) and in the
    terminal summary of the run (seen with -q too)."""
    line = "%s: %s" % (test, ", ".join("%s=%s" % kv for kv in figures.items()))
    _REPORTS.append(line)
    print("REPORT " + line)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # Both conftests import this hook: print once per run.
    if getattr(config, "_eventbox_reported", False):
        return
    config._eventbox_reported = True
    if _REPORTS:
        terminalreporter.section("eventbox figures (lost / duplicated)")
        for line in _REPORTS:
            terminalreporter.write_line(line)


def pytest_sessionfinish(session, exitstatus):
    # Clusters of their own (test/lib/clusters.py) keep their data only when something failed.
    clusters = sys.modules.get("clusters")
    if clusters is not None and exitstatus == 0:
        clusters.remove_stopped_data()


# ---------------------------------------------------------------------------
# server log


class LogWatcher:
    """Reads what the server log ($EVENTBOX_LOG) got since the watcher was made."""

    def __init__(self, path=None):
        self.path = path or env("EVENTBOX_LOG")
        self.start = os.path.getsize(self.path)

    def text(self):
        with open(self.path, "rb") as f:
            f.seek(self.start)
            return f.read().decode("utf-8", "replace")

    def lines(self, pattern=None):
        rx = re.compile(pattern) if pattern else None
        return [ln for ln in self.text().splitlines() if rx is None or rx.search(ln)]

    def wait_for(self, pattern, timeout=60.0, count=1):
        """Waits until at least `count` new lines match the regex; returns them."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            found = [ln for ln in self.text().splitlines() if rx.search(ln)]
            if len(found) >= count:
                return found
            if time.monotonic() >= deadline:
                tail = "\n".join(self.text().splitlines()[-30:])
                pytest.fail("log line /%s/ (x%d) not seen within %.0f s; new log lines:\n%s"
                            % (pattern, count, timeout, tail))
            time.sleep(0.1)

    def mark(self):
        """Moves the start to the current end of the log."""
        self.start = os.path.getsize(self.path)


# ---------------------------------------------------------------------------
# a crash-tolerant background sender


class StreamSender(threading.Thread):
    """Sends `total` JSON messages to `topic` in transactions of `batch` rows,
    with client-chosen message ids, over `keys` keys. Survives server crash
    restarts: a batch interrupted by a lost connection is sent again with the
    same ids; a unique violation then means the earlier attempt did commit
    (its rows are still in the outbox). `pause` seconds between batches pace
    the stream so that faults hit it mid-way."""

    def __init__(self, topic, total, batch=250, keys=200, pause=0.0, timeout=180.0):
        super().__init__(daemon=True, name="eventbox-sender-%s" % topic)
        self.topic = topic
        self.total = total
        self.batch = batch
        self.keys = keys
        self.pause = pause
        self.timeout = timeout
        self.ids = [str(uuid.uuid4()) for _ in range(total)]
        self.committed = 0          # rows in batches known to be committed
        self.reconnects = 0
        self.ambiguous = 0          # batches found already committed on retry
        self.error = None
        self.stop_flag = threading.Event()
        self._lock = threading.Lock()

    def run(self):
        conn = None
        i = 0
        deadline = time.monotonic() + self.timeout
        try:
            while i < self.total and not self.stop_flag.is_set():
                j = min(i + self.batch, self.total)
                seqs = list(range(i, j))
                keys = ["k%d" % (s % self.keys) for s in seqs]
                mids = self.ids[i:j]
                try:
                    if conn is None:
                        conn = connect(autocommit=False)
                    with conn.cursor() as cur:
                        cur.execute(
                            "SELECT count(eventbox.send(%s, jsonb_build_object('seq', u.s, "
                            "'key', u.k), key => u.k, message_id => u.m)) "
                            "FROM unnest(%s::int[], %s::text[], %s::uuid[]) AS u(s, k, m)",
                            (self.topic, seqs, keys, mids))
                        n = cur.fetchone()[0]
                        assert n == len(seqs), n
                    conn.commit()
                except psycopg2.errors.UniqueViolation:
                    # An earlier attempt of this batch whose COMMIT reply was lost did commit.
                    conn.rollback()
                    self.ambiguous += 1
                except psycopg2.Error as e:
                    # A lost connection (crash restart), or a connection already closed.
                    lost = connection_lost(e) or conn is None or conn.closed
                    if not lost or time.monotonic() >= deadline:
                        raise
                    try:
                        if conn is not None:
                            conn.close()
                    except Exception:
                        pass
                    conn = None
                    self.reconnects += 1
                    time.sleep(0.1)
                    continue
                with self._lock:
                    self.committed = j
                i = j
                if self.pause:
                    time.sleep(self.pause)
        except BaseException as e:  # reported by the test through .error
            self.error = e
        finally:
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass

    def wait_committed(self, n, timeout=120.0):
        wait_until(lambda: self.committed >= n or not self.is_alive(), timeout,
                   what="sender to commit %d rows" % n)
        if self.error is not None:
            raise self.error
        assert self.committed >= n, "sender stopped at %d rows" % self.committed

    def finish(self, timeout=180.0):
        self.join(timeout)
        assert not self.is_alive(), "sender still running after %.0f s" % timeout
        if self.error is not None:
            raise self.error
        assert self.committed == self.total, (self.committed, self.total)


# ---------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="session")
def eventbox_env():
    for name in ("PGHOST", "PGPORT", "PGDATABASE", "EVENTBOX_LOG", "EVENTBOX_BOOTSTRAP",
                 "EVENTBOX_CONTROL_PORT", "EVENTBOX_KILLED_PIDS", "EVENTBOX_DEVBROKER"):
        env(name)
    return dict(os.environ)


@pytest.fixture(scope="session")
def extension(eventbox_env):
    """Creates pg_eventbox in the test database and waits for the relay."""
    c = connect()
    try:
        query(c, "CREATE EXTENSION IF NOT EXISTS pg_eventbox")
    finally:
        c.close()
    # The launcher may still be in its restart delay (it starts before the
    # test database exists): allow for that.
    wait_relay(timeout=90)
    return True


@pytest.fixture
def conn(extension):
    """An autocommit connection, closed after the test."""
    c = connect()
    yield c
    try:
        c.close()
    except Exception:
        pass


@pytest.fixture(scope="session")
def broker(eventbox_env):
    """Control client of the environment's dev broker."""
    b = DevBroker(os.environ.get("EVENTBOX_CONTROL_HOST") or "127.0.0.1",
                  int(env("EVENTBOX_CONTROL_PORT")))
    assert b.ping() == "pong"
    yield b
    b.close()


@pytest.fixture
def restore_broker_state(broker):
    """Brings every broker back up and drops unused injected errors after the test."""
    yield broker
    broker.broker_up("all")
    for api in (0, 3):
        broker.clear_errors(api)


@pytest.fixture
def new_topic(request, broker):
    """new_topic(partitions=8, ctl=None) -> a fresh, uniquely named topic
    created on the environment's broker (or the broker of `ctl`)."""
    base = re.sub(r"[^A-Za-z0-9]+", "_", request.node.name)[:60].strip("_")

    def make(partitions=8, ctl=None, suffix=""):
        name = "t_%s%s_%s" % (base, suffix, uuid.uuid4().hex[:8])
        (ctl or broker).create_topic(name, partitions)
        return name

    return make


class Settings:
    """ALTER SYSTEM with a guaranteed reset: every name set is reset (and the
    configuration reloaded) when the test ends, and the test waits until a new
    session sees the original value again. On this environment's cluster, or on
    the one connect_fn(timeout=...) connects to (clusters.Cluster.connect)."""

    def __init__(self, connect_fn=None):
        self.original = {}
        self.connect = connect_fn or connect

    def current(self, name):
        return with_fresh_connection(
            lambda c: query_one(c, "SELECT current_setting(%s)", (name,)),
            connect_fn=self.connect)

    def set(self, name, value, shown=None):
        """Sets `name` to `value` and reloads; waits until a new session shows
        `shown` (default: `value`, so pass values in their SHOW form, e.g. '1h')."""
        if name not in self.original:
            self.original[name] = self.current(name)
        c = self.connect()
        try:
            with c.cursor() as cur:
                cur.execute("ALTER SYSTEM SET %s = %%s" % name, (str(value),))
                cur.execute("SELECT pg_reload_conf()")
        finally:
            c.close()
        self.wait_shown(name, str(value) if shown is None else shown)

    def reset(self, name):
        c = self.connect()
        try:
            with c.cursor() as cur:
                cur.execute("ALTER SYSTEM RESET %s" % name)
                cur.execute("SELECT pg_reload_conf()")
        finally:
            c.close()
        if name in self.original:
            self.wait_shown(name, self.original.pop(name))

    def wait_shown(self, name, shown, timeout=30.0):
        """New backends are forked by the postmaster after it re-read the files
        and signalled its children: once one shows the value, every worker has
        been sent SIGHUP."""
        wait_until(lambda: self.current(name) == shown, timeout,
                   what="%s to read %r after reload" % (name, shown))

    def restore(self):
        for name in list(self.original):
            self.reset(name)


@pytest.fixture
def settings(extension):
    s = Settings()
    yield s
    s.restore()


@pytest.fixture
def log_watch():
    return LogWatcher()
