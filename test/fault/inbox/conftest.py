"""Fixtures of the inbox fault tests: the helpers live with the inbox integration tests
(test/integration/inbox/inbox_support.py)."""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "integration" / "inbox"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "lib"))

from inbox_support import (  # noqa: E402
    ib_broker, ib_db, ib_env, ib_producer, ib_subscriptions, ib_topic, terminal_summary)
from schema_registry import SchemaRegistry  # noqa: E402

# The fixtures, for pytest.
__all__ = ["ib_broker", "ib_db", "ib_env", "ib_producer", "ib_subscriptions", "ib_topic"]


@pytest.fixture
def registry(ib_db):
    """A Schema Registry on loopback that the workers use (eventbox.schema_registry_url) for the
    test, then no registry again (as in test/integration/inbox/conftest.py)."""
    r = SchemaRegistry().start()
    since = ib_db.set_setting("eventbox.schema_registry_url", r.url, r.url)
    ib_db.wait_worker_reloaded(since)
    yield r
    r.stop()
    ib_db.set_setting("eventbox.schema_registry_url", None, "")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminal_summary(terminalreporter, config)
