"""Fixtures of the handler integration tests: the shared ones of
test/lib/eventbox_fixtures.py plus eventbox_handler_lib.py (this directory)."""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
for p in (HERE.parents[1] / "lib", HERE):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import eventbox_fixtures  # noqa: E402
from eventbox_handler_lib import case, handler_env  # noqa: E402

eventbox_fixtures.bind_fixtures(globals())

# The fixtures of eventbox_handler_lib, for pytest.
__all__ = ["case", "handler_env"]
