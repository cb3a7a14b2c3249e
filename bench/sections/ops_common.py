"""What the parts of section ops share (ops_metrics.py, ops_retention.py): topic sizes for the
dev broker, the run's topic suffix, the supervisor's pid, CPU per message."""

import time

from lib.cluster import q1
from lib.table import per_msg_us

# Bytes on the wire per record are ~330 at 200 B payloads (key, headers message_id and
# event_type, batch overhead): a partition holds 5 MiB / 330 B ~ 15k of them. Keep each under
# 10k.
PER_PARTITION = 10000

# Appended to topic names: a cluster kept from an earlier run (BENCH_KEEP) has the old ones.
RUN = "%x" % int(time.time())


def supervisor_pids(cur):
    """The supervisor's pid, as a list (empty while none runs): it serves /metrics."""
    return [r for r in [q1(cur, "SELECT pid FROM pg_stat_activity "
                                "WHERE backend_type = 'eventbox supervisor'")] if r]


def partitions_for(n):
    return max(8, -(-n // PER_PARTITION))


def postgres_us(runs):
    """CPU of all PostgreSQL processes (workers, supervisor, the bench's session, autovacuum)
    per message over `runs`, in microseconds: what the other users of the box move least."""
    return per_msg_us(runs, "postgres_s")
