"""Fixtures of the handler fault tests: the shared ones of
test/lib/eventbox_fixtures.py plus test/integration/handlers/eventbox_handler_lib.py."""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
for p in (HERE.parents[1] / "lib", HERE.parents[1] / "integration" / "handlers"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import eventbox_fixtures  # noqa: E402
from eventbox_handler_lib import case, handler_env  # noqa: E402

eventbox_fixtures.bind_fixtures(globals())

# The fixtures of eventbox_handler_lib, for pytest.
__all__ = ["case", "handler_env"]
