"""A handler worker SIGKILLed in the middle of a replay (issue 18): the mode is recorded in the
inbox row, so after the crash restart the messages run again in mode 'replay', each replay's
effects commit exactly once, and its sends stay suppressed (each in eventbox.suppressed_sends
once, none published to Kafka).

Every SIGKILL of a server process makes the postmaster restart the whole server (crash
recovery): the killed pid goes to $EVENTBOX_KILLED_PIDS first (eventbox_fixtures.sigkill) so
that the run's log scan accepts the crash."""

import collections
import uuid

from eventbox_fixtures import (query, query_one, read_topic, report, sigkill,
                               wait_outbox_drained, wait_until)
from eventbox_handler_lib import Msg, produce, retry_conn, wait_settled, wait_workers

# Message seq 50 sleeps in its first replay attempt: the test kills the worker then.
DDL = """
CREATE TABLE {s}.ledger (n bigserial, message_id text, mode text);
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.ledger (message_id, mode) VALUES (msg.message_id, msg.mode);
    PERFORM eventbox.send('{out}', msg.payload, key => msg.message_id);
    IF msg.mode = 'replay' AND (msg.payload->>'seq')::int = 50 AND msg.attempts = 1 THEN
        PERFORM set_config('application_name', 'eventbox-replay-blocker ' || msg.message_id, false);
        PERFORM pg_sleep(60);
    END IF;
END $$;
"""
N = 100


def eventbox_pids(c):
    return [r[0] for r in query(c, "SELECT pid FROM pg_stat_activity "
                                   "WHERE backend_type LIKE 'eventbox %%'")]


def test_sigkill_during_a_replay_keeps_its_mode(case, new_topic):
    hc = case(2)
    out = new_topic(1)
    hc.setup(DDL.replace("{out}", out), sends=True)
    msgs = [Msg(str(uuid.uuid4()), i % 2, "k%d" % i, {"seq": i}, None) for i in range(N)]
    produce(hc.topic, msgs)
    assert wait_settled(hc.sub, N, timeout=120) == {"processed": N}
    wait_outbox_drained(timeout=120)
    assert len(read_topic(out)) == N

    assert retry_conn(lambda c: query_one(c, "SELECT eventbox.reprocess(%s)", (hc.sub,))) == N
    blocker = msgs[50]

    def blocker_pid(c):
        rows = query(c, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventbox handler' "
                        "AND application_name = %s AND wait_event = 'PgSleep'",
                     ("eventbox-replay-blocker " + blocker.mid,))
        return rows[0][0] if rows else None
    pid = wait_until(lambda: retry_conn(blocker_pid), 60, 0.1, "the replay of seq 50 to run")
    old = retry_conn(eventbox_pids)
    sigkill(pid)
    wait_workers(timeout=120, not_pids=old)
    assert wait_settled(hc.sub, N, timeout=120) == {"processed": N}

    def check(c):
        return (query(c, hc.q("SELECT message_id, mode FROM {s}.ledger")),
                dict(query(c, "SELECT mode, count(*) FROM eventbox.inbox WHERE subscription = %s "
                              "GROUP BY 1", (hc.sub,))),
                query(c, "SELECT caused_by, mode FROM eventbox.suppressed_sends "
                         "WHERE subscription = %s", (hc.sub,)),
                query_one(c, "SELECT attempts FROM eventbox.inbox WHERE subscription = %s "
                             "AND message_id = %s", (hc.sub, blocker.mid)))
    ledger, modes, suppressed, blocker_attempts = retry_conn(check)
    replays = collections.Counter(m for m, mode in ledger if mode == "replay")
    lost = [m.mid for m in msgs if replays[m.mid] == 0]
    dups = [m for m, n in replays.items() if n > 1]
    suppressed_per = collections.Counter(m for m, _ in suppressed)
    wait_outbox_drained(timeout=60)
    published = len(read_topic(out))
    report("modes_sigkill_replay", messages=N, lost=len(lost), duplicated=len(dups),
           suppressed=len(suppressed), published_by_replay=published - N,
           blocker_attempts=blocker_attempts)
    assert modes == {"replay": N}
    assert lost == [] and dups == []
    assert sorted(suppressed_per) == sorted(m.mid for m in msgs)
    assert set(suppressed_per.values()) == {1} and {mode for _, mode in suppressed} == {"replay"}
    assert published == N   # the replay published nothing
    assert blocker_attempts == 2   # the killed attempt counted, the next one processed it
