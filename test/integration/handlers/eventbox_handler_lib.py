"""Helpers and fixtures of the handler tests (test/integration/handlers and
test/fault/handlers): Kafka -> eventbox.inbox -> registered SQL handlers run by
the handler background workers.

Messages are produced with kafka-python (an independent client), with headers
`message_id` and `event_type`; outputs are read back with kafka-python too.
Each test makes its own topic (devbroker), its own subscription, its own
schema holding the handler and the tables it writes, and runs the handler as a
non-superuser role (`eb_handler_role`) granted exactly what it needs.

Everything polls with a deadline; nothing asserts on a bare sleep.
"""

import collections
import json
import re
import time
import uuid

import psycopg2
import pytest

from kafka import KafkaProducer

from eventbox_fixtures import connect, env, query, query_one, with_fresh_connection

RUN_AS = "eb_handler_role"

__all__ = [
    "RUN_AS", "Msg", "Producer", "produce", "handler_pids", "wait_workers", "HandlerCase",
    "inbox_status", "wait_settled", "ledger_figures", "duplicate_runs", "show_duplicates",
    "retry_conn", "handler_env", "case", "ScratchDatabase", "explained_process", "plan_scans",
]

# ---------------------------------------------------------------------------
# Kafka side


class Msg(collections.namedtuple("Msg", "mid partition key payload event_type")):
    """One record to produce: message id (header), explicit partition, key
    (str or None), JSON payload (dict), event_type header (or None)."""


class Producer:
    """A kafka-python producer; send() produces Msg records in order, waits for
    every acknowledgement and returns how many were sent. Records of one
    partition keep the order given (one in-flight request per connection)."""

    def __init__(self, bootstrap=None):
        self.producer = KafkaProducer(
            bootstrap_servers=bootstrap or env("EVENTBOX_BOOTSTRAP"), acks="all", linger_ms=5,
            batch_size=256 * 1024, max_in_flight_requests_per_connection=1, retries=5,
            client_id="eventbox-handler-tests", request_timeout_ms=30000)

    def send(self, topic, msgs, timeout=120.0):
        futures = []
        for m in msgs:
            headers = [("message_id", m.mid.encode())]
            if m.event_type is not None:
                headers.append(("event_type", m.event_type.encode()))
            futures.append(self.producer.send(
                topic, value=json.dumps(m.payload).encode(),
                key=None if m.key is None else m.key.encode(),
                partition=m.partition, headers=headers))
        self.producer.flush(timeout=timeout)
        for f in futures:
            f.get(timeout=timeout)
        return len(futures)

    def close(self):
        self.producer.close(timeout=10)


def produce(topic, msgs, bootstrap=None, timeout=120.0):
    """Produces `msgs` (iterable of Msg) in order with a new Producer."""
    p = Producer(bootstrap)
    try:
        return p.send(topic, msgs, timeout)
    finally:
        p.close()


# ---------------------------------------------------------------------------
# PostgreSQL side


def retry_conn(fn, timeout=120.0):
    """Runs fn(conn) on a fresh connection, retrying across crash restarts."""
    return with_fresh_connection(fn, timeout)


def handler_pids(c):
    return [r[0] for r in query(c, "SELECT pid FROM pg_stat_activity "
                                   "WHERE backend_type = 'eventbox handler' ORDER BY pid")]


def wait_workers(timeout=120.0, not_pids=()):
    """Waits until eventbox.handler_workers handler workers, one ingest and one
    relay run (pg_stat_activity) and the handlers report 'running' in
    eventbox.workers; none of them may be in `not_pids` (processes that were
    killed). Returns the handler pids."""
    not_pids = set(not_pids)

    def probe(c):
        want = int(query_one(c, "SELECT current_setting('eventbox.handler_workers')"))
        rows = query(c, "SELECT backend_type, pid FROM pg_stat_activity "
                        "WHERE backend_type IN ('eventbox handler', 'eventbox ingest', "
                        "'eventbox relay')")
        kinds = collections.Counter(t for t, _ in rows)
        if kinds != {"eventbox handler": want, "eventbox ingest": 1, "eventbox relay": 1}:
            return None
        if not_pids & {p for _, p in rows}:
            return None
        states = query(c, "SELECT pid, state FROM eventbox.workers WHERE role = 'handler'")
        hp = sorted(p for t, p in rows if t == "eventbox handler")
        if sorted(p for p, s in states if s == "running") != hp:
            return None
        return hp

    deadline = time.monotonic() + timeout
    while True:
        try:
            pids = retry_conn(probe, timeout=max(1.0, deadline - time.monotonic()))
        except psycopg2.Error:
            pids = None   # e.g. the extension is being created, or a crash restart
        if pids:
            return pids
        if time.monotonic() >= deadline:
            state = retry_conn(lambda c: (
                query(c, "SELECT pid, backend_type FROM pg_stat_activity "
                         "WHERE backend_type LIKE 'eventbox%%'"),
                query(c, "SELECT pid, role, state, last_error FROM eventbox.workers")))
            pytest.fail("eventbox workers not all running after %.0f s: %r" % (timeout, state))
        time.sleep(0.2)


def inbox_status(c, sub):
    """{status: count} of the subscription's inbox rows."""
    return dict(query(c, "SELECT status, count(*) FROM eventbox.inbox WHERE subscription = %s "
                         "GROUP BY status", (sub,)))


def wait_settled(sub, expected, timeout=180.0, progress=None):
    """Waits until the subscription holds `expected` inbox rows, none of them
    'received' or 'retry'; returns the status counts. Survives crash restarts."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = retry_conn(lambda c: inbox_status(c, sub),
                              timeout=max(1.0, deadline - time.monotonic()))
        except psycopg2.Error:
            last = None
        if last is not None:
            if progress is not None:
                progress(last)
            if (sum(last.values()) == expected and last.get("received", 0) == 0
                    and last.get("retry", 0) == 0):
                return last
        if time.monotonic() >= deadline:
            pytest.fail("subscription %s not settled after %.0f s (want %d rows, none "
                        "received/retry): %r" % (sub, timeout, expected, last))
        time.sleep(0.2)


def ledger_figures(c, ledger, expected_ids):
    """(rows, distinct, lost, duplicated, unexpected) of a ledger table with a
    message_id column against the ids that must each have exactly one row."""
    counts = collections.Counter(r[0] for r in query(c, "SELECT message_id FROM %s" % ledger))
    expected = set(expected_ids)
    rows = sum(counts.values())
    lost = len(expected - set(counts))
    dups = sum(n - 1 for n in counts.values() if n > 1)
    unexpected = len(set(counts) - expected)
    return rows, len(counts), lost, dups, unexpected


def duplicate_runs(c, ledger, limit=12):
    """The ledger rows of messages with more than one row (a ledger has columns
    message_id, attempts (msg.attempts as the handler saw it), pid (the worker)
    and at (clock_timestamp())), as printable lines."""
    rows = query(c, """
        SELECT message_id, pid, attempts, to_char(at, 'HH24:MI:SS.US') FROM %s
         WHERE message_id IN (SELECT message_id FROM %s GROUP BY 1 HAVING count(*) > 1)
         ORDER BY message_id, at LIMIT %d""" % (ledger, ledger, limit))
    return ["message %s run by pid %s with msg.attempts=%s at %s" % r for r in rows]


def show_duplicates(lines):
    if lines:
        print("duplicated handler runs (first %d ledger rows):" % len(lines))
        for ln in lines:
            print("    " + ln)


# ---------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="session")
def handler_env(extension):
    """The extension, the run_as role (dropped again at the end of the
    session, with whatever it was granted), and every worker running."""
    c = connect()
    try:
        query(c, """
            DO $$ BEGIN
              IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '%s') THEN
                CREATE ROLE %s NOLOGIN NOSUPERUSER;
              END IF;
            END $$""" % (RUN_AS, RUN_AS))
        assert query_one(c, "SELECT rolsuper FROM pg_roles WHERE rolname = %s", (RUN_AS,)) is False
    finally:
        c.close()
    wait_workers(timeout=120)
    yield True

    def drop_role(c):
        # Both conftests (integration and fault) hold this fixture: in a run of both
        # directories the second teardown finds the role gone. Handlers registered
        # with the role went with their subscriptions; one still left keeps it.
        if query_one(c, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (RUN_AS,)) == 0:
            return
        if query_one(c, "SELECT count(*) FROM eventbox.handlers h JOIN pg_roles r "
                        "ON r.oid = h.run_as WHERE r.rolname = %s", (RUN_AS,)) == 0:
            query(c, "DROP OWNED BY %s" % RUN_AS)
            query(c, "DROP ROLE %s" % RUN_AS)
    retry_conn(drop_role)


class HandlerCase:
    """One test's topic, subscription and schema. `setup(...)` creates the
    tables and the handler, the subscription, and registers the handler, in one
    transaction (so that the ingest worker never sees the subscription without
    its handler); `q(sql)` fills in the names."""

    def __init__(self, name, topic):
        self.name = name
        self.topic = topic
        self.sub = "h_%s_%s" % (name[:30], uuid.uuid4().hex[:6])
        self.schema = "hs_%s_%s" % (name[:30], uuid.uuid4().hex[:6])
        c = connect()
        try:
            query(c, "CREATE SCHEMA %s" % self.schema)
            query(c, "GRANT USAGE ON SCHEMA %s TO %s" % (self.schema, RUN_AS))
        finally:
            c.close()

    def q(self, sql):
        """sql with {s} (schema), {sub}, {topic} and {role} filled in."""
        return sql.replace("{s}", self.schema).replace("{sub}", self.sub) \
                  .replace("{topic}", self.topic).replace("{role}", RUN_AS)

    def setup(self, ddl, handler="{s}.handle(eventbox.inbox)", event_type=None,
              sends=False, register=True, batch=False, **options):
        """ddl: tables and the handler function (with {s} etc.); options: those of
        eventbox.create_subscription (ordering, max_attempts, backoff, ...).
        register=False leaves the handler unregistered (see register()); batch=True
        registers it as a batch handler (handler then takes eventbox.inbox[])."""
        self.handler = handler
        self.event_type = event_type
        self.batch = batch
        c = connect(autocommit=False)
        try:
            with c.cursor() as cur:
                cur.execute(self.q(ddl))
                cur.execute(self.q("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "
                                   "{s} TO {role}"))
                cur.execute(self.q("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {role}"))
                cur.execute(self.q("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {s} TO {role}"))
                if sends:
                    cur.execute("GRANT USAGE ON SCHEMA eventbox TO %s" % RUN_AS)
                    cur.execute("GRANT EXECUTE ON FUNCTION eventbox.send(text, jsonb, text, "
                                "jsonb, uuid) TO %s" % RUN_AS)
                args = ["%s", "topics => ARRAY[%s]"]
                values = [self.sub, self.topic]
                for k, v in options.items():
                    args.append("%s => %%s" % k)
                    values.append(v)
                cur.execute("SELECT eventbox.create_subscription(%s)" % ", ".join(args), values)
                if register:
                    self._register(cur)
            c.commit()
        finally:
            c.close()

    def _register(self, cur):
        cur.execute("SELECT eventbox.register_handler(%s, %s::regprocedure, "
                    "event_type => %s, run_as => %s, batch => %s)",
                    (self.sub, self.q(self.handler), self.event_type, RUN_AS, self.batch))

    def register(self):
        """Registers the handler given to setup(register=False)."""
        def reg(c):
            with c.cursor() as cur:
                self._register(cur)
        retry_conn(reg)

    def drop(self):
        def drop(c):
            query(c, "SELECT eventbox.drop_subscription(%s) FROM eventbox.subscriptions "
                     "WHERE name = %s", (self.sub, self.sub))
            query(c, "DROP SCHEMA IF EXISTS %s CASCADE" % self.schema)
        retry_conn(drop)


@pytest.fixture
def case(request, handler_env, new_topic):
    """case(partitions=4) -> a HandlerCase with a fresh topic; its subscription
    and schema are dropped after the test."""
    made = []
    base = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")
    base = re.sub(r"^test_", "", base)

    def make(partitions=4):
        hc = HandlerCase(base, new_topic(partitions))
        made.append(hc)
        return hc

    yield make
    for hc in made:
        try:
            hc.drop()
        except Exception as e:  # cleanup must not hide the test's own outcome
            print("cleanup of %s failed: %s" % (hc.sub, e))


class ScratchDatabase:
    """A database of its own with pg_eventbox in it, which the background workers do not
    serve (eventbox.process() runs there in the test's session), and a non-superuser role
    `role` for its handlers; `setup_sql` runs in it after CREATE EXTENSION. drop() removes
    the database."""

    def __init__(self, name, role, setup_sql=""):
        self.name = name
        self.admin = psycopg2.connect("", dbname="postgres", application_name="eventbox-tests")
        self.admin.autocommit = True
        query(self.admin, "DROP DATABASE IF EXISTS %s WITH (FORCE)" % name)
        query(self.admin, "CREATE DATABASE %s" % name)
        c = self.connect()
        try:
            query(c, """
                CREATE EXTENSION pg_eventbox;
                DO $$ BEGIN
                    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '%s') THEN
                        CREATE ROLE %s;
                    END IF;
                END $$;
            """ % (role, role) + setup_sql)
        finally:
            c.close()

    def connect(self):
        c = psycopg2.connect("", dbname=self.name, application_name="eventbox-tests")
        c.autocommit = True
        return c

    def drop(self):
        query(self.admin, "DROP DATABASE IF EXISTS %s WITH (FORCE)" % self.name)
        self.admin.close()


def explained_process(c, subscription, batch):
    """Runs one eventbox.process(subscription, batch) pass with auto_explain on (log_analyze,
    buffers, nested statements, as NOTICEs to this session); returns (handled, [(statement
    text, plan json)]). process() runs the workers' kept statements with their planner
    settings, so the plans are those a worker's pass runs."""
    c.notices = collections.deque(maxlen=2000)
    query(c, """
        LOAD 'auto_explain';
        SET auto_explain.log_min_duration = 0;
        SET auto_explain.log_analyze = on;
        SET auto_explain.log_buffers = on;
        SET auto_explain.log_timing = off;
        SET auto_explain.log_nested_statements = on;
        SET auto_explain.log_format = json;
        SET auto_explain.log_level = notice;
    """)
    handled = query_one(c, "SELECT eventbox.process(%s, %s)", (subscription, batch))
    query(c, "SET auto_explain.log_min_duration = -1")
    plans = []
    for notice in list(c.notices):
        m = re.search(r"plan:\s*(\{.*\})\s*$", notice, re.S)
        if m:
            doc = json.loads(m.group(1))
            plans.append((doc.get("Query Text", ""), doc["Plan"]))
    return handled, plans


def plan_nodes(plan):
    """Every node of a plan (json), the plan itself first."""
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def plan_scans(plans, relations):
    """(statement, node type, index or None, buffers) of every scan node of `plans` (as
    explained_process() returns them) that reads one of `relations` (eventbox tables, by name)
    or one of their indexes (named after the table). ModifyTable nodes are left out: an UPDATE's
    counts the new row versions' index entries, bounded by the batch as well, but not a scan."""
    out = []
    for text, plan in plans:
        for n in plan_nodes(plan):
            if not n["Node Type"].endswith("Scan"):
                continue
            index = n.get("Index Name")
            if n.get("Relation Name") in relations or \
                    any((index or "").startswith(r + "_") for r in relations):
                buffers = n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0)
                out.append((text, n["Node Type"], index, buffers))
    return out
