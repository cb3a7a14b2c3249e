"""Fixtures of the inbox integration tests: see inbox_support.py (shared with test/fault/inbox)."""
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent / "lib"))

from inbox_support import (  # noqa: E402
    ib_broker, ib_db, ib_env, ib_producer, ib_subscriptions, ib_topic, terminal_summary)
from schema_registry import SchemaRegistry  # noqa: E402

# The fixtures, for pytest.
__all__ = ["ib_broker", "ib_db", "ib_env", "ib_producer", "ib_subscriptions", "ib_topic"]


@pytest.fixture
def registry(ib_db):
    """A Schema Registry on loopback that the workers use (eventbox.schema_registry_url) for the
    test, then no registry again."""
    r = SchemaRegistry().start()
    since = ib_db.set_setting("eventbox.schema_registry_url", r.url, r.url)
    ib_db.wait_worker_reloaded(since)
    yield r
    r.stop()
    ib_db.set_setting("eventbox.schema_registry_url", None, "")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminal_summary(terminalreporter, config)
