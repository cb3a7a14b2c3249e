"""Every SQL example of the project's docs runs as written.

The ```sql blocks of README.md, docs/guide/*.md and docs/reference/*.md run in order,
statement by statement in autocommit (as psql runs a file), against the test cluster with its
workers and the dev broker running. The guide and reference pages continue the README's example
(docs/README.md says so): their blocks run after the README's, once its order was invoiced. A
statement that ends with the comment `-- fails with SQLSTATE XXXXX` must fail with that SQLSTATE;
any other error fails the test, naming the file, the block, its line and the statement.

Blocks that are not meant to run use another fence language (```ini for postgresql.conf,
```sh, ```text, ...); a fence without a language, or with one not listed here, fails the test,
and so does a ```sql block in a file that is not run (the design notes, CONTRIBUTING.md), or a
guide page without a runnable block (unless listed in NO_EXAMPLES).

Before each file the test drops what its blocks (and the README's) create: the schemas, tables
and roles named by CREATE SCHEMA / TABLE / ROLE, the subscriptions and HTTP destinations the
docs made. So every file starts from a database where its examples were never run.

The README's example also has a test of what it promises (orders sent before the handler exists
are not thrown away): test_readme_example_loses_nothing_that_arrives_before_the_handler.
"""

import pathlib
import re
import time

import psycopg2
import pytest

from eventbox_fixtures import connect, query, query_one, read_topic, wait_outbox_drained, \
    wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"
REFERENCE = ROOT / "docs" / "reference"
# Pages whose examples run after the README's, in this order.
PAGES = sorted(GUIDE.glob("*.md")) + sorted(REFERENCE.glob("*.md"))
# Pages that must have examples besides the guide's.
MUST_SHOW = [REFERENCE / "functions.md"]
# Markdown that is read, not run: no ```sql blocks there.
NOT_RUN = [p for p in [ROOT / "CONTRIBUTING.md", ROOT / "docs" / "README.md"] if p.exists()] \
    + sorted((ROOT / "docs" / "design").glob("*.md"))
GUIDE_PAGES = ["outbox", "inbox", "handlers", "dead-letters", "cdc", "formats", "http",
               "rabbitmq", "replay", "security", "upgrading", "retention", "operations",
               "monitoring", "limits", "scaling"]
# Guide pages with nothing to run (what they say is checked by the tests they name).
NO_EXAMPLES = {"limits.md"}
RUN = "sql"
SHOWN = {"ini", "sh", "text", "yaml", "json", "cpp", "python", "http"}
EXPECTED_ERROR = re.compile(r"--\s*fails with SQLSTATE ([0-9A-Z]{5})\s*$", re.M)


# ---------------------------------------------------------------------------
# reading the docs


class Block:
    def __init__(self, path, line, lang, text):
        self.path, self.line, self.lang, self.text = path, line, lang, text

    def where(self):
        return "%s:%d" % (self.path.relative_to(ROOT), self.line)


def blocks(path):
    """The fenced code blocks of a Markdown file, in order; fails on a fence without a known
    language (a block meant to run must say sql, one that must not another language)."""
    out, lang, start, body = [], None, 0, []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        fence = re.match(r"^\s*```(.*)$", line)
        if lang is None and fence:
            lang, start, body = fence.group(1).strip(), n, []
            if lang != RUN and lang not in SHOWN:
                pytest.fail("%s:%d: a fence with language %r: use ```sql for a block that runs, "
                            "one of %s for one that does not"
                            % (path.relative_to(ROOT), n, lang, sorted(SHOWN)))
        elif lang is not None and fence and not fence.group(1).strip():
            out.append(Block(path, start, lang, "\n".join(body)))
            lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, "%s:%d: fence not closed" % (path.relative_to(ROOT), start)
    return out


def sql_blocks(path):
    return [b for b in blocks(path) if b.lang == RUN]


def statements(sql):
    """Splits SQL into top-level statements: [(line within the text, statement)]. Knows quoted
    strings and identifiers, dollar quotes and comments; drops statements that are only comments."""
    out, start, i, n = [], 0, 0, len(sql)
    while i < n:
        c = sql[i]
        if sql.startswith("--", i):
            i = sql.find("\n", i)
            i = n if i < 0 else i
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif c in "'\"":
            escapes = c == "'" and i > 0 and sql[i - 1] in "eE"
            i += 1
            while i < n:
                if escapes and sql[i] == "\\":
                    i += 2
                    continue
                if sql[i] == c:
                    if i + 1 < n and sql[i + 1] == c:
                        i += 2
                        continue
                    break
                i += 1
            i += 1
        elif c == "$" and re.match(r"\$(\w*)\$", sql[i:]) and not re.match(r"\w", sql[i - 1:i]):
            tag = re.match(r"\$(\w*)\$", sql[i:]).group(0)
            end = sql.find(tag, i + len(tag))
            i = n if end < 0 else end + len(tag)
        elif c == ";":
            # The statement takes the rest of its line: a trailing comment belongs to it.
            eol = sql.find("\n", i)
            eol = n if eol < 0 else eol
            if not sql[i + 1:eol].strip().startswith("--"):
                eol = i + 1
            out.append((start, sql[start:eol]))
            start = i = eol
        else:
            i += 1
    out.append((start, sql[start:]))
    result = []
    for offset, text in out:
        code = re.sub(r"--[^\n]*", "", text).strip()
        if not code:
            continue
        lead = len(text) - len(text.lstrip())
        result.append((sql.count("\n", 0, offset + lead), text.strip()))
    return result


# ---------------------------------------------------------------------------
# running them


def created(files, kind):
    """Names the blocks of `files` create with CREATE <kind> (schema-qualified for tables)."""
    names = set()
    for path in files:
        for b in sql_blocks(path):
            names.update(m.group(1) for m in re.finditer(
                r"\bCREATE\s+%s\s+(?:IF\s+NOT\s+EXISTS\s+)?([\w.]+)" % kind, b.text, re.I))
    return names


class Baseline:
    """What the cluster held before the docs ran: those subscriptions and destinations stay."""

    def __init__(self, conn):
        self.subscriptions = {r[0] for r in query(conn, "SELECT name FROM eventbox.subscriptions")}
        self.destinations = {r[0] for r in query(
            conn, "SELECT topic FROM eventbox.http_destination_config")}

    def reset(self, conn, files):
        """Drops what the docs' blocks made: their subscriptions and destinations, then the
        schemas, tables and roles they create."""
        for (name,) in query(conn, "SELECT name FROM eventbox.subscriptions"):
            if name not in self.subscriptions:
                query(conn, "SELECT eventbox.drop_subscription(%s)", (name,))
        for (topic,) in query(conn, "SELECT topic FROM eventbox.http_destination_config"):
            if topic not in self.destinations:
                query(conn, "SELECT eventbox.drop_http_destination(%s)", (topic,))
        for schema in created(files, "SCHEMA"):
            query(conn, 'DROP SCHEMA IF EXISTS "%s" CASCADE' % schema)
        for table in created(files, "TABLE"):
            query(conn, "DROP TABLE IF EXISTS %s CASCADE" % table)
        for role in created(files, "ROLE"):
            if query_one(conn, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)):
                query(conn, 'DROP OWNED BY "%s" CASCADE; DROP ROLE "%s"' % (role, role))


def run_file(conn, path):
    """Runs the ```sql blocks of `path` in order; fails at the first statement that does not do
    what it says (succeed, or fail with the SQLSTATE its comment names)."""
    for number, block in enumerate(sql_blocks(path), 1):
        for line, stmt in statements(block.text):
            expected = EXPECTED_ERROR.search(stmt)
            where = "%s:%d (block %d, line %d of the file)" % (
                path.relative_to(ROOT), block.line, number, block.line + 1 + line)
            if re.match(r"\s*\\", stmt):
                pytest.fail("%s: a psql meta-command in a ```sql block:\n%s" % (where, stmt))
            try:
                query(conn, stmt)
            except psycopg2.Error as e:
                if expected and e.pgcode == expected.group(1):
                    continue
                pytest.fail("%s: statement failed with SQLSTATE %s: %s\n---\n%s"
                            % (where, e.pgcode, str(e).strip(), stmt))
            if expected:
                pytest.fail("%s: statement succeeded, but its comment says it fails with "
                            "SQLSTATE %s\n---\n%s" % (where, expected.group(1), stmt))


def invoiced(conn, order_id):
    try:
        return query_one(conn, "SELECT count(*) FROM billing.invoices WHERE order_id = %s",
                         (order_id,))
    except psycopg2.errors.UndefinedTable:
        return 0


@pytest.fixture(scope="module")
def baseline(extension):
    c = connect()
    b = Baseline(c)
    yield b
    b.reset(c, [README] + PAGES)
    c.close()


# ---------------------------------------------------------------------------
# tests


def test_every_guide_page_exists_and_has_examples():
    pages = sorted(p.name for p in GUIDE.glob("*.md"))
    assert pages == sorted(p + ".md" for p in GUIDE_PAGES), pages
    for path in [README] + PAGES + NOT_RUN:
        blocks(path)  # every fence has a known language
    for path in [README] + sorted(GUIDE.glob("*.md")) + MUST_SHOW:
        runnable = sql_blocks(path)
        if path.name in NO_EXAMPLES:
            assert not runnable, "%s has runnable blocks: remove it from NO_EXAMPLES" % path.name
        else:
            assert runnable, "%s has no ```sql block: every guide page shows its examples" \
                % path.relative_to(ROOT)
    for path in NOT_RUN:
        for b in sql_blocks(path):
            pytest.fail("%s: a ```sql block in a file whose examples do not run: use ```text"
                        % b.where())


def test_statements_are_split_like_psql_splits_them():
    sql = ("SELECT 'a;b', \"c;\" FROM t; -- one\n"
           "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1; $$;\n"
           "/* ; */ SELECT E'\\';'; SELECT 2 -- fails with SQLSTATE 22023\n;\n-- only a comment;\n")
    got = statements(sql)
    assert [s for _, s in got] == [
        "SELECT 'a;b', \"c;\" FROM t; -- one",
        "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1; $$;",
        "/* ; */ SELECT E'\\';';",
        "SELECT 2 -- fails with SQLSTATE 22023\n;"], got
    assert [line for line, _ in got] == [0, 1, 2, 2], got


@pytest.mark.parametrize("page", ["README.md"] + [
    str(p.relative_to(ROOT)) for p in PAGES if "```sql" in p.read_text()])
def test_docs_examples_run(baseline, page):
    path = ROOT / page
    files = [README] if path == README else [README, path]
    c = connect()
    try:
        baseline.reset(c, files)
        run_file(c, README)
        # The README's order reaches its handler: the example works, and the pages after it
        # find the state it leaves (a message handled, an invoice written).
        wait_until(lambda: invoiced(c, 42), 60, what="the README's order 42 to be invoiced")
        if path != README:
            run_file(c, path)
    finally:
        c.close()


# ---------------------------------------------------------------------------
# what the README's example promises


def readme_example():
    """The README's example block, split into (producer statements, consumer statements) at its
    '-- consumer side' comment."""
    block = next(b for b in sql_blocks(README) if "-- consumer side" in b.text)
    producer, consumer = block.text.split("-- consumer side", 1)
    return ([s for _, s in statements(producer)],
            [s for _, s in statements(consumer.split("\n", 1)[1])])


ORDERS = 100


def test_readme_example_loses_nothing_that_arrives_before_the_handler(conn, broker, baseline):
    """The README's example, run as a new user would: each statement in autocommit, with orders
    arriving between create_subscription() and register_handler().

    Before: every message that arrived in between was marked `ignored` (100 of 100 waiting, 0
    invoices, no warning). Now a subscription without any handler keeps its messages waiting for
    the first one."""
    producer_sql, consumer_sql = readme_example()
    assert [s.split()[0] for s in consumer_sql] == ["SELECT", "CREATE", "SELECT"], consumer_sql
    baseline.reset(conn, [README] + PAGES)
    # What the example takes for granted: the producer's table, the handler's schema, table
    # and role (with the grants docs/guide/security.md gives a writer). No primary keys: orders
    # earlier tests left in the topic repeat our ids.
    query(conn, """
        CREATE TABLE public.orders (id int, total numeric);
        CREATE SCHEMA billing;
        CREATE TABLE billing.invoices (order_id int, total numeric);
        CREATE ROLE billing_app;
        GRANT USAGE ON SCHEMA billing TO billing_app;
        GRANT INSERT ON billing.invoices TO billing_app;
        GRANT USAGE ON SCHEMA eventbox TO billing_app;
        GRANT EXECUTE ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid) TO billing_app;
    """)
    try:
        create_subscription, create_function, register_handler = consumer_sql
        query(conn, create_subscription)
        # Orders arrive: the README's producer block verbatim (order 42), and 99 more alike.
        ours = []
        for stmt in producer_sql:
            rows = query(conn, stmt)
            if stmt.lstrip().upper().startswith("SELECT"):
                ours.extend(str(r[0]) for r in rows)
        assert len(ours) == 1, producer_sql
        ours.extend(str(r[0]) for r in query(conn, """
            SELECT eventbox.send('orders', jsonb_build_object('id', g, 'total', g + 0.5),
                                 key => g::text, headers => '{"event_type":"OrderCreated"}')
              FROM generate_series(1, %s) g WHERE g <> 42""", (ORDERS,)))

        def statuses():
            return dict(query(conn, "SELECT message_id, status FROM eventbox.inbox "
                                    "WHERE subscription = 'billing' AND message_id = ANY (%s)",
                              (ours,)))
        wait_until(lambda: len(statuses()) == ORDERS, 60, what="the orders to be ingested")
        time.sleep(2)  # handler passes run meanwhile; nothing may be thrown away
        waiting = query(conn, "SELECT status, count(*) FROM eventbox.inbox "
                              "WHERE subscription = 'billing' GROUP BY status")
        assert [status for status, _ in waiting] == ["received"], waiting
        # The function and the handler, each in its own transaction, as written.
        query(conn, create_function)
        query(conn, register_handler)
        wait_until(lambda: set(statuses().values()) == {"processed"}, 60,
                   what="every order to be handled")
        assert query_one(conn, "SELECT count(DISTINCT order_id) FROM billing.invoices "
                               "WHERE order_id BETWEEN 1 AND %s", (ORDERS,)) == ORDERS
        wait_outbox_drained("invoices", timeout=60)
        assert len(read_topic("invoices")) >= ORDERS
    finally:
        baseline.reset(conn, [README] + PAGES)
