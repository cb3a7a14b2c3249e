"""Helpers the RabbitMQ tests import (a module of its own: every test directory has a
conftest.py, and `from conftest import ...` would get whichever was imported last)."""
from eventbox_fixtures import connect, query


def sql(statement, args=None):
    """Runs one statement on a connection of its own; returns its rows (None without)."""
    c = connect()
    try:
        return query(c, statement, args)
    finally:
        c.close()


def drain(channel, queue, limit=100000):
    """Every message waiting in `queue` as (properties, body), acknowledged."""
    got = []
    for _ in range(limit):
        method, props, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append((props, body))
    return got
