#!/usr/bin/python3
"""pg_eventbox benchmarks: the driver (bench/run.sh runs it; see bench/README.md).

Reads its knobs from the environment (`bench.py knobs` lists them), runs the selected sections
(bench/sections/, one module each) against the environment tools/cluster.sh started in
--env-dir, prints the table with its notes and writes it to --out (the raw numbers to --json).
Every figure is a ratio against a baseline measured in the same invocation. Exits 0 unless
something is functionally broken (1) or a knob is wrong (2).

Usage:
    bench.py run --env-dir DIR [--build TEXT] [--out FILE] [--json FILE]
    bench.py check      validates the knobs, prints the sections to run
    bench.py knobs      lists the knobs with their defaults
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import textwrap
import time
import types

from lib import charts
from lib.cluster import Env, q1
from lib.common import BenchError, Context
from lib.eventbox import relay_pid, set_brokers
from lib.table import ROW
from sections import (amqp, e2e, e2e_peer, formats, handlers, http, ingest, ingest_dup,
                      ingest_raw, ops, outbox, relay, topics)

# Run in this order (e2e_peer last: its kill test restarts every backend) ...
RUN_ORDER = (relay, outbox, ingest, ingest_raw, ingest_dup, formats, handlers, e2e, ops, http, amqp,
             topics, e2e_peer)
# ... and printed in this one.
PRINT_ORDER = (relay, outbox, ingest, ingest_raw, ingest_dup, formats, handlers, e2e, e2e_peer, ops, http,
               amqp, topics)
SECTIONS = ("relay,ingest,ingest_raw,ingest_dup,formats,handlers,e2e,ops,e2e_peer,http,topics,"
            "amqp,outbox")


def section_name(module):
    return module.__name__.rsplit(".", 1)[1]


class Knob:
    """An environment variable BENCH_<NAME>, read into the attribute <name> of the knobs. Kinds:
    'positive' and 'integer' (>= 0) numbers, 'flag' (0 turns it off), 'text', a comma-separated
    'list' of positive numbers (set but empty: none), 'sections', or a tuple of choices."""

    PATTERNS = {
        "positive": (r"[1-9][0-9]*", "a positive integer"),
        "integer": (r"[0-9]+", "an integer"),
        "list": (r"([1-9][0-9]*(,[1-9][0-9]*)*)?", "comma-separated positive integers"),
        "sections": (r"(%s)(,(%s))*" % ((SECTIONS.replace(",", "|"),) * 2),
                     "list some of " + SECTIONS),
    }

    def __init__(self, name, default, kind, text):
        self.name, self.default, self.kind, self.text = name, default, kind, text
        self.attr = name[len("BENCH_"):].lower()

    def read(self, environ):
        """The knob's value from environ; raises ValueError with the message for a wrong one."""
        raw = environ.get(self.name)
        if raw is None or (raw == "" and self.kind != "list"):
            raw = self.default
        if isinstance(self.kind, tuple):
            if raw not in self.kind:
                raise ValueError("bench: %s must be %s" % (self.name, " or ".join(self.kind)))
            return raw
        if self.kind == "flag":
            return 0 if raw == "0" else 1
        if self.kind == "text":
            return raw
        pattern, want = self.PATTERNS[self.kind]
        if not re.fullmatch(pattern, raw):
            raise ValueError("bench: %s must %s" % (
                self.name, want if self.kind == "sections" else "be " + want))
        if self.kind == "list":
            return [int(x) for x in raw.split(",") if x]
        if self.kind == "sections":
            return raw.split(",")
        return int(raw)


KNOBS = [
    Knob("BENCH_SECTIONS", SECTIONS, "sections",
         "sections to run (comma-separated): relay (outbox -> Kafka vs kcat), ingest (Kafka -> "
         "inbox vs COPY, naive client, replay), handlers (handler throughput vs a multi-row "
         "INSERT), e2e (Kafka -> handler commit latency @1k msg/s), ops (running for months: "
         "/metrics scraped, retention purging, inbox size over cycles; ~30 min), e2e_peer (Kafka "
         "-> handler -> Kafka vs bench/peer.py, kill test, backlog scaling; wants a fresh "
         "cluster: run it alone), http (outbox -> HTTP to a local nginx vs curl --parallel), "
         "topics (subscriptions on as many topics: time to store, fds, idle CPU, exit), "
         "ingest_raw (ingest with raw_payload kept vs not, and the inbox's bytes per row), "
         "ingest_dup (ingest worker CPU per record with 5% producer duplicates vs without), amqp "
         "(outbox -> RabbitMQ vs a librabbitmq publisher, queue and stream -> inbox vs a plain "
         "consumer), outbox (send() + relay cycles with outbox_retention: the outbox's size "
         "after the last cycle vs the first, its dead rows, WAL per message)"),
    Knob("BENCH_MESSAGES", "300000", "positive", "messages per relay throughput run"),
    Knob("BENCH_REPEAT", "3", "positive",
         "runs per side and payload size, best kept (relay, ingest, handlers)"),
    Knob("BENCH_LATENCY_SECONDS", "10", "integer",
         "length of the relay latency run at 1k msg/s (0 skips it)"),
    Knob("BENCH_BURST", "1", "flag", "0 skips the relay burst runs (one big transaction)"),
    Knob("BENCH_LATENCY_DUMP", "", "text",
         "a path prefix: the raw latency series go to PREFIX.<topic>.json"),
    Knob("BENCH_INGEST_MESSAGES", "100000", "positive",
         "messages per ingest run (32 partitions: must fit the dev broker's ~5 MiB per "
         "partition at 1 KiB)"),
    Knob("BENCH_FORMATS_MESSAGES", "50000", "positive",
         "formats: messages per run of each side (Avro via the registry, JSON)"),
    Knob("BENCH_NAIVE_MESSAGES", "5000", "positive", "messages of the naive client baseline"),
    Knob("BENCH_HANDLER_MESSAGES", "50000", "positive", "inbox rows per handler run"),
    Knob("BENCH_E2E_SECONDS", "10", "integer",
         "length of the e2e latency run at 1k msg/s (0 skips it)"),
    Knob("BENCH_E2E_ORDERS", "50000", "positive", "e2e_peer: orders per run"),
    Knob("BENCH_E2E_REPEAT", "1", "positive", "e2e_peer: runs per side, best kept"),
    Knob("BENCH_E2E_KILL_ORDERS", "20000", "integer",
         "e2e_peer: orders of the kill test (0 skips it)"),
    Knob("BENCH_E2E_KILL", "relay", ("relay", "handler"),
         "e2e_peer: the worker SIGKILLed in the kill test"),
    Knob("BENCH_BACKLOG_SIZES", "10000,100000,1000000", "list",
         "e2e_peer: orders queued per backlog run (the figure compares the last with the "
         "first; empty skips them)"),
    Knob("BENCH_OPS_MESSAGES", "300000", "positive",
         "ops: messages per run with and without /metrics scraped"),
    Knob("BENCH_OPS_REPEAT", "6", "positive", "ops: runs per side of the scraped figures"),
    Knob("BENCH_OPS_PART", "all", ("all", "metrics", "metrics_ingest", "purge", "cycles"),
         "ops: run one part only (metrics: the scraped figures; metrics_ingest: their ingest "
         "half, the relay runs skipped)"),
    Knob("BENCH_OPS_PURGE_ROWS", "1000000", "positive",
         "ops: aged processed rows purged during a run"),
    Knob("BENCH_OPS_PURGE_MESSAGES", "600000", "positive",
         "ops: messages of each ingest + handlers run"),
    Knob("BENCH_OPS_PURGE_REPEAT", "2", "positive", "ops: pairs of runs with/without the purge"),
    Knob("BENCH_OPS_CYCLES", "10", "positive", "ops: ingest -> process -> age -> purge cycles"),
    Knob("BENCH_OPS_CYCLE_ROWS", "1000000", "positive", "ops: messages per cycle"),
    Knob("BENCH_OPS_NAPTIME", "1", "integer",
         "ops: autovacuum_naptime during the cycles, in seconds (0: the server's, 60 s stock)"),
    Knob("BENCH_OUTBOX_CYCLES", "10", "positive", "outbox: send() + relay + purge cycles"),
    Knob("BENCH_OUTBOX_MESSAGES", "1000000", "positive", "outbox: messages per cycle"),
    Knob("BENCH_OUTBOX_RETENTION", "10", "positive",
         "outbox: eventbox.outbox_retention during the cycles (seconds)"),
    Knob("BENCH_HTTP_MESSAGES", "100000", "positive",
         "http: messages per run, ~1 KiB JSON over 64 keys"),
    Knob("BENCH_HTTP_REPEAT", "1", "positive", "http: runs per side, best kept"),
    Knob("BENCH_TOPICS_SIZES", "1,100,1000,5000", "list",
         "topics: subscriptions (each on a topic of its own) per run; the first is the "
         "baseline"),
    Knob("BENCH_AMQP_MESSAGES", "50000", "positive",
         "amqp: messages per run, ~1 KiB JSON over 64 keys (each direction)"),
    Knob("BENCH_AMQP_REPEAT", "2", "positive", "amqp: runs per side, best kept"),
    Knob("BENCH_AMQP_BATCH", "1000", "positive",
         "amqp: the subscriptions' batch_size (prefetch) and the plain consumer's batch"),
]


def read_knobs(environ):
    """The knobs as attributes; raises ValueError for the first wrong one."""
    return types.SimpleNamespace(**{k.attr: k.read(environ) for k in KNOBS})


def list_knobs():
    for k in KNOBS:
        print("%s (default: %s)\n%s" % (k.name, k.default or "empty", textwrap.fill(
            k.text, 100, initial_indent="    ", subsequent_indent="    ")))


def run(opts, args):
    env = Env(opts.env_dir)
    conn = env.connect()
    cur = conn.cursor()
    cur.execute("CREATE EXTENSION IF NOT EXISTS pg_eventbox")
    relay_pid(cur)
    set_brokers(cur, env.bootstrap, "running")
    res = {"sections": args.sections,
           "locale": q1(cur, "SELECT CASE WHEN datlocprovider = 'i' THEN 'ICU ' || daticulocale "
                             "ELSE datcollate END FROM pg_database "
                             "WHERE datname = current_database()")}
    pg_groups = {"postgres": env.pg_pids, "broker": lambda: [env.broker_pid]}
    tmpdir = tempfile.mkdtemp(prefix="eventbox-bench.")
    ctx = Context(env, conn, args, pg_groups, tmpdir, res)
    try:
        for section in RUN_ORDER:
            if section_name(section) in args.sections:
                section.run(ctx)
    finally:
        shutil.rmtree(tmpdir)
    rows = [ROW % ("figure", "pg_eventbox", "baseline", "ratio", "target"), "-" * 104]
    notes = []
    for section in PRINT_ORDER:
        rows.extend(section.table_rows(res))
        notes.extend(section.notes(res, args))
    text = "pg_eventbox bench  %s  (%d CPUs; locale %s; sections %s)%s\n%s\n\nnotes:\n%s\n" % (
        time.strftime("%Y-%m-%d %H:%M:%S"), os.cpu_count(), res["locale"], ",".join(args.sections),
        "\nbuild: " + opts.build if opts.build else "", "\n".join(rows),
        "\n".join("  " + line for line in notes))
    print(text)
    if opts.out:
        os.makedirs(os.path.dirname(os.path.abspath(opts.out)), exist_ok=True)
        with open(opts.out, "w") as f:
            f.write(text)
    res["rows"] = rows
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    if opts.charts:
        for path in charts.write_charts(res, opts.charts):
            print("bench: chart %s" % path, file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description="pg_eventbox benchmarks (see bench/README.md)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the sections the knobs select")
    r.add_argument("--env-dir", required=True, help="the environment tools/cluster.sh started")
    r.add_argument("--build", default="", help="which build is measured (printed)")
    r.add_argument("--out", help="the table is written here too")
    r.add_argument("--json", help="the raw numbers are written here")
    r.add_argument("--charts", help="PNG charts are written into this directory (lib/charts.py)")
    sub.add_parser("check", help="validate the knobs; print the sections to run")
    sub.add_parser("knobs", help="list the knobs with their defaults")
    opts = ap.parse_args()
    if opts.cmd == "knobs":
        list_knobs()
        return
    try:
        args = read_knobs(os.environ)
    except ValueError as e:
        print(e, file=sys.stderr)
        sys.exit(2)
    if opts.cmd == "check":
        print(",".join(args.sections))
        return
    try:
        run(opts, args)
    except BenchError as e:
        print("bench: FAILED: %s" % e, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
