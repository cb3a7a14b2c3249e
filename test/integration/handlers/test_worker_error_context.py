"""A handler worker's error outside a handler says what the worker was busy with: the CONTEXT
of the ERROR it logs names the subscription, the lane (topic and partition) and the pass
(worker::WorkContext, pushed around each pass of a worker: src/handlers/pass.cpp).

The pass is made to fail outside any handler: a trigger on eventbox.handler_claims refuses the
claim the worker writes for the lane before it runs the lane's messages. Once the trigger is
gone, the worker recovers from its backoff and handles the message."""

import re
import uuid

from eventbox_fixtures import connect, query
from eventbox_handler_lib import Msg, produce, wait_settled

DDL = """
CREATE TABLE {s}.seen (message_id text);
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.seen VALUES (msg.message_id);
END $$;
CREATE FUNCTION {s}.refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.subscription = '{sub}' THEN
        RAISE EXCEPTION 'claim refused by the test for %', NEW.subscription;
    END IF;
    RETURN NEW;
END $$;
"""

# A log message of process `pid` goes on with lines indented by a tab, or with lines of the
# same process that carry the message's other fields.
FIELD_RE = r"^\S+ \S+ \S+ \[%s\] [^:\n]*(CONTEXT|DETAIL|HINT|STATEMENT):  "


def error_messages(text, needle):
    """The ERROR messages of the log text containing `needle`, each with its other lines."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"^\S+ \S+ \S+ \[(\d+)\] [^:\n]*ERROR:  ", line)
        if not m or needle not in line:
            continue
        field = re.compile(FIELD_RE % m.group(1))
        message = [line]
        for more in lines[i + 1:]:
            if not (more.startswith("\t") or field.match(more)):
                break
            message.append(more)
        out.append("\n".join(message))
    return out


def test_worker_error_outside_a_handler_names_subscription_lane_and_pass(case, log_watch):
    hc = case(2)
    hc.setup(DDL)
    trigger = "eb_test_refuse_%s" % uuid.uuid4().hex[:8]
    c = connect()
    try:
        query(c, hc.q("CREATE TRIGGER %s BEFORE INSERT OR UPDATE ON eventbox.handler_claims "
                      "FOR EACH ROW EXECUTE FUNCTION {s}.refuse_claim()" % trigger))
        try:
            produce(hc.topic, [Msg(str(uuid.uuid4()), 1, None, {"n": 1}, None)])
            needle = "claim refused by the test for %s" % hc.sub
            log_watch.wait_for(re.escape(needle), timeout=90)
        finally:
            query(c, "DROP TRIGGER IF EXISTS %s ON eventbox.handler_claims" % trigger)
        messages = error_messages(log_watch.text(), needle)
        assert messages, "no ERROR message with %r in the log" % needle
        named = re.compile(r'CONTEXT:  .*eventbox handler: subscription "%s", lane "%s"\[1\], '
                           r"batch [1-9]\d*" % (re.escape(hc.sub), re.escape(hc.topic)), re.S)
        assert all(named.search(m) for m in messages), "\n\n".join(messages)
        # The worker goes on once nothing refuses its claims.
        assert wait_settled(hc.sub, 1, timeout=90) == {"processed": 1}
    finally:
        c.close()
