"""Durable lane positions (docs/design/handlers.md, "Lane positions"; issue 31): the handler
workers raise a lane's position (eventbox.inbox_positions) past what they handled, in each
transaction that commits outcomes, never past the next offset the ingest stores at; rows made
to wait below it by hand, an INSERT of a new row or an UPDATE of a handled one, lower it and are
handled and never left behind."""

import uuid

from eventbox_fixtures import connect, query, report, wait_until
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


SEEN_DDL = """
CREATE TABLE {s}.seen (message_id text, "offset" bigint, position bigint);
-- The lane's live position as the handler's transaction sees it (the handler's role may not
-- read eventbox.inbox_positions).
CREATE FUNCTION {s}.position_now(m eventbox.inbox) RETURNS bigint LANGUAGE sql
    SECURITY DEFINER SET search_path = pg_catalog AS $$
  SELECT p.position FROM eventbox.inbox_positions p
   WHERE p.subscription = m.subscription AND p.topic = m.topic
     AND p."partition" = m."partition" AND NOT p.replay
$$;
CREATE FUNCTION {s}.handle(m eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- Held back while the test holds the lock: the backlog is stored meanwhile, and the
    -- passes after the first are full ones (256 messages, 4 run transactions of 64).
    PERFORM pg_advisory_xact_lock_shared(%(lock)d);
    INSERT INTO {s}.seen VALUES (m.message_id, m."offset", {s}.position_now(m));
END $$;
"""

PASS_TRANSACTION = 64   # messages per run transaction of a worker (handlers/runner.hpp)


def test_positions_rise_with_each_run_transaction(case):
    """A pass of 256 messages commits every 64: each of those commits raises the lane's live
    position past what it handled (docs/design/handlers.md, "Lane positions"), so a message
    sees its lane's position at most its own transaction's messages below it, and never above
    it."""
    lock = 31000 + uuid.uuid4().int % 1000
    hc = case(1)
    blocker = connect()
    try:
        query(blocker, "SELECT pg_advisory_lock(%s)", (lock,))
        hc.setup(SEEN_DDL % {"lock": lock})
        msgs = orders(0, 1000)
        produce(hc.topic, msgs)
        wait_until(lambda: retry_conn(lambda c: query(
            c, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s", (hc.sub,)))[0][0]
            == len(msgs) or None, 120, 0.2, "1000 messages stored")
        query(blocker, "SELECT pg_advisory_unlock(%s)", (lock,))
    finally:
        blocker.close()
    all_processed(hc, [m.mid for m in msgs], "1000 processed")
    seen = retry_conn(lambda c: query(c, hc.q('SELECT "offset", position FROM {s}.seen')))
    assert len(seen) == len(msgs), len(seen)
    # Never above a row that waits: the message itself waited when its handler ran.
    above = [(o, p) for o, p in seen if p is not None and p > o]
    assert not above, above[:10]
    # Rows behind the position by a transaction's messages or more: in a pass whose lanes'
    # positions rose only with its last transaction, 3 of each 4 full transactions' messages
    # (about 700 of 1000 here). A pass during which the other worker dropped its marks (every
    # 10 s) does not raise them; a few such passes stay far below half.
    behind = [(o, p) for o, p in seen if p is None or o - p >= PASS_TRANSACTION]
    report("positions_per_transaction", messages=len(seen), behind_by_64_or_more=len(behind))
    assert len(behind) <= len(seen) // 2, behind[:10]


BLOCK_DDL = """
CREATE TABLE {s}.ledger (n bigserial, message_id text, seq int);
CREATE FUNCTION {s}.handle(msg eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF msg.payload->>'poison' = 'true' THEN
        RAISE EXCEPTION 'poison %', msg.message_id;
    END IF;
    INSERT INTO {s}.ledger (message_id, seq) VALUES (msg.message_id, (msg.payload->>'seq')::int);
END $$;
"""


def key_held_behind(hc, poison_status):
    """A poison message of key 'held', two more of its key, then 2,000 of other keys: waits until
    those are handled and the lane's position passed the held key's three (docs/design/
    handlers.md, "Left out": every lane read since starts above them), checks that the poison
    is `poison_status` and the two wait; returns (poison, held, statuses)."""
    poison = Msg(str(uuid.uuid4()), 0, "held", {"seq": 0, "poison": True}, "Order")
    held = [Msg(str(uuid.uuid4()), 0, "held", {"seq": i}, "Order") for i in (1, 2)]
    produce(hc.topic, [poison] + held)
    others = orders(10, 2000)
    produce(hc.topic, others)
    all_processed(hc, [m.mid for m in others], "2000 messages of other keys processed")
    wait_until(lambda: (lambda r: r and r[0][0] >= 1000 or None)(live_position(hc)), 60, 0.2,
               "the position past the held key's messages")

    def statuses():
        return dict(retry_conn(lambda c: query(
            c, "SELECT message_id, status FROM eventbox.inbox WHERE subscription = %s "
               "AND message_id = ANY (%s)", (hc.sub, [poison.mid] + [m.mid for m in held]))))
    assert statuses() == {poison.mid: poison_status, held[0].mid: "received",
                          held[1].mid: "received"}, statuses()
    return poison, held, statuses


def ledger_seqs(hc, seqs):
    return [r[0] for r in retry_conn(lambda c: query(
        c, hc.q("SELECT seq FROM {s}.ledger WHERE seq = ANY (%s) ORDER BY n"), (list(seqs),)))]


def test_a_blocked_key_does_not_hold_the_position(case):
    """A dead message holds its key back (on_dead 'block_key'); the lane's position passes it
    and the held messages with what is handled after them, so the workers' reads do not walk
    those again at each pass; skipping the dead message releases the key and its messages run
    in order."""
    hc = case(1)
    hc.setup(BLOCK_DDL, ordering="key", max_attempts=1, on_dead="block_key")
    poison, held, _ = key_held_behind(hc, "dead")
    retry_conn(lambda c: query(c, "SELECT eventbox.skip(%s, %s)", (hc.sub, poison.mid)))
    all_processed(hc, [m.mid for m in held], "the held messages after the skip")
    assert ledger_seqs(hc, (1, 2)) == [1, 2]


SKIPPER_DDL = BLOCK_DDL.replace("    INSERT INTO", """    IF msg.payload ? 'skip' THEN
        PERFORM {s}.skip_as_owner(msg.payload->>'skip');
    END IF;
    INSERT INTO""") + """
-- skip() needs the subscription's owner: a handler's code reaches it through the owner's function.
CREATE FUNCTION {s}.skip_as_owner(id text) RETURNS void LANGUAGE sql SECURITY DEFINER
    SET search_path = pg_catalog AS $$ SELECT eventbox.skip('{sub}', id) $$;
"""


def test_a_skip_from_a_handler_releases_the_key_of_a_retry(case):
    """A message waiting for its retry holds its key back (ordering 'key') and the position
    passes it with its key's later messages; a handler's own code skips it (skip() in a handler
    worker, whose writes the inbox's trigger leaves out): the held messages run, in order, long
    before the retry would have come due."""
    hc = case(1)
    hc.setup(SKIPPER_DDL, ordering="key", max_attempts=10, backoff="1 hour",
             backoff_max="2 hours")
    poison, held, statuses = key_held_behind(hc, "retry")
    skipper = Msg(str(uuid.uuid4()), 0, "skipper", {"seq": 5000, "skip": poison.mid}, "Order")
    produce(hc.topic, [skipper])
    all_processed(hc, [skipper.mid] + [m.mid for m in held], "the held messages after the skip")
    assert statuses()[poison.mid] == "ignored", statuses()
    assert ledger_seqs(hc, (1, 2, 5000)) == [5000, 1, 2]

def test_the_ingest_writes_no_position(case):
    """The ingest worker's inserts leave the inbox's trigger out (eventbox.worker_role 'ingest'
    in its session): its batches store at or above the lane's next offset to store, which no
    pass raises a position past. Only the first batch it stores in a lane (it cannot tell what
    another process stored before) lowers the lane's position to itself, once; a row inserted
    by hand would write at each transaction."""
    hc = case(1)
    hc.setup(LEDGER_DDL, register=False)

    def stored(n):
        wait_until(lambda: retry_conn(lambda c: query(
            c, "SELECT count(*) FROM eventbox.inbox WHERE subscription = %s", (hc.sub,)))[0][0]
            == n or None, 120, 0.2, "%d messages stored" % n)

    def positions():
        return retry_conn(lambda c: query(
            c, "SELECT position, version FROM eventbox.inbox_positions WHERE subscription = %s",
            (hc.sub,)))

    first = orders(0, 200)
    produce(hc.topic, first)
    stored(200)
    assert positions() == [(0, 0)], positions()
    more = []
    for k in range(5):  # five more batches at least, each its own transaction
        batch = orders(200 + 50 * k, 50)
        produce(hc.topic, batch)
        more += batch
        stored(200 + 50 * (k + 1))
    assert positions() == [(0, 0)], positions()
    hc.register()
    all_processed(hc, [m.mid for m in first + more], "450 processed once the handler is registered")
    wait_until(lambda: (lambda r: r and r[0][0] == r[0][1] == 450 or None)(live_position(hc)),
               60, 0.2, "the position the passes raised, at the next offset")
