"""The relay publishes only what is durable: "a message is published if and
only if its transaction committed" must hold for transactions that commit
asynchronously too (synchronous_commit = off), whose commit record may still
sit in the WAL buffers in shared memory when the relay sees the row. A backend
crash makes the postmaster reinitialize shared memory: WAL that was not yet
written is gone, and so are the transactions it held, even though their
clients saw COMMIT succeed. The relay must flush the WAL before it offers such
rows to Kafka, or it publishes messages whose transactions then vanish.

The test widens the window (wal_writer_delay = 10s: the WAL writer writes a
partly filled WAL page only that often), sends one message per transaction
from several sessions with synchronous_commit = off, each transaction also
inserting its message id into a ledger table, and crashes the server right
after one sender's commit by SIGKILLing that sender's backend (odd rounds) or
the relay (even rounds: a relay that flushes as it reads leaves only the
commits after its last read unflushed, and flushes no more once killed). After
recovery the ledger holds exactly the transactions that survived. Then:

    published ids  ==  ledger ids

(nothing published whose transaction vanished, nothing durable left
unpublished). The crash must have lost some transactions the clients saw
committed (else the window was not exercised): the crash is repeated until it
does, a few times at most."""

import os
import random
import signal
import threading
import time
import uuid

import psycopg2

from eventbox_fixtures import (connect, env, query, read_topic, report, wait_outbox_drained,
                               wait_relay, with_fresh_connection)

SENDERS = 4
PAUSE = 0.04    # up to 40 ms between a sender's transactions (~150 per second in all)
MIN_ROUNDS = 4   # crashes at least (two of each kind)
MAX_ROUNDS = 8   # at most, until one loses transactions the clients saw committed


class AsyncSender(threading.Thread):
    """Sends one message per transaction with synchronous_commit = off, each
    transaction also inserting the message id into the ledger, until the
    connection breaks (the crash) or `stop` is set. Every message id is new:
    a transaction cut by the crash is not sent again, so a published id can
    only come from the one transaction that sent it.

    committed: ids whose COMMIT returned (the client saw them committed);
    in_doubt: the id whose transaction was cut by the crash (committed or not).
    With kill_after set, the sender SIGKILLs `victim` (default: its own
    backend) right after the first COMMIT that returns after that moment
    (time.monotonic())."""

    def __init__(self, topic, ledger, rnd, n, stop, kill_after=None, victim=None, pause=PAUSE):
        super().__init__(daemon=True, name="eventbox-async-sender-%d-%d" % (rnd, n))
        self.topic = topic
        self.ledger = ledger
        self.rnd = rnd
        self.n = n
        self.stop = stop
        self.kill_after = kill_after
        self.victim = victim        # pid to SIGKILL; None: this sender's own backend
        self.pause = pause
        self.committed = []
        self.in_doubt = []
        self.killed_pid = None
        self.error = None

    def run(self):
        conn = None
        try:
            conn = connect(autocommit=False)
            with conn.cursor() as cur:
                cur.execute("SET synchronous_commit = off")
            conn.commit()
            pid = self.victim or conn.get_backend_pid()
            if self.kill_after is not None:
                # recorded beforehand, so that nothing but os.kill lies between
                # the COMMIT and the crash
                with open(env("EVENTBOX_KILLED_PIDS"), "a") as f:
                    f.write("%d\n" % pid)
            seq = 0
            rng = random.Random()
            while not self.stop.is_set():
                mid = str(uuid.uuid4())
                key = "k%d" % rng.randrange(64)
                try:
                    with conn.cursor() as cur:
                        cur.execute(
                            "SELECT eventbox.send(%s, jsonb_build_object('r', %s, 's', %s, "
                            "'n', %s), key => %s, message_id => %s::uuid); "
                            "INSERT INTO " + self.ledger + " (message_id, round, sender, seq) "
                            "VALUES (%s::uuid, %s, %s, %s)",
                            (self.topic, self.rnd, self.n, seq, key, mid,
                             mid, self.rnd, self.n, seq))
                    conn.commit()
                except psycopg2.Error:
                    # the crash (any error here: the transaction is in doubt at worst)
                    self.in_doubt.append(mid)
                    return
                self.committed.append(mid)
                seq += 1
                if self.kill_after is not None and time.monotonic() >= self.kill_after:
                    self.killed_pid = pid
                    os.kill(pid, signal.SIGKILL)
                    self.kill_after = None
                    continue   # the next statement finds the connection gone
                if self.pause:
                    time.sleep(rng.uniform(0, self.pause))
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass


def ledger_ids(ledger, rnd=None):
    def fetch(c):
        sql = "SELECT message_id::text FROM " + ledger
        args = None
        if rnd is not None:
            sql += " WHERE round = %s"
            args = (rnd,)
        return {r[0] for r in query(c, sql, args)}
    return with_fresh_connection(fetch, 120)


def test_async_commits_published_iff_durable(conn, new_topic, settings):
    topic = new_topic(4)
    ledger = "public.eb_durable_ledger_%s" % uuid.uuid4().hex[:8]
    query(conn, "CREATE TABLE " + ledger + " (message_id uuid PRIMARY KEY, round int NOT NULL, "
                "sender int NOT NULL, seq int NOT NULL, "
                "at timestamptz NOT NULL DEFAULT clock_timestamp())")
    conn.close()
    # The WAL writer writes a partly filled page only every 10 s: an async
    # commit stays in shared memory only, unless something flushes the WAL.
    settings.set("wal_writer_delay", "10s")
    t0 = time.monotonic()
    rounds = []      # per round: (victim, killed pid, committed, in doubt, survived, lost)
    sent = set()     # every id some client tried to send
    lost_ids = set()
    for rnd in range(1, MAX_ROUNDS + 1):
        relay = wait_relay(timeout=120)
        stop = threading.Event()
        # The sender that crashes the server does so 1.5 .. 2.5 s into the round,
        # right after one of its commits, killing its own backend in odd rounds and
        # the relay in even rounds. A relay that flushes as it reads is always just
        # behind the latest commits: killed, it flushes no more, so the commits of
        # the moments before the crash are lost.
        kill_at = time.monotonic() + 1.5 + random.random()
        victim = relay if rnd % 2 == 0 else None
        senders = [AsyncSender(topic, ledger, rnd, n, stop,
                               kill_after=kill_at if n == 0 else None,
                               victim=victim if n == 0 else None)
                   for n in range(SENDERS)]
        for s in senders:
            s.start()
        for s in senders:
            s.join(60)
        stop.set()
        for s in senders:
            s.join(30)
            assert not s.is_alive(), "sender %d of round %d still running" % (s.n, rnd)
            if s.error is not None:
                raise s.error
        assert senders[0].killed_pid is not None, "round %d: no crash" % rnd
        for s in senders[1:]:
            assert s.in_doubt, "sender %d of round %d did not see the crash" % (s.n, rnd)
        wait_relay(timeout=120, not_pid=relay)
        committed = {m for s in senders for m in s.committed}
        in_doubt = {m for s in senders for m in s.in_doubt}
        sent |= committed | in_doubt
        survived = ledger_ids(ledger, rnd)
        assert survived <= committed | in_doubt, "ledger rows no sender wrote"
        lost = committed - survived
        lost_ids |= lost
        rounds.append(("relay" if victim else "sender", senders[0].killed_pid, len(committed),
                       len(in_doubt), len(survived), len(lost)))
        print("round %d: killed %s pid %d; %d committed as seen by the clients, %d in doubt, "
              "%d survived the crash, %d lost" % ((rnd,) + rounds[-1]))
        if lost_ids and rnd >= MIN_ROUNDS:
            break

    wait_outbox_drained(topic, timeout=180)
    durable = ledger_ids(ledger)
    recs = read_topic(topic)
    published = [r.message_id for r in recs]
    pub_set = set(published)
    not_durable = pub_set - durable          # published, transaction gone: the bug
    lost_published = pub_set & lost_ids      # of those: seen committed by a client
    unpublished = durable - pub_set          # durable, never published
    unexpected = pub_set - sent
    dups = len(published) - len(pub_set)
    elapsed = time.monotonic() - t0
    report("relay_async_commit_crash", rounds=len(rounds),
           per_round="; ".join("%s pid %d: %d committed, %d in doubt, %d survived, %d lost" % r
                               for r in rounds),
           lost_in_crash=len(lost_ids), ledger=len(durable), records=len(recs),
           published_not_durable=len(not_durable), of_them_seen_committed=len(lost_published),
           durable_not_published=len(unpublished), unexpected=len(unexpected),
           duplicated=dups, total_s="%.1f" % elapsed)

    c = connect()
    try:
        query(c, "DROP TABLE " + ledger)
    finally:
        c.close()

    assert lost_ids, ("the window was not exercised: %d crash(es) lost no transaction the "
                      "clients saw committed (%r)" % (len(rounds), rounds))
    assert len(not_durable) == 0, ("%d message(s) published whose transaction did not survive the "
                             "crash (%d of them seen committed by the client), e.g. %s"
                             % (len(not_durable), len(lost_published), sorted(not_durable)[:5]))
    assert len(unexpected) == 0, sorted(unexpected)[:5]
    assert len(unpublished) == 0, ("%d durable message(s) never published, e.g. %s"
                             % (len(unpublished), sorted(unpublished)[:5]))
