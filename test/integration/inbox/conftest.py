"""Fixtures of the inbox integration tests: see inbox_support.py (shared with test/fault/inbox)."""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent / "lib"))

from inbox_support import (  # noqa: E402
    ib_broker, ib_db, ib_env, ib_producer, ib_subscriptions, ib_topic, terminal_summary)
from inbox_streams import registry  # noqa: E402

# The fixtures, for pytest.
__all__ = ["ib_broker", "ib_db", "ib_env", "ib_producer", "ib_subscriptions", "ib_topic",
           "registry"]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminal_summary(terminalreporter, config)
