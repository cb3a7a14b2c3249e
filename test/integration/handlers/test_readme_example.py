"""The README's first example, run verbatim as a new user would: each statement
in autocommit, with orders arriving between create_subscription() and
register_handler().

Before: every message that arrived in between was marked `ignored` (100 of
100 waiting, 0 invoices, no warning). Now a subscription without any handler
keeps its messages waiting for the first one.
"""

import pathlib
import re
import time

from eventbox_fixtures import query, query_one, read_topic, wait_outbox_drained, wait_until

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"
ORDERS = 100


def readme_example():
    """The README's first ```sql block, split into (producer statements,
    consumer statements) at its '-- consumer side' comment."""
    text = README.read_text()
    block = re.search(r"```sql\n(.*?)```", text, re.S).group(1)
    producer, consumer = block.split("-- consumer side", 1)
    return statements(producer), statements(consumer.split("\n", 1)[1])


def statements(sql):
    """Top-level statements (';' at a line end outside $$ bodies), comments dropped."""
    out, cur, in_body = [], [], False
    for line in sql.splitlines():
        code = line.split("--", 1)[0] if not in_body else line
        if not cur and not code.strip():
            continue
        cur.append(line)
        if line.count("$$") % 2 == 1:
            in_body = not in_body
        if not in_body and code.rstrip().endswith(";"):
            out.append("\n".join(cur))
            cur = []
    assert not cur, cur
    return out


def test_readme_example_loses_nothing_that_arrives_before_the_handler(conn, broker):
    producer_sql, consumer_sql = readme_example()
    assert [s.split()[0] for s in consumer_sql] == ["SELECT", "CREATE", "SELECT"], consumer_sql
    # What the example takes for granted: the producer's table, the handler's schema, table
    # and role (with the grants the README's Grants section gives a writer).
    query(conn, """
        DROP TABLE IF EXISTS public.orders;
        CREATE TABLE public.orders (id int, total numeric);
        DROP SCHEMA IF EXISTS billing CASCADE;
        CREATE SCHEMA billing;
        CREATE TABLE billing.invoices (order_id int, total numeric);
        DO $$ BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'billing_app') THEN
                CREATE ROLE billing_app;
            END IF;
        END $$;
        GRANT USAGE ON SCHEMA billing TO billing_app;
        GRANT INSERT ON billing.invoices TO billing_app;
        GRANT USAGE ON SCHEMA eventbox TO billing_app;
        GRANT EXECUTE ON FUNCTION eventbox.send(text, jsonb, text, jsonb, uuid) TO billing_app;
    """)
    # Orders an earlier run left in the topic are read too (the subscription starts at the
    # earliest offset): they count, and their ids repeat ours.
    before = len(read_topic("orders", missing_ok=True))
    total = before + ORDERS
    try:
        create_subscription, create_function, register_handler = consumer_sql
        query(conn, create_subscription)
        # Orders arrive: the README's producer block verbatim (order 42), and 99 more alike.
        for stmt in producer_sql:
            query(conn, stmt)
        query(conn, """
            SELECT eventbox.send('orders', jsonb_build_object('id', g, 'total', g + 0.5),
                                 key => g::text, headers => '{"event_type":"OrderCreated"}')
              FROM generate_series(1, %s) g WHERE g <> 42""", (ORDERS,))
        wait_until(lambda: query_one(conn, "SELECT count(*) FROM eventbox.inbox "
                                           "WHERE subscription = 'billing'") == total,
                   60, what="the orders to be ingested")
        time.sleep(2)  # handler passes run meanwhile; nothing may be thrown away
        waiting = query(conn, "SELECT status, count(*) FROM eventbox.inbox "
                              "WHERE subscription = 'billing' GROUP BY status")
        assert waiting == [("received", total)], waiting
        # The function and the handler, each in its own transaction, as written.
        query(conn, create_function)
        query(conn, register_handler)
        wait_until(lambda: query_one(conn, "SELECT count(*) FROM billing.invoices") == total,
                   60, what="every order to be invoiced")
        statuses = query(conn, "SELECT status, count(*) FROM eventbox.inbox "
                               "WHERE subscription = 'billing' GROUP BY status")
        assert statuses == [("processed", total)], statuses
        assert query_one(conn, "SELECT count(DISTINCT order_id) FROM billing.invoices") == ORDERS
        wait_outbox_drained("invoices", timeout=60)
        assert len(read_topic("invoices")) >= total
    finally:
        query(conn, "SELECT eventbox.drop_subscription('billing') "
                    "FROM eventbox.subscriptions WHERE name = 'billing'")
        query(conn, "DROP SCHEMA IF EXISTS billing CASCADE; DROP TABLE IF EXISTS public.orders")
