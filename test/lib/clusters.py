"""Clusters of a test's own, for the tests that need more than the run's shared cluster: the
upgrade, dump/restore and lifecycle tests (test/integration/upgrade) and the failover test
(test/fault/test_fault_failover.py).

Unlike the other tests these do not use the run's shared cluster: each test starts
the clusters it needs with tools/cluster.sh (or, for pg_upgrade's target, initdb) in fresh
directories under /tmp, on ports 54462-54479 (EVENTBOX_TEST_PORTS=FIRST-LAST for two runs at
once on one machine), and always stops them. Every PostgreSQL binary
comes from $EVENTBOX_PGBIN. One dev broker is started for the whole folder and all clusters
point eventbox.brokers at it (EVENTBOX_NO_BROKER=1 for cluster.sh), so that a cluster made from
another one (pg_upgrade, pg_restore) finds the same topics and offsets.

Kafka is written and read with kafka-python, independent of the extension's librdkafka.
Everything polls with a deadline; nothing asserts on a bare sleep.
"""

import glob
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import psycopg2
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO / "test" / "lib") not in sys.path:
    sys.path.insert(0, str(REPO / "test" / "lib"))

import devbroker  # noqa: E402
from devbroker import DevBroker  # noqa: E402
from eventbox_fixtures import (CRASH_RE, Settings, count_ids, read_topic,  # noqa: E402,F401
                               report, settled_below, wait_until)

from kafka import KafkaProducer  # noqa: E402  (kafka-python)

PGBIN = os.environ.get("EVENTBOX_PGBIN") or "/usr/lib/postgresql/15/bin"
CLUSTER_SH = REPO / "tools" / "cluster.sh"
DEVBROKER_BIN = os.environ.get("EVENTBOX_DEVBROKER") or str(
    REPO / "tools" / "devbroker" / "eventbox-devbroker")


def _port_range(text):
    first, last = (int(p) for p in text.split("-"))
    return range(first, last + 1)


# A port another run takes between a cluster's stop and its restart fails that restart.
PORTS = _port_range(os.environ.get("EVENTBOX_TEST_PORTS") or "54462-54479")
WORKER_TYPES = ("eventbox relay", "eventbox ingest", "eventbox handler")

__all__ = [
    "PGBIN", "Cluster", "Kafka", "Settings", "count_ids", "read_topic", "report", "settled_below",
    "wait_until", "query",
    "query_one", "worker_counts", "wait_workers", "wait_settled", "as_postgres", "HANDLER_DDL",
    "Elapsed", "duplicates", "WORKER_TYPES",
]

_ports_taken = set()


def port_free(port):
    """Whether nothing listens on loopback `port`."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _take_port():
    for p in PORTS:
        if p not in _ports_taken and port_free(p):
            _ports_taken.add(p)
            return p
    pytest.fail("no free port in %d-%d" % (PORTS[0], PORTS[-1]))


def _tool_env():
    """The environment for PostgreSQL tools: none of the run's PG* settings (they name the
    shared cluster), EVENTBOX_PGBIN for cluster.sh."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    e["EVENTBOX_PGBIN"] = PGBIN
    e["EVENTBOX_NO_BROKER"] = "1"
    # The tests' own clusters use the shared dev broker and no RabbitMQ (a node costs ~6 s).
    e["EVENTBOX_NO_RABBITMQ"] = "1"
    e.pop("EVENTBOX_PRELOAD", None)
    return e


def as_postgres(args, cwd, check=True, timeout=300):
    """Runs a command as the postgres OS user (when we are root) from `cwd`; returns the
    CompletedProcess with stdout and stderr merged into .stdout."""
    if os.geteuid() == 0:
        args = ["runuser", "-u", "postgres", "--"] + list(args)
    p = subprocess.run(args, cwd=cwd, env=_tool_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if check and p.returncode != 0:
        pytest.fail("%s failed (exit %d):\n%s" % (" ".join(args), p.returncode, p.stdout[-4000:]))
    return p


def query(conn, sql, args=None):
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description is not None else None


def query_one(conn, sql, args=None):
    rows = query(conn, sql, args)
    return rows[0][0] if rows else None


class Elapsed:
    def __init__(self):
        self.t0 = time.monotonic()

    def __call__(self):
        return time.monotonic() - self.t0


# Directories of the clusters stopped in this session: their data directories go once every
# test passed (remove_stopped_data()); after a failure all of it stays for reading.
_stopped_dirs = []


def remove_stopped_data():
    """Removes DIR/data of every cluster stopped in this session (the logs stay), unless
    EVENTBOX_KEEP is set. Called by the test session's end hook when every test passed: a
    cluster directory is tens of MB, and repeated runs would fill /tmp."""
    if os.environ.get("EVENTBOX_KEEP"):
        return
    while _stopped_dirs:
        shutil.rmtree(os.path.join(_stopped_dirs.pop(), "data"), ignore_errors=True)


class Cluster:
    """One PostgreSQL cluster in its own directory: DIR/data, DIR/postgres.log, socket in DIR."""

    def __init__(self, name, port=None):
        self.dir = tempfile.mkdtemp(prefix="eb-%s." % name, dir="/tmp")
        self.name = name
        self.port = port or _take_port()
        self.db = None
        self.started = False
        self._log_mark = 0

    @property
    def datadir(self):
        return os.path.join(self.dir, "data")

    @property
    def log(self):
        return os.path.join(self.dir, "postgres.log")

    def start(self, db="app", conf=(), brokers=""):
        """tools/cluster.sh start: initdb, workers preloaded, eventbox.database = db (created
        unless it is postgres), eventbox.brokers = brokers."""
        args = [str(CLUSTER_SH), "start", self.dir, "--port", str(self.port), "--db", db,
                "--conf", "eventbox.brokers=%s" % _conf_quote(brokers)]
        for c in conf:
            args += ["--conf", c]
        p = subprocess.run(args, env=_tool_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=180)
        self.started = True     # cluster.sh cleans up after a failed start; stop is harmless
        if p.returncode != 0:
            pytest.fail("cluster.sh start %s failed:\n%s" % (self.dir, p.stdout[-4000:]))
        self.db = db
        return self

    def initdb(self, conf=()):
        """initdb only (as cluster.sh does it), for pg_upgrade's target; `conf` lines and the
        port / socket settings are appended to postgresql.conf."""
        os.chmod(self.dir, 0o755)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        as_postgres([os.path.join(PGBIN, "initdb"), "-D", self.datadir, "-U", "postgres",
                     "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"], cwd=self.dir)
        with open(os.path.join(self.datadir, "postgresql.conf"), "a") as f:
            f.write("\n# ---- added by test/integration/upgrade ----\n")
            f.write("port = %d\nunix_socket_directories = '%s'\nlisten_addresses = '127.0.0.1'\n"
                    % (self.port, self.dir))
            f.write("logging_collector = off\nlog_line_prefix = '%m [%p] %b '\n"
                    "max_worker_processes = 32\n")
            for c in conf:
                f.write(c + "\n")
        return self

    def pg_ctl_start(self):
        self.started = True
        # -c as tools/cluster.sh: a crash leaves a core file in the data directory.
        as_postgres([os.path.join(PGBIN, "pg_ctl"), "-D", self.datadir, "-c", "-l", self.log,
                     "-w", "-t", "60", "start"], cwd=self.dir)

    def pg_ctl_stop(self, mode="fast"):
        as_postgres([os.path.join(PGBIN, "pg_ctl"), "-D", self.datadir, "-m", mode, "-w",
                     "-t", "60", "stop"], cwd=self.dir)

    def stop(self):
        if not self.started:
            return
        subprocess.run([str(CLUSTER_SH), "stop", self.dir], env=_tool_env(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        _ports_taken.discard(self.port)
        _stopped_dirs.append(self.dir)

    def connect(self, dbname=None, autocommit=True, timeout=30.0):
        deadline = time.monotonic() + timeout
        while True:
            try:
                c = psycopg2.connect(host=self.dir, port=self.port, user="postgres",
                                     dbname=dbname or self.db or "postgres", connect_timeout=10,
                                     application_name="eventbox-upgrade-tests")
                c.autocommit = autocommit
                return c
            except psycopg2.OperationalError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def sql(self, sql, args=None, dbname=None):
        """Runs one statement on a short-lived connection; returns its rows."""
        c = self.connect(dbname)
        try:
            return query(c, sql, args)
        finally:
            c.close()

    def tool(self, name, *args, check=True, timeout=300):
        """Runs a PostgreSQL client program of $EVENTBOX_PGBIN against this cluster."""
        argv = [os.path.join(PGBIN, name), "-h", self.dir, "-p", str(self.port), "-U", "postgres"]
        argv += list(args)
        p = subprocess.run(argv, env=_tool_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=timeout)
        if check and p.returncode != 0:
            pytest.fail("%s failed (exit %d):\n%s" % (" ".join(argv), p.returncode,
                                                       p.stderr[-4000:]))
        return p

    def log_text(self):
        try:
            with open(self.log, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def log_lines(self, pattern, since_mark=False):
        text = self.log_text()
        if since_mark:
            text = text[self._log_mark:]
        rx = re.compile(pattern)
        return [ln for ln in text.splitlines() if rx.search(ln)]

    def mark_log(self):
        self._log_mark = len(self.log_text())

    def wait_log(self, pattern, timeout=30.0, since_mark=False):
        return wait_until(lambda: self.log_lines(pattern, since_mark), timeout,
                          what="log line /%s/ in %s" % (pattern, self.log))

    def crash_lines(self):
        """The log's crash lines, then the core files the crashes left (pg_ctl -c)."""
        lines = [ln for ln in self.log_text().splitlines() if CRASH_RE.search(ln)]
        if lines:
            lines += ["core file: %s" % p for p in sorted(glob.glob(self.datadir + "/core*"))]
        return lines


def _conf_quote(value):
    return "'%s'" % value.replace("'", "''")


class Kafka:
    """The folder's dev broker: bootstrap address, control client, topics, a kafka-python
    producer and reader."""

    def __init__(self, logdir):
        self.logfile = open(os.path.join(logdir, "broker.log"), "wb")
        self.proc, self.bootstrap, host, port = devbroker.start(
            DEVBROKER_BIN, partitions=4, stderr=self.logfile)
        self.ctl = DevBroker(host, port)
        self._producer = None

    def close(self):
        if self._producer is not None:
            self._producer.close(timeout=10)
        self.ctl.close()
        devbroker.stop(self.proc)
        self.logfile.close()

    def topic(self, base, partitions=4):
        name = "%s_%s" % (base, uuid.uuid4().hex[:8])
        self.ctl.create_topic(name, partitions)
        return name

    def produce(self, topic, records, timeout=60.0):
        """records: (message_id, partition, key, payload dict, event_type); waits for every
        acknowledgement; returns the (partition, offset) of each."""
        if self._producer is None:
            self._producer = KafkaProducer(
                bootstrap_servers=self.bootstrap, acks="all", linger_ms=5, retries=5,
                max_in_flight_requests_per_connection=1, client_id="eventbox-upgrade-tests")
        futures = []
        for mid, partition, key, payload, event_type in records:
            headers = [("message_id", mid.encode())]
            if event_type is not None:
                headers.append(("event_type", event_type.encode()))
            futures.append(self._producer.send(
                topic, value=json.dumps(payload).encode(),
                key=None if key is None else key.encode(), partition=partition, headers=headers))
        self._producer.flush(timeout=timeout)
        return [(m.partition, m.offset) for m in (f.get(timeout=timeout) for f in futures)]

    def read(self, topic, timeout=60.0):
        return read_topic(topic, bootstrap=self.bootstrap, timeout=timeout, missing_ok=True)

    def wait_ids(self, topic, ids, timeout=30.0):
        """Re-reads `topic` until every id in `ids` is in it; returns the records."""
        want = {str(i) for i in ids}
        last = []

        def probe():
            nonlocal last
            last = self.read(topic)
            return want <= {r.message_id for r in last}

        wait_until(probe, timeout, interval=0.3,
                   what="%d message ids in topic %s" % (len(want), topic))
        return last


def worker_counts(conn):
    """{backend_type: count} of the relay, ingest and handler workers running."""
    return dict(query(conn, "SELECT backend_type, count(*) FROM pg_stat_activity "
                            "WHERE backend_type = ANY (%s) GROUP BY 1", (list(WORKER_TYPES),)))


def wait_workers(cluster, timeout=30.0, handlers=2, dbname=None):
    """Waits until one relay, one ingest and `handlers` handler workers run (and show in
    eventbox.workers); returns the seconds it took."""
    el = Elapsed()
    want = {"eventbox relay": 1, "eventbox ingest": 1}
    if handlers:
        want["eventbox handler"] = handlers

    def probe():
        c = cluster.connect(dbname)
        try:
            if worker_counts(c) != want:
                return False
            # and each has attached to the shared state (its state depends on its work)
            return query_one(c, "SELECT count(*) FROM eventbox.workers w JOIN pg_stat_activity a "
                                "USING (pid) WHERE a.backend_type = ANY (%s)",
                             (list(WORKER_TYPES),)) == sum(want.values())
        except psycopg2.Error:
            return False
        finally:
            c.close()

    wait_until(probe, timeout, interval=0.1, what="eventbox workers %r in %s" % (want, cluster.dir))
    return el()


def wait_settled(conn, sub, expected, timeout=60.0):
    """Waits until `sub` holds `expected` inbox rows, none received or retry; returns
    {status: count}."""
    deadline = time.monotonic() + timeout
    while True:
        last = dict(query(conn, "SELECT status, count(*) FROM eventbox.inbox "
                                "WHERE subscription = %s GROUP BY 1", (sub,)))
        if (sum(last.values()) == expected and not last.get("received")
                and not last.get("retry")):
            return last
        if time.monotonic() >= deadline:
            pytest.fail("subscription %s not settled at %d rows after %.0f s: %r"
                        % (sub, expected, timeout, last))
        time.sleep(0.2)


# A handler: one row per run in shop.handled (with the role it ran as), and one output message
# per run through the outbox (consume -> handle -> produce in one transaction).
HANDLER_DDL = """
CREATE SCHEMA shop;
CREATE TABLE shop.handled (message_id text NOT NULL, ran_as name NOT NULL,
                           attempt int NOT NULL, out_id uuid NOT NULL,
                           at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION shop.on_order(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    out_id uuid;
BEGIN
    out_id := eventbox.send('{out}', jsonb_build_object('in', msg.message_id),
                            headers => jsonb_build_object('in', msg.message_id));
    INSERT INTO shop.handled (message_id, ran_as, attempt, out_id)
    VALUES (msg.message_id, current_user, msg.attempts, out_id);
END $$;
GRANT USAGE ON SCHEMA shop TO {role};
GRANT INSERT, SELECT ON shop.handled TO {role};
GRANT USAGE ON SCHEMA eventbox TO {role};
GRANT EXECUTE ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid) TO {role};
"""


def duplicates(counter):
    """The keys of a Counter seen more than once."""
    return {k: n for k, n in counter.items() if n > 1}
