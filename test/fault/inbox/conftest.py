"""Fixtures of the inbox fault tests: the helpers live with the inbox integration tests
(test/integration/inbox/inbox_support.py)."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "integration" / "inbox"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "lib"))

from inbox_support import (  # noqa: E402
    ib_broker, ib_db, ib_env, ib_producer, ib_subscriptions, ib_topic, terminal_summary)
from inbox_streams import registry  # noqa: E402

# The fixtures, for pytest.
__all__ = ["ib_broker", "ib_db", "ib_env", "ib_producer", "ib_subscriptions", "ib_topic",
           "registry"]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminal_summary(terminalreporter, config)
