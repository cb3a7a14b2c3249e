"""Fixtures of the handler integration tests: the shared ones of
test/lib/eventbox_fixtures.py plus eventbox_handler_lib.py (this directory)."""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
for p in (HERE.parents[1] / "lib", HERE):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from eventbox_fixtures import *  # noqa: E402,F401,F403
from eventbox_handler_lib import case, handler_env  # noqa: E402,F401
