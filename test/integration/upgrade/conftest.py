"""Fixtures of the upgrade tests: see clusters.py. Each test starts its own clusters
(`clusters` stops every one of them, whatever happens); one dev broker serves the folder."""
import pathlib
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from clusters import Cluster, Kafka  # noqa: E402


@pytest.fixture(scope="session")
def kafka():
    logdir = tempfile.mkdtemp(prefix="eb-upgrade-broker.", dir="/tmp")
    k = Kafka(logdir)
    yield k
    k.close()


@pytest.fixture
def clusters(request):
    """clusters(name) -> a new Cluster (not started); all are stopped after the test, and a
    crash line in any of their logs fails it."""
    made = []

    def make(name):
        c = Cluster(name)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()
        shutil.rmtree(c.datadir, ignore_errors=True)   # the logs stay, like cluster.sh's
    crashes = {c.dir: c.crash_lines() for c in made if c.crash_lines()}
    assert not crashes, "crash lines in server logs: %r" % crashes
