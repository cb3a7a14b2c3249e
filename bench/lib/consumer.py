#!/usr/bin/python3
"""The latency consumer of latency.py, a process of its own: assigned to every partition of a
topic at its end offset, it writes {message_id: receive time (CLOCK_MONOTONIC)} to --out once
--stop-file says how many to expect and they came (or --drain-s passed). Prints READY once it
fetches. Runs as a script: it imports nothing of the bench."""

import argparse
import json
import os
import time

from confluent_kafka import Consumer, TopicPartition


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stop-file", required=True)
    ap.add_argument("--fetch-wait-ms", type=int, default=1)
    ap.add_argument("--drain-s", type=float, default=15)
    args = ap.parse_args()
    c = Consumer({"bootstrap.servers": args.bootstrap, "group.id": "eventbox-bench-latency",
                  "enable.auto.commit": False, "fetch.wait.max.ms": args.fetch_wait_ms,
                  "fetch.error.backoff.ms": 1, "enable.partition.eof": False})
    tps = []
    for p in range(args.partitions):
        _lo, hi = c.get_watermark_offsets(TopicPartition(args.topic, p), timeout=10)
        tps.append(TopicPartition(args.topic, p, hi))
    c.assign(tps)
    # Make sure fetching has started before telling the producer to go.
    t_end = time.monotonic() + 2.0
    while time.monotonic() < t_end:
        c.poll(0.05)
    print("READY", flush=True)
    seen = {}
    dups = 0
    idle_deadline = None
    while True:
        # poll(), not consume(): consume() waits for a full batch or its timeout, which would
        # add up to that timeout to every receive time.
        m = c.poll(0.05)
        now = time.monotonic()
        if m is not None and not m.error():
            mid = None
            for k, v in m.headers() or []:
                if k == "message_id":
                    mid = v.decode()
            if mid is not None and mid in seen:
                dups += 1
            elif mid is not None:
                seen[mid] = now
        if idle_deadline is None and os.path.exists(args.stop_file):
            with open(args.stop_file) as f:
                expected = int(f.read().strip() or "0")
            idle_deadline = time.monotonic() + args.drain_s
        if idle_deadline is not None and (len(seen) >= expected
                                          or time.monotonic() > idle_deadline):
            break
    c.close()
    with open(args.out, "w") as f:
        json.dump({"seen": seen, "dups": dups}, f)


if __name__ == "__main__":
    main()
