"""The workers' life around the served database and the extension: eventbox.database missing
at start (one WARNING, no restart loop, workers once it exists), and the extension dropped and
created again at once (the new install's handlers and sends work within seconds)."""

import collections
import time
import uuid

from upgrade_support import (HANDLER_DDL, Elapsed, duplicates, query, query_one, report,
                             wait_settled, wait_until, wait_workers, worker_counts)

MISSING = r'eventbox launcher WARNING:  eventbox\.database "missing_app" does not exist'
LAUNCHER_FAILED = (r'eventbox launcher FATAL|eventbox launcher ERROR|'
                   r'background worker "eventbox (launcher|supervisor)" \(PID \d+\) exited')


def test_missing_database_warns_once_then_workers_start(clusters, kafka):
    cluster = clusters("nodb").start(db="postgres", conf=["eventbox.database='missing_app'"],
                                     brokers=kafka.bootstrap)
    cluster.wait_log(MISSING, timeout=15)
    lines = cluster.log_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if "does not exist" in ln)
    assert "DETAIL:  The pg_eventbox workers start once it exists" in lines[at + 1], \
        lines[at:at + 3]
    assert "HINT:  Create the database, or set eventbox.database" in lines[at + 2], lines[at:at + 3]

    # A window of 5 s: still one WARNING, the launcher neither fails nor is restarted.
    window = Elapsed()
    while window() < 5.0:
        assert len(cluster.log_lines(MISSING)) == 1, cluster.log_lines(MISSING)
        assert not cluster.log_lines(LAUNCHER_FAILED), cluster.log_lines(LAUNCHER_FAILED)
        time.sleep(0.25)
    assert not cluster.log_lines(r"FATAL"), cluster.log_lines(r"FATAL")
    assert worker_counts(cluster.connect("postgres")) == {}

    cluster.mark_log()
    el = Elapsed()
    cluster.sql("CREATE DATABASE missing_app", dbname="postgres")
    cluster.sql("CREATE EXTENSION pg_eventbox", dbname="missing_app")
    # The launcher looks again after 1, 2, 4, ... up to 60 s.
    workers_s = wait_workers(cluster, timeout=70, dbname="missing_app")
    cluster.wait_log(r'eventbox\.database "missing_app" exists now', 5, since_mark=True)
    assert len(cluster.log_lines(MISSING)) == 1
    assert not cluster.log_lines(LAUNCHER_FAILED), cluster.log_lines(LAUNCHER_FAILED)
    report("missing_database", warnings=1, observed_s="%.1f" % window(),
           workers_after_create_s="%.1f" % workers_s)
