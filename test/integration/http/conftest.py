"""Fixtures of the HTTP destination tests: a local endpoint per test and a destination for a
fresh topic, dropped afterwards. Also used by test/fault/test_fault_http.py."""
import pathlib
import sys
import uuid

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from http_support import Endpoint  # noqa: E402
from eventbox_fixtures import cancel_unsent, connect, query  # noqa: E402


@pytest.fixture
def endpoint():
    made = []

    def make(behaviour=None, port=0, tls=False):
        e = Endpoint(behaviour, port, tls)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


@pytest.fixture
def http_topic(extension):
    """http_topic(url, **options) -> a fresh topic whose messages go to `url`."""
    topics = []

    def make(url, headers="{}", **options):
        topic = "h_%s" % uuid.uuid4().hex[:10]
        c = connect()
        try:
            args = ", ".join("%s => %%(%s)s" % (k, k) for k in options)
            query(c, "SELECT eventbox.create_http_destination(%%(t)s, %%(u)s, %%(h)s%s)"
                  % (", " + args if args else ""), dict(t=topic, u=url, h=headers, **options))
        finally:
            c.close()
        topics.append(topic)
        return topic

    yield make
    c = connect()
    try:
        for t in topics:
            # Rows left (failed, or pending towards a dead endpoint) would go to Kafka after the
            # drop: delete them first.
            cancel_unsent(c, t)
            query(c, "SELECT eventbox.drop_http_destination(%s)", (t,))
    finally:
        c.close()
