"""Per-key order of handling, with ordering 'partition' and 'key': the handler
appends (key, seq) to a log; for every key the logged seqs are increasing,
including when some messages fail once and are retried. With 'partition' the
later messages of a partition wait for the retried one (the log follows the
partition's offsets); with 'key' only the later messages of its key wait."""

import collections
import time
import uuid

import pytest

from eventbox_fixtures import query, report, wait_until
from eventbox_handler_lib import Msg, duplicate_runs, inbox_status, produce, retry_conn, \
    show_duplicates, wait_settled

ORDER_DDL = """
CREATE TABLE {s}.log (
    n          bigserial,          -- order of the handler runs that committed
    message_id text,
    key        text,
    seq        int,
    part       int,
    off        bigint,
    attempts   int,
    pid        int,
    at         timestamptz DEFAULT clock_timestamp()
);
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.log (message_id, key, seq, part, off, attempts, pid)
    VALUES (msg.message_id, convert_from(msg.key, 'UTF8'), (msg.payload->>'seq')::int,
            msg."partition", msg."offset", msg.attempts, pg_backend_pid());
    -- "fail once": the first attempt of the chosen messages fails (and is rolled back)
    IF (msg.payload->>'fail_once')::boolean AND msg.attempts = 1 THEN
        RAISE EXCEPTION 'failing once: key % seq %', convert_from(msg.key, 'UTF8'),
            msg.payload->>'seq';
    END IF;
END $$;
"""

PARTITIONS, KEYS, PER_KEY = 4, 40, 25


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_per_key_order_with_retries(case, ordering):
    hc = case(PARTITIONS)
    hc.setup(ORDER_DDL, ordering=ordering, max_attempts=5, backoff="300 ms",
             backoff_max="600 ms", register=False, unhandled="keep")
    msgs = []
    for seq in range(PER_KEY):
        for k in range(KEYS):
            key = "key-%02d" % k
            # every 3rd key (over all partitions) fails once at seq 2 and 9, early in
            # the stream: plenty of later messages of the partition are there to wait
            fail = k % 3 == 1 and seq in (2, 9)
            msgs.append(Msg(str(uuid.uuid4()), k % PARTITIONS, key,
                            {"seq": seq, "fail_once": fail}, "Ordered"))
    fail_once = {m.mid for m in msgs if m.payload["fail_once"]}
    # all stored first (no handler yet), so passes take long runs of each partition
    produce(hc.topic, msgs)
    wait_until(lambda: retry_conn(lambda c: inbox_status(c, hc.sub)) == {"received": len(msgs)},
               60, what="the messages to wait in the inbox")
    t0 = time.monotonic()
    hc.register()
    status = wait_settled(hc.sub, len(msgs), timeout=120)
    elapsed = time.monotonic() - t0

    def check(c):
        return (query(c, hc.q("SELECT n, message_id, key, seq, part, off, attempts FROM {s}.log "
                              "ORDER BY n")),
                dict(query(c, "SELECT message_id, attempts FROM eventbox.inbox "
                              "WHERE subscription = %s", (hc.sub,))),
                duplicate_runs(c, hc.q("{s}.log")))

    log, attempts, dup_runs = retry_conn(check)
    show_duplicates(dup_runs)
    counts = collections.Counter(r[1] for r in log)
    lost = len({m.mid for m in msgs} - set(counts))
    dups = sum(n - 1 for n in counts.values() if n > 1)

    # order of the first (committed) run of each message; extra runs are counted
    # as duplicates above
    by_key = collections.defaultdict(list)
    by_part = collections.defaultdict(list)
    seen = set()
    for n, mid, key, seq, part, off, _att in log:
        if mid in seen:
            continue
        seen.add(mid)
        by_key[key].append(seq)
        by_part[part].append(off)
    key_violations = {k: s for k, s in by_key.items() if s != sorted(s)}
    part_violations = {p: o for p, o in by_part.items() if o != sorted(o)}
    # how many times a message was handled before an earlier message of its partition
    overtakes = 0
    for offs in by_part.values():
        highest = -1
        for off in offs:
            if off < highest:
                overtakes += 1
            highest = max(highest, off)
    retried_ok = sum(1 for m in fail_once if attempts.get(m) == 2)
    report("handler_order_%s" % ordering, messages=len(msgs), fail_once=len(fail_once),
           retried_ok=retried_ok, logged=len(log), lost=lost, duplicated=dups,
           keys_out_of_order=len(key_violations), partitions_out_of_order=len(part_violations),
           overtaken=overtakes, inbox=status, handled_s="%.1f" % elapsed)

    assert status == {"processed": len(msgs)}
    assert lost == 0
    assert key_violations == {}, "per-key order broken: %r" % {
        k: s for k, s in list(key_violations.items())[:3]}
    assert all(s == list(range(PER_KEY)) for s in by_key.values())
    if ordering == "partition":
        # later messages of a partition waited for the retried one
        assert part_violations == {}, "partition order broken: %d overtakes" % overtakes
    else:
        # with 'key' a retry holds back its key only: other keys of the partition went on
        assert overtakes > 0, "ordering 'key' held back whole partitions"
    assert dups == 0, "\n".join(dup_runs)
    assert retried_ok == len(fail_once), "fail-once messages not processed at attempt 2"
    assert all(attempts[m.mid] == 1 for m in msgs if m.mid not in fail_once)
