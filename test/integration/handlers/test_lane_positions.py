"""Durable lane positions (docs/design/handlers.md, "Lane positions"; issue 31): the handler
workers raise a lane's position (eventbox.inbox_positions) past what they handled, in the
transaction of their last outcomes, never past the next offset the ingest stores at; rows made
to wait below it by hand, an INSERT of a new row or an UPDATE of a handled one, lower it and are
handled and never left behind."""

import uuid

from eventbox_fixtures import query, wait_until
from eventbox_handler_lib import Msg, produce, retry_conn

LEDGER_DDL = """
CREATE TABLE {s}.ledger (n bigserial, message_id text, seq int);
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.ledger (message_id, seq) VALUES (msg.message_id, (msg.payload->>'seq')::int);
END $$;
"""


def orders(first, n):
    return [Msg(str(uuid.uuid4()), 0, "k%d" % (i % 7), {"seq": i}, "Order")
            for i in range(first, first + n)]


def all_processed(hc, ids, what):
    def done(c):
        rows = query(c, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s "
                        "AND message_id = ANY (%s) AND status = 'processed'", (hc.sub, ids))
        return rows[0][0] == len(ids) or None
    wait_until(lambda: retry_conn(done), 120, 0.2, what)


def live_position(hc):
    """(position, next offset to store) of the lane's live range."""
    return retry_conn(lambda c: query(c, """
        SELECT p.position, o.next_offset FROM eventbox.inbox_positions p
          JOIN eventbox.offsets o USING (subscription, topic, "partition")
         WHERE p.subscription = %s AND p.topic = %s AND p."partition" = 0 AND NOT p.replay""",
                                      (hc.sub, hc.topic)))


def test_positions_rise_to_the_next_offset_and_rows_by_hand_below_them_run(case):
    hc = case(1)
    hc.setup(LEDGER_DDL)
    msgs = orders(0, 300)
    produce(hc.topic, msgs)
    all_processed(hc, [m.mid for m in msgs], "300 processed")
    # The last pass's outcomes carry the rise: the position reaches the next offset.
    wait_until(lambda: (lambda r: r and r[0][0] == r[0][1] or None)(live_position(hc)), 60, 0.2,
               "the lane's position at its next offset")
    position, next_offset = live_position(hc)[0]
    assert position == next_offset == 300, (position, next_offset)

    # A row inserted by hand below the position (a new message at offset 10): lowered, handled.
    retry_conn(lambda c: query(c, """
        INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset",
                                    payload, event_type)
        VALUES (%s, 'by-hand', %s, 0, 10, '{"seq": 1000}', 'Order')""", (hc.sub, hc.topic)))
    all_processed(hc, ["by-hand"], "the row inserted by hand")

    # A handled row made to wait again by an UPDATE by hand: the same.
    retry_conn(lambda c: query(c, "UPDATE eventbox.inbox SET status = 'received' "
                                  "WHERE subscription = %s AND message_id = %s",
                               (hc.sub, msgs[20].mid)))
    all_processed(hc, [msgs[20].mid], "the row made to wait again by hand")
    seqs = [r[0] for r in retry_conn(lambda c: query(c, hc.q("SELECT seq FROM {s}.ledger "
                                                             "ORDER BY n")))]
    assert seqs[:300] == list(range(300)) and sorted(seqs[300:]) == [20, 1000], seqs[295:]
    # The lane's next messages are read from where the position was left, and raise it again.
    more = orders(300, 50)
    produce(hc.topic, more)
    all_processed(hc, [m.mid for m in more], "50 more processed")
    wait_until(lambda: (lambda r: r and r[0][0] == r[0][1] == 350 or None)(live_position(hc)),
               60, 0.2, "the position back at the next offset")
