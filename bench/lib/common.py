"""What every part of the bench shares: its error, its log, where the repository is, and the
context a section runs in."""

import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

T_START = time.monotonic()


class BenchError(Exception):
    """Something is functionally broken: the bench fails (exit 1)."""


def log(msg):
    """A progress line on stderr, with the seconds since the bench started."""
    print("bench: [%5.1fs] %s" % (time.monotonic() - T_START, msg), file=sys.stderr, flush=True)


class Context:
    """What a section runs with: the environment (cluster.Env), the bench's own connection and
    its cursor (autocommit), the knobs, the process groups every CPU meter reads (name ->
    callable returning pids), a scratch directory, and the results, which the section adds
    to."""

    def __init__(self, env, conn, args, pg_groups, tmpdir, res):
        self.env, self.conn, self.cur = env, conn, conn.cursor()
        self.args, self.pg_groups, self.tmpdir, self.res = args, pg_groups, tmpdir, res
