"""A handler worker SIGKILLed in the middle of a blocked key's retry (issue 17
part A, on_dead 'block_key'): nothing is lost, nothing runs twice, the key's
messages keep their offset order, and the dead letter was sent once.

Every SIGKILL of a server process makes the postmaster restart the whole
server (crash recovery): the killed pid goes to $EVENTBOX_KILLED_PIDS first
(eventbox_fixtures.sigkill) so that the run's log scan accepts the crash."""

import collections
import uuid

from eventbox_fixtures import query, read_topic, report, sigkill, wait_until
from eventbox_handler_lib import Msg, produce, retry_conn, wait_workers

# The poison message fails until its seq is in `fixed`; its first attempt after retry() (which
# resets attempts) sleeps, and the test kills the worker then; the attempt after the crash is
# its second.
DDL = """
CREATE TABLE {s}.ledger (n bigserial, message_id text, part int, key text, seq int);
CREATE TABLE {s}.fixed (seq int PRIMARY KEY);
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.ledger (message_id, part, key, seq)
    VALUES (msg.message_id, msg."partition", convert_from(msg.key, 'UTF8'),
            (msg.payload->>'seq')::int);
    IF (msg.payload->>'poison')::boolean THEN
        IF NOT EXISTS (SELECT 1 FROM {s}.fixed f WHERE f.seq = (msg.payload->>'seq')::int) THEN
            RAISE EXCEPTION 'poison order %', msg.payload->>'seq';
        END IF;
        IF msg.attempts = 1 THEN
            PERFORM set_config('application_name', 'eventbox-blocker ' || msg.message_id, false);
            PERFORM pg_sleep(60);
        END IF;
    END IF;
END $$;
"""


def eventbox_pids(c):
    return [r[0] for r in query(c, "SELECT pid FROM pg_stat_activity "
                                   "WHERE backend_type LIKE 'eventbox %%'")]


def test_sigkill_during_blocked_key_retry(case, new_topic):
    """200 messages on 2 partitions and 5 keys; the poison message (partition 0,
    key k0) goes dead after 3 attempts and holds back the later k0 messages of
    its partition while everything else is processed. Its cause is fixed and it
    is retried; while its handler runs, the handler worker is SIGKILLed. After
    the restart the attempt is counted, the message runs again alone and is
    processed, then the held messages run: every message has exactly one
    effect, each (partition, key) in offset order, one dead letter on the
    dead-letter topic."""
    hc = case(2)
    dlt = new_topic(1)
    hc.setup(DDL, max_attempts=3, backoff="50 ms", backoff_max="100 ms",
             on_dead="block_key", dead_letter_topic=dlt)
    msgs = [Msg(str(uuid.uuid4()), i % 2, "k%d" % (i % 5), {"seq": i, "poison": i == 20},
                "Order") for i in range(200)]
    poison = msgs[20]
    held = [m for m in msgs if m.partition == poison.partition and m.key == poison.key
            and m.payload["seq"] > 20]
    produce(hc.topic, msgs)

    def state(c):
        return dict(query(c, "SELECT message_id, status FROM eventbox.inbox "
                             "WHERE subscription = %s", (hc.sub,)))

    def blocked(c):
        st = state(c)
        done = sum(1 for s in st.values() if s == "processed")
        return st if st.get(poison.mid) == "dead" and done == len(msgs) - 1 - len(held) else None
    st = wait_until(lambda: retry_conn(blocked), 120, 0.3, "the poison dead, the others done")
    assert {st[m.mid] for m in held} == {"received"}
    assert retry_conn(lambda c: query(
        c, "SELECT held FROM eventbox.blocked_keys WHERE subscription = %s",
        (hc.sub,))) == [(len(held),)]

    def fix_and_retry(c):
        query(c, hc.q("INSERT INTO {s}.fixed VALUES (20)"))
        query(c, "SELECT eventbox.retry(%s, %s)", (hc.sub, poison.mid))
    retry_conn(fix_and_retry)

    def blocker_pid(c):
        rows = query(c, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventbox handler' "
                        "AND application_name = %s AND wait_event = 'PgSleep'",
                     ("eventbox-blocker " + poison.mid,))
        return rows[0][0] if rows else None
    pid = wait_until(lambda: retry_conn(blocker_pid), 60, 0.1, "the retried blocker to run")
    # Nothing behind it ran meanwhile.
    assert retry_conn(lambda c: query(
        c, hc.q("SELECT count(*) FROM {s}.ledger WHERE message_id = ANY(%s)"),
        ([m.mid for m in held],)))[0][0] == 0
    old = retry_conn(eventbox_pids)
    sigkill(pid)
    wait_workers(timeout=120, not_pids=old)

    def all_processed(c):
        st = state(c)
        return st if sum(1 for s in st.values() if s == "processed") == len(msgs) else None
    wait_until(lambda: retry_conn(all_processed), 120, 0.3, "every message processed")

    def check(c):
        return (query(c, hc.q("SELECT message_id, part, key, seq FROM {s}.ledger ORDER BY n")),
                query(c, "SELECT attempts, last_error FROM eventbox.inbox "
                         "WHERE subscription = %s AND message_id = %s", (hc.sub, poison.mid)),
                query(c, "SELECT count(*) FROM eventbox.key_blocks WHERE subscription = %s",
                      (hc.sub,)))
    led, poison_row, blocks = retry_conn(check)
    effects = collections.Counter(r[0] for r in led)
    lost = [m.mid for m in msgs if effects[m.mid] == 0]
    dups = [mid for mid, n in effects.items() if n > 1]
    order_errors = 0
    last = {}
    for _, part, key, seq in led:
        if (part, key) in last and last[(part, key)] > seq:
            order_errors += 1
        last[(part, key)] = seq
    k0 = [seq for _, part, key, seq in led if (part, key) == (poison.partition, poison.key)]
    letters = read_topic(dlt, missing_ok=True)
    report("dead_letters_sigkill_blocked_retry", messages=len(msgs), held=len(held),
           lost=len(lost), duplicated=len(dups), order_errors=order_errors,
           poison_attempts=poison_row[0][0], dead_letters=len(letters))
    assert lost == [] and dups == [] and order_errors == 0
    assert k0 == sorted(k0) and [s for s in k0 if s >= 20][0] == 20
    # retry() reset its attempts; the killed attempt counted, the next one processed it.
    assert poison_row[0][0] == 2
    assert blocks[0][0] <= 1   # a processed block row is dropped at the lane's next read
    assert len(letters) == 1 and letters[0].key == poison.key.encode()
