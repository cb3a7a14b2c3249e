"""eventbox.workers names each worker as pg_stat_activity does (issue 27, item 5): its role is
the backend type without the 'eventbox ' prefix; 0.2.0 called the supervisor 'launcher'."""

from eventbox_fixtures import query, wait_until


def test_roles_match_backend_types(conn):
    def rows():
        return query(conn, "SELECT w.role, a.backend_type FROM eventbox.workers w "
                           "JOIN pg_stat_activity a USING (pid) ORDER BY 1")
    # The supervisor, the relay, an ingest worker and a handler worker at least.
    got = wait_until(lambda: (lambda r: r if {x for x, _ in r} >=
                              {"supervisor", "relay", "ingest", "handler"} else None)(rows()),
                     30, what="every kind of worker in eventbox.workers")
    mismatched = [(role, backend) for role, backend in got if backend != "eventbox " + role]
    assert not mismatched, mismatched
    assert query(conn, "SELECT count(*) FROM eventbox.workers WHERE role = 'launcher'") == [(0,)]
