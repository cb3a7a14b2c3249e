"""Fixtures of the inbox integration tests: see inbox_support.py (shared with test/fault/inbox)."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from inbox_support import (  # noqa: E402
    ib_broker, ib_db, ib_env, ib_producer, ib_subscriptions, ib_topic, terminal_summary)

# The fixtures, for pytest.
__all__ = ["ib_broker", "ib_db", "ib_env", "ib_producer", "ib_subscriptions", "ib_topic"]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminal_summary(terminalreporter, config)
