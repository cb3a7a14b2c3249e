"""The environment of the inbox tests: the variables tools/cluster.sh's env file exports (read
with test/lib's env()), names unique to a run, and polling with a deadline (used by
inbox_support.py and inbox_kafka.py). Importing it puts test/lib on the path."""

import pathlib
import sys
import time
import uuid

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
if str(REPO / "test" / "lib") not in sys.path:
    sys.path.insert(0, str(REPO / "test" / "lib"))

REQUIRED_ENV = ("PGHOST", "PGPORT", "PGDATABASE", "EVENTBOX_LOG", "EVENTBOX_BOOTSTRAP",
                "EVENTBOX_CONTROL_PORT", "EVENTBOX_KILLED_PIDS")


def unique_name(label):
    """A topic / subscription name unique to this run: [A-Za-z0-9_.-], at most 63 chars."""
    return "ib_%s_%s" % (label[:40], uuid.uuid4().hex[:10])


def poll(fn, timeout, what, interval=0.1):
    """Calls fn() until it returns a truthy value, which is returned. After `timeout` seconds
    the test fails with `what` and the last value fn() returned."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() >= deadline:
            pytest.fail("timed out after %.0f s waiting for %s (last value: %r)"
                        % (timeout, what() if callable(what) else what, last))
        time.sleep(interval)

