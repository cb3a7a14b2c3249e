"""The environment tools/cluster.sh started: its env file, connections to its database, its dev
broker and its processes."""

import os
import sys
import time

import psycopg2

from .common import REPO
from .proc import children_of

sys.path.insert(0, os.path.join(REPO, "test", "lib"))
from devbroker import DevBroker  # noqa: E402


def read_env_file(env_dir):
    """The variables of the env file tools/cluster.sh wrote into env_dir, as a dict."""
    vals = {}
    with open(os.path.join(env_dir, "env")) as f:
        for line in f:
            line = line.strip()
            if line.startswith("export "):
                line = line[len("export "):]
            if "=" in line:
                k, _, v = line.partition("=")
                vals[k] = v.strip("'\"")
    return vals


class Env:
    """A running environment: PostgreSQL (dsn, postmaster pid) and the dev broker (bootstrap
    servers, control connection, pid)."""

    def __init__(self, env_dir):
        self.dir = env_dir
        self.vals = vals = read_env_file(env_dir)
        self.bootstrap = vals["EVENTBOX_BOOTSTRAP"]
        self.dsn = "host=%s port=%s user=%s dbname=%s" % (
            vals["PGHOST"], vals["PGPORT"], vals["PGUSER"], vals["PGDATABASE"])
        self.broker = DevBroker(vals["EVENTBOX_CONTROL_HOST"] or "127.0.0.1",
                                vals["EVENTBOX_CONTROL_PORT"])
        with open(os.path.join(env_dir, "broker.pid")) as f:
            self.broker_pid = int(f.readline())
        with open(os.path.join(vals["EVENTBOX_DATADIR"], "postmaster.pid")) as f:
            self.postmaster_pid = int(f.readline())

    def connect(self, autocommit=True):
        conn = psycopg2.connect(self.dsn, application_name="eventbox-bench")
        conn.autocommit = autocommit
        return conn

    def connect_retrying(self, timeout=120):
        """(connection, cursor), autocommit, retried while the cluster restarts after a
        crash."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                conn = self.connect()
                cur = conn.cursor()
                cur.execute("SELECT 1")
                return conn, cur
            except psycopg2.Error:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def pg_pids(self):
        """The postmaster and its children."""
        return [self.postmaster_pid] + children_of(self.postmaster_pid)


def q1(cur, sql, args=None):
    """The first column of the first row of a query, or None without a row."""
    cur.execute(sql, args)
    row = cur.fetchone()
    return row[0] if row else None
