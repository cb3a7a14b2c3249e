#!/usr/bin/env bash
# bench/run.sh — pg_eventbox benchmarks (`make bench` runs it after building and installing).
#
# Starts its own PostgreSQL 15 + dev broker with tools/cluster.sh (port 54331), runs
# bench/bench.py, prints the table and writes it to bench/results/latest.txt, and always stops
# the environment again. Every figure is a ratio against a baseline measured in the same run
# (see bench/README.md). Exits 0 unless something is functionally broken.
#
# Environment knobs:
#   BENCH_MESSAGES          messages per throughput run (default 300000)
#   BENCH_REPEAT            throughput runs per side and payload size, best one kept (default 3)
#   BENCH_LATENCY_SECONDS   length of the latency run at 1k msg/s (default 10; 0 skips it)
#   BENCH_BURST=0           skip the burst runs (relay running, one big transaction)
#   BENCH_PORT              PostgreSQL port (default 54331)
#   BENCH_KEEP=1            leave the cluster running and its directory in place afterwards
#   BENCH_SECTIONS          comma-separated sections to run, in this order (default all):
#                           relay (outbox -> Kafka, above), ingest (Kafka -> inbox vs COPY,
#                           naive client, replay), handlers (handler throughput vs
#                           INSERT ... SELECT), e2e (Kafka -> handler commit latency @1k msg/s),
#                           e2e_peer (Kafka -> handler -> Kafka vs bench/peer.py, kill test,
#                           backlog scaling; its figures want a fresh cluster: run it alone),
#                           ops (running for months: relay and ingest with /metrics scraped
#                           every second vs not, ingest + handlers while 1M aged rows are purged
#                           vs not and the lock waits > 100 ms, inbox size over 5 cycles of
#                           ingest -> process -> age -> purge; ~10 min)
#                           http (outbox -> HTTP to a local nginx vs curl --parallel, bench/bench_http.py)
#   BENCH_INGEST_MESSAGES   messages per ingest run (default 100000; 32 partitions: must fit
#                           the mock broker's ~5 MiB per partition at 1 KiB)
#   BENCH_NAIVE_MESSAGES    messages of the naive client baseline (default 5000)
#   BENCH_HANDLER_MESSAGES  inbox rows per handler run (default 50000)
#   BENCH_E2E_SECONDS       length of the e2e latency run at 1k msg/s (default 10; 0 skips it)
#   BENCH_E2E_ORDERS        section e2e_peer (pg_eventbox vs the hand-written peer, bench/peer.py):
#                           orders per run (default 50000)
#   BENCH_E2E_REPEAT        e2e_peer runs per side (default 1; best kept)
#   BENCH_E2E_KILL_ORDERS   orders of the e2e_peer kill test (default 20000; 0 skips it)
#   BENCH_E2E_KILL          worker SIGKILLed in the kill test: relay (default) or handler
#   BENCH_BACKLOG_SIZES     e2e_peer backlog scaling, orders queued per run (default
#                           10000,100000,1000000: the figure compares 1M with 10k; empty skips it)
#   BENCH_OPS_MESSAGES      section ops: messages per scraped/not scraped run (default 300000)
#   BENCH_OPS_REPEAT        section ops: runs per side of the scraped figures (default 6)
#   BENCH_OPS_PURGE_ROWS    section ops: aged processed rows purged during a run (default 1000000)
#   BENCH_OPS_PURGE_MESSAGES section ops: messages of each ingest + handlers run (default 600000)
#   BENCH_OPS_PURGE_REPEAT  section ops: pairs of runs with/without the purge (default 2)
#   BENCH_OPS_CYCLES        section ops: ingest -> process -> age -> purge cycles (default 5)
#   BENCH_OPS_CYCLE_ROWS    section ops: messages per cycle (default 200000)
#   BENCH_HTTP_MESSAGES     messages per HTTP run, ~1 KiB JSON over 64 keys (default 100000)
#   BENCH_HTTP_REPEAT       HTTP runs per side, best kept (default 1)
#   EVENTBOX_PGBIN          PostgreSQL bin dir (default /usr/lib/postgresql/15/bin), e.g. a
#                           relocated copy holding this build (make install DESTDIR=...)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
PY=/usr/bin/python3
MESSAGES=${BENCH_MESSAGES:-300000}
REPEAT=${BENCH_REPEAT:-3}
LATENCY_SECONDS=${BENCH_LATENCY_SECONDS:-10}
BURST=${BENCH_BURST:-1}
PORT=${BENCH_PORT:-54331}
SECTIONS=${BENCH_SECTIONS:-relay,ingest,handlers,e2e,ops,e2e_peer,http}
HTTP_MESSAGES=${BENCH_HTTP_MESSAGES:-100000}
HTTP_REPEAT=${BENCH_HTTP_REPEAT:-1}
INGEST_MESSAGES=${BENCH_INGEST_MESSAGES:-100000}
NAIVE_MESSAGES=${BENCH_NAIVE_MESSAGES:-5000}
HANDLER_MESSAGES=${BENCH_HANDLER_MESSAGES:-50000}
E2E_SECONDS=${BENCH_E2E_SECONDS:-10}
E2E_ORDERS=${BENCH_E2E_ORDERS:-50000}
E2E_REPEAT=${BENCH_E2E_REPEAT:-1}
E2E_KILL_ORDERS=${BENCH_E2E_KILL_ORDERS:-20000}
E2E_KILL=${BENCH_E2E_KILL:-relay}
BACKLOG_SIZES=${BENCH_BACKLOG_SIZES-10000,100000,1000000}
OPS_MESSAGES=${BENCH_OPS_MESSAGES:-300000}
OPS_REPEAT=${BENCH_OPS_REPEAT:-6}
OPS_PURGE_ROWS=${BENCH_OPS_PURGE_ROWS:-1000000}
OPS_PURGE_MESSAGES=${BENCH_OPS_PURGE_MESSAGES:-600000}
OPS_PURGE_REPEAT=${BENCH_OPS_PURGE_REPEAT:-2}
OPS_CYCLES=${BENCH_OPS_CYCLES:-5}
OPS_CYCLE_ROWS=${BENCH_OPS_CYCLE_ROWS:-200000}
export EVENTBOX_PGBIN=${EVENTBOX_PGBIN:-/usr/lib/postgresql/15/bin}
KEEP=${BENCH_KEEP:-0}
RESULTS=$HERE/results

for v in MESSAGES REPEAT INGEST_MESSAGES NAIVE_MESSAGES HANDLER_MESSAGES E2E_ORDERS E2E_REPEAT \
  OPS_MESSAGES OPS_REPEAT OPS_PURGE_ROWS OPS_PURGE_MESSAGES OPS_PURGE_REPEAT OPS_CYCLES OPS_CYCLE_ROWS \
  HTTP_MESSAGES HTTP_REPEAT; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "bench: BENCH_$v must be a positive integer" >&2; exit 2; }
done
[[ "$LATENCY_SECONDS" =~ ^[0-9]+$ ]] || { echo "bench: BENCH_LATENCY_SECONDS must be an integer" >&2; exit 2; }
[[ "$E2E_SECONDS" =~ ^[0-9]+$ ]] || { echo "bench: BENCH_E2E_SECONDS must be an integer" >&2; exit 2; }
[[ "$E2E_KILL_ORDERS" =~ ^[0-9]+$ ]] || { echo "bench: BENCH_E2E_KILL_ORDERS must be an integer" >&2; exit 2; }
[[ "$E2E_KILL" =~ ^(relay|handler)$ ]] || { echo "bench: BENCH_E2E_KILL must be relay or handler" >&2; exit 2; }
[[ "$BACKLOG_SIZES" =~ ^([1-9][0-9]*(,[1-9][0-9]*)*)?$ ]] ||
  { echo "bench: BENCH_BACKLOG_SIZES must be comma-separated positive integers" >&2; exit 2; }
S='(relay|ingest|handlers|e2e|ops|e2e_peer|http)'
[[ "$SECTIONS" =~ ^$S(,$S)*$ ]] ||
  { echo "bench: BENCH_SECTIONS must list some of relay,ingest,handlers,e2e,ops,e2e_peer,http" >&2; exit 2; }
if [[ ",$SECTIONS," == *,http,* ]]; then
  for tool in nginx curl wrk; do
    command -v "$tool" >/dev/null || [[ -x /usr/sbin/$tool ]] ||
      { echo "bench: $tool not found (run tools/deps.sh)" >&2; exit 1; }
  done
fi
command -v kcat >/dev/null || { echo "bench: kcat not found (run tools/deps.sh)" >&2; exit 1; }

if [[ -x "$EVENTBOX_PGBIN/pg_config" ]]; then
  PKGLIB=$("$EVENTBOX_PGBIN/pg_config" --pkglibdir)
else
  PKGLIB=$(pg_config --pkglibdir 2>/dev/null || echo /usr/lib/postgresql/15/lib)
fi
if [[ -f "$REPO/pg_eventbox.so" ]] && ! cmp -s "$REPO/pg_eventbox.so" "$PKGLIB/pg_eventbox.so"; then
  echo "bench: WARNING: $PKGLIB/pg_eventbox.so differs from $REPO/pg_eventbox.so (run make install)" >&2
fi

# Which build is measured (printed with the table): commit, uncommitted changes, installed library.
BUILD="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')"
git -C "$REPO" diff --quiet HEAD -- src extension 2>/dev/null || BUILD="$BUILD+uncommitted"
BUILD="$BUILD, $PKGLIB/pg_eventbox.so md5 $(md5sum "$PKGLIB/pg_eventbox.so" 2>/dev/null | cut -c1-12)"

DIR=$(mktemp -d /tmp/eventbox-bench.XXXXXX)
cleanup() {
  local rc=$?
  if [[ "$KEEP" == 1 ]]; then
    echo "bench: BENCH_KEEP=1: environment left running: . $DIR/env; stop: tools/cluster.sh stop $DIR" >&2
    return
  fi
  "$REPO/tools/cluster.sh" stop "$DIR" >/dev/null 2>&1 || "$REPO/tools/cluster.sh" stop "$DIR" || true
  if ((rc == 0)); then
    rm -rf "$DIR"
  else
    echo "bench: failed (rc=$rc); logs kept in $DIR (postgres.log, broker.log)" >&2
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Section ops scrapes GET /metrics (a postmaster setting) and counts lock waits over 100 ms in
# the server log.
OPS_CONF=()
if [[ ",$SECTIONS," == *,ops,* ]]; then
  OPS_CONF=(--conf "eventbox.metrics_address='127.0.0.1:$((PORT + 1))'"
    --conf 'log_lock_waits=on' --conf "deadlock_timeout='100ms'")
fi

echo "bench: starting the environment in $DIR (port $PORT, PostgreSQL $EVENTBOX_PGBIN)" >&2
"$REPO/tools/cluster.sh" start "$DIR" --port "$PORT" --db eventbox_bench "${OPS_CONF[@]}" \
  --conf 'max_wal_size=4GB' \
  --conf 'checkpoint_timeout=1h' \
  --conf 'shared_buffers=256MB' \
  --conf 'track_commit_timestamp=on' >&2

mkdir -p "$RESULTS"
"$PY" "$HERE/bench.py" run --env-dir "$DIR" --messages "$MESSAGES" \
  --repeat "$REPEAT" --burst "$([[ "$BURST" == 0 ]] && echo 0 || echo 1)" --latency-seconds "$LATENCY_SECONDS" \
  --sections "$SECTIONS" --ingest-messages "$INGEST_MESSAGES" --naive-messages "$NAIVE_MESSAGES" \
  --handler-messages "$HANDLER_MESSAGES" --e2e-seconds "$E2E_SECONDS" --build "$BUILD" \
  --e2e-orders "$E2E_ORDERS" --e2e-repeat "$E2E_REPEAT" --e2e-kill-orders "$E2E_KILL_ORDERS" \
  --e2e-kill "$E2E_KILL" --backlog-sizes "$BACKLOG_SIZES" \
  --ops-messages "$OPS_MESSAGES" --ops-repeat "$OPS_REPEAT" --ops-purge-rows "$OPS_PURGE_ROWS" \
  --ops-purge-messages "$OPS_PURGE_MESSAGES" --ops-purge-repeat "$OPS_PURGE_REPEAT" \
  --ops-cycles "$OPS_CYCLES" --ops-cycle-rows "$OPS_CYCLE_ROWS" \
  --http-messages "$HTTP_MESSAGES" --http-repeat "$HTTP_REPEAT" \
  --out "$RESULTS/latest.txt" --json "$RESULTS/latest.json"
echo "bench: table written to $RESULTS/latest.txt" >&2
