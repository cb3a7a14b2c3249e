"""consume -> handle -> produce in one transaction: a handler that calls
eventbox.send() yields exactly one output message id per processed input, and
none for inputs whose attempts failed (rolled back) or that went dead."""

import collections
import json
import time
import uuid

from eventbox_fixtures import query, read_topic, report, wait_outbox_drained
from eventbox_handler_lib import Msg, duplicate_runs, produce, retry_conn, show_duplicates, \
    wait_settled

SEND_DDL = """
CREATE TABLE {s}.ledger (message_id text, out_id uuid, attempts int, pid int,
                         at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    out_id uuid;
BEGIN
    out_id := eventbox.send('{out}',
        jsonb_build_object('in', msg.message_id, 'seq', msg.payload->'seq',
                           'attempt', msg.attempts),
        key => convert_from(msg.key, 'UTF8'),
        headers => jsonb_build_object('event_type', 'Handled', 'in', msg.message_id));
    INSERT INTO {s}.ledger (message_id, out_id, attempts, pid)
    VALUES (msg.message_id, out_id, msg.attempts, pg_backend_pid());
    -- failures after send(): the queued output must be rolled back with the attempt
    IF (msg.payload->>'poison')::boolean THEN
        RAISE EXCEPTION 'poison after send: %', msg.message_id;
    END IF;
    IF (msg.payload->>'fail_once')::boolean AND msg.attempts = 1 THEN
        RAISE EXCEPTION 'failing once after send: %', msg.message_id;
    END IF;
END $$;
"""


def test_handler_send_exactly_one_output_per_processed_input(case, new_topic):
    hc = case(4)
    out = new_topic(4, suffix="_out")
    hc.setup(SEND_DDL.replace("{out}", out), sends=True, max_attempts=3, backoff="50 ms",
             backoff_max="200 ms")
    msgs = []
    for i in range(1500):
        payload = {"seq": i, "poison": i % 50 == 13, "fail_once": i % 50 == 29}
        msgs.append(Msg(str(uuid.uuid4()), i % 4, "k%d" % (i % 37), payload, "Input"))
    poison = {m.mid for m in msgs if m.payload["poison"]}
    fail_once = {m.mid for m in msgs if m.payload["fail_once"]}
    t0 = time.monotonic()
    produce(hc.topic, msgs)
    status = wait_settled(hc.sub, len(msgs), timeout=120)
    wait_outbox_drained(out, timeout=120)
    elapsed = time.monotonic() - t0
    recs = read_topic(out)

    def check(c):
        return (dict(query(c, "SELECT message_id, status FROM eventbox.inbox "
                              "WHERE subscription = %s", (hc.sub,))),
                dict(query(c, hc.q("SELECT out_id::text, message_id FROM {s}.ledger"))),
                duplicate_runs(c, hc.q("{s}.ledger")))

    inbox, ledger_out, dup_runs = retry_conn(check)
    show_duplicates(dup_runs)
    processed = {mid for mid, st in inbox.items() if st == "processed"}
    dead = {mid for mid, st in inbox.items() if st == "dead"}

    # output message ids per input, from the records' headers and payloads
    outs_of = collections.defaultdict(set)
    records_of = collections.Counter()
    bad = []
    for r in recs:
        body = json.loads(r.value)
        hdr = {n: v.decode() for n, v in r.headers}
        if hdr.get("in") != body["in"] or hdr.get("event_type") != "Handled":
            bad.append(r)
        outs_of[body["in"]].add(r.message_id)
        records_of[r.message_id] += 1
    distinct_out = set(records_of)
    per_input = collections.Counter(len(v) for v in outs_of.values())
    lost = len(processed - set(outs_of))                       # processed, no output
    extra = sum(len(outs_of[i]) - 1 for i in processed if len(outs_of.get(i, ())) > 1)
    from_dead = sorted(set(outs_of) & dead)
    unknown = sorted(set(outs_of) - set(inbox))
    not_ledger = len(distinct_out - set(ledger_out))           # output id no committed run made
    kafka_dups = sum(n - 1 for n in records_of.values() if n > 1)   # relay redelivery
    report("handler_send", inputs=len(msgs), processed=len(processed), dead=len(dead),
           records=len(recs), distinct_out_ids=len(distinct_out), lost_outputs=lost,
           extra_outputs=extra, outputs_of_dead=len(from_dead), unknown_inputs=len(unknown),
           out_ids_not_committed=not_ledger, kafka_duplicates=kafka_dups,
           outputs_per_input=dict(per_input), settled_s="%.1f" % elapsed)

    assert dead == poison
    assert processed == set(m.mid for m in msgs) - poison
    assert status == {"processed": len(msgs) - len(poison), "dead": len(poison)}
    assert bad == []
    assert from_dead == [], "dead inputs produced output"
    assert not_ledger == 0, "an output was published whose handler run rolled back"
    assert unknown == []
    assert lost == 0
    assert extra == 0, "\n".join(dup_runs)
    assert len(distinct_out) == len(processed)
    # fail-once inputs: their output comes from the second attempt only
    attempt_of = {json.loads(r.value)["in"]: json.loads(r.value)["attempt"] for r in recs}
    assert all(attempt_of[m] == 2 for m in fail_once)
