"""Fixtures of the integration tests: see test/lib/eventbox_fixtures.py."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "lib"))

import eventbox_fixtures  # noqa: E402

eventbox_fixtures.bind_fixtures(globals())
