"""Latency runs: messages sent at a steady rate while a consumer of their topic, a process of
its own (consumer.py), records when each arrives; and the percentiles of such series."""

import json
import os
import statistics
import subprocess
import sys
import time

from .common import BenchError
from .messages import PARTITIONS

CONSUMER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "consumer.py")


def latency_stats(xs):
    """p50, p99, max, min and mean of the latencies xs."""
    xs = sorted(xs)

    def pct(q):
        return xs[min(len(xs) - 1, int(round(q / 100.0 * (len(xs) - 1))))]
    return {"p50": pct(50), "p99": pct(99), "max": xs[-1], "min": xs[0],
            "mean": statistics.fmean(xs)}


def paced_latency(env, tmpdir, topic, rate, seconds, fetch_wait_ms, send, dump_prefix=""):
    """Calls send(i) -> message_id at `rate` per second for `seconds`, recording the client time
    when it returned, while a consumer (a separate process, started first, assigned to every
    partition of `topic` at its end offset) records when each message_id arrives. With
    dump_prefix, the series goes to <dump_prefix>.<topic>.json."""
    out = os.path.join(tmpdir, topic + ".json")
    stop_file = os.path.join(tmpdir, topic + ".stop")
    cons = subprocess.Popen(
        [sys.executable, CONSUMER, "--bootstrap", env.bootstrap,
         "--topic", topic, "--partitions", str(PARTITIONS), "--out", out,
         "--stop-file", stop_file, "--fetch-wait-ms", str(fetch_wait_ms), "--drain-s", "15"],
        stdout=subprocess.PIPE)
    try:
        if cons.stdout.readline().strip() != b"READY":
            raise BenchError("latency consumer failed to start")
        n = int(rate * seconds)
        sent = {}
        late = 0
        t0 = time.monotonic()
        for i in range(n):
            target = t0 + i / rate
            now = time.monotonic()
            if target > now:
                time.sleep(target - now)
            elif now - target > 0.05:
                late += 1
            mid = send(i)
            sent[mid] = time.monotonic()
        produce_s = time.monotonic() - t0
        with open(stop_file + ".tmp", "w") as f:
            f.write(str(n))
        os.rename(stop_file + ".tmp", stop_file)
        if cons.wait(60) != 0:
            raise BenchError("latency consumer exited with %d" % cons.returncode)
    finally:
        if cons.poll() is None:
            cons.kill()
            cons.wait()
    with open(out) as f:
        got = json.load(f)
    seen = got["seen"]
    series = sorted((t - t0, (seen[m] - t) * 1000.0) for m, t in sent.items() if m in seen)
    missing = n - len(series)
    if dump_prefix:
        with open("%s.%s.json" % (dump_prefix, topic), "w") as f:
            json.dump(series, f)
    # Stalls: runs of messages slower than 25 ms, as (offset s, messages, worst ms).
    stalls = []
    for off, ms in series:
        if ms < 25.0:
            continue
        if stalls and off - stalls[-1][0] - stalls[-1][3] < 0.1:
            st = stalls[-1]
            stalls[-1] = (st[0], st[1] + 1, max(st[2], ms), off - st[0])
        else:
            stalls.append((off, 1, ms, 0.0))
    if missing:
        raise BenchError("latency (%s): %d of %d messages never reached the consumer"
                         % (topic, missing, n))
    res = latency_stats(x[1] for x in series)
    res.update({"n": n, "achieved_rate": n / produce_s, "dups": got["dups"],
                "late_sends": late, "fetch_wait_ms": fetch_wait_ms,
                "stalls": [(round(a, 2), b, round(c, 1)) for a, b, c, _ in stalls]})
    return res
