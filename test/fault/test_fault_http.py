"""Crash of the relay while messages flow to an HTTP destination: SIGKILL the relay while 10k
messages over 64 keys stream to a local endpoint. None may be lost; a message may be requested
again only because its earlier request was in flight (or its outcome not yet committed) at the
kill, and then with the same Idempotency-Key and body; each key's messages are first requested
in order."""
import collections
import json
import pathlib
import sys
import time
import uuid

from eventbox_fixtures import (StreamSender, cancel_unsent, connect, query, report, sigkill,
                               wait_outbox_drained, wait_relay)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "integration" / "http"))
from http_support import Endpoint  # noqa: E402


def test_sigkill_relay_during_http_stream(extension):
    # A little latency per request, so that requests are open when the relay dies.
    ep = Endpoint(lambda n, rec: (time.sleep(0.002), ("status", 204))[1])
    topic = "h_fault_%s" % uuid.uuid4().hex[:8]
    c = connect()
    query(c, "SELECT eventbox.create_http_destination(%s, %s)", (topic, ep.url))
    total = 10000
    sender = StreamSender(topic, total, batch=250, keys=64, pause=0.01, timeout=240)
    sender.start()
    try:
        sender.wait_committed(int(total * 0.4))
        pid = wait_relay()
        in_flight_at_kill = len(ep.snapshot())
        sigkill(pid)
        wait_relay(not_pid=pid, timeout=120)
        sender.finish(timeout=240)
        wait_outbox_drained(topic, timeout=240)
    finally:
        sender.stop_flag.set()
        c = connect()
        cancel_unsent(c, topic)
        query(c, "SELECT eventbox.drop_http_destination(%s)", (topic,))
        c.close()
        ep.close()

    reqs = ep.snapshot()
    copies = collections.defaultdict(list)
    for r in reqs:
        copies[r.key].append(r)
    lost = len(set(sender.ids) - set(copies))
    unexpected = len(set(copies) - set(sender.ids))
    dups = len(reqs) - len(copies)
    report("fault_http_sigkill_relay", messages=total, requests=len(reqs), lost=lost,
           duplicated=dups, unexpected=unexpected, requests_before_kill=in_flight_at_kill,
           sender_reconnects=sender.reconnects)
    assert lost == 0
    assert unexpected == 0
    # Every copy of a message is the same request: same Idempotency-Key (the message id) and body.
    for key, rs in copies.items():
        assert all(r.body == rs[0].body for r in rs), key
        assert all(r.headers["idempotency-key"] == '"%s"' % key for r in rs)
    # Redelivery is bounded by what was open or not yet recorded at the kill, not the stream.
    assert dups < total // 4, dups
    # Per key, the first request of each message comes in send order.
    first_seen = collections.defaultdict(list)
    seen = set()
    for r in reqs:
        if r.key in seen:
            continue
        seen.add(r.key)
        body = json.loads(r.body)
        first_seen[body["key"]].append(body["seq"])
    for key, seqs in first_seen.items():
        assert seqs == sorted(seqs), (key, seqs[:20])


def test_sigkill_relay_during_bulk_stream(extension):
    """The same crash with bulk requests (batch_size 50, json_array): no message lost, a message
    sent again only inside a request of the same kind, with its own id and body; each key at most
    once per request, and each key's messages first requested in order."""
    ep = Endpoint(lambda n, rec: (time.sleep(0.005), ("status", 200))[1])
    topic = "h_fault_bulk_%s" % uuid.uuid4().hex[:8]
    c = connect()
    query(c, "SELECT eventbox.create_http_destination(%s, %s, batch_size => 50, "
             "batch_wait => '20ms', max_in_flight => 8)", (topic, ep.url))
    total = 10000
    sender = StreamSender(topic, total, batch=250, keys=256, pause=0.01, timeout=240)
    sender.start()
    try:
        sender.wait_committed(int(total * 0.4))
        pid = wait_relay()
        requests_at_kill = len(ep.snapshot())
        sigkill(pid)
        wait_relay(not_pid=pid, timeout=120)
        sender.finish(timeout=240)
        wait_outbox_drained(topic, timeout=240)
    finally:
        sender.stop_flag.set()
        c = connect()
        cancel_unsent(c, topic)
        query(c, "SELECT eventbox.drop_http_destination(%s)", (topic,))
        c.close()
        ep.close()

    reqs = ep.snapshot()
    copies = collections.defaultdict(list)
    order = []
    for r in reqs:
        records = r.json()
        assert len({x["key"] for x in records}) == len(records), "a key twice in one request"
        for x in records:
            copies[x["id"]].append(x)
            order.append(x)
    lost = len(set(sender.ids) - set(copies))
    unexpected = len(set(copies) - set(sender.ids))
    dups = len(order) - len(copies)
    report("fault_http_bulk_sigkill_relay", messages=total, requests=len(reqs),
           records=len(order), lost=lost, duplicated=dups, unexpected=unexpected,
           requests_before_kill=requests_at_kill, sender_reconnects=sender.reconnects)
    assert lost == 0
    assert unexpected == 0
    for mid, xs in copies.items():
        assert all(x == xs[0] for x in xs), mid
    assert dups < total // 4, dups
    assert len(reqs) < total // 10, "bulk requests, not one per message"
    first_seen = collections.defaultdict(list)
    seen = set()
    for x in order:
        if x["id"] in seen:
            continue
        seen.add(x["id"])
        first_seen[x["payload"]["key"]].append(x["payload"]["seq"])
    for key, seqs in first_seen.items():
        assert seqs == sorted(seqs), (key, seqs[:20])
