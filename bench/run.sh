#!/usr/bin/env bash
# bench/run.sh — pg_eventbox benchmarks (`make bench` runs it after building and installing).
#
# Starts its own PostgreSQL 15 + dev broker with tools/cluster.sh (port 54331), runs
# bench/bench.py, prints the table and writes it to bench/results/latest.txt, and always stops
# the environment again. Every figure is a ratio against a baseline measured in the same run
# (see bench/README.md). Exits 0 unless something is functionally broken.
#
# Knobs: the BENCH_* environment variables that choose the sections and their sizes are read by
# bench.py (`bench/bench.py knobs` lists them with their defaults; `check` validates them). This
# script's own:
#   BENCH_PORT              PostgreSQL port (default 54331; section ops also takes the next one
#                           for /metrics)
#   BENCH_KEEP=1            leave the cluster running and its directory in place afterwards
#   BENCH_LOCALE            the cluster's locale (tools/cluster.sh's EVENTBOX_LOCALE): empty (the
#                           default) for initdb's own, the machine's locale, as a user's cluster
#                           gets it; C, or icu:en-US for an ICU one
#   EVENTBOX_PGBIN          PostgreSQL bin dir (default /usr/lib/postgresql/15/bin), e.g. a
#                           relocated copy holding this build (make install DESTDIR=...)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
PY=/usr/bin/python3
PORT=${BENCH_PORT:-54331}
export EVENTBOX_PGBIN=${EVENTBOX_PGBIN:-/usr/lib/postgresql/15/bin}
KEEP=${BENCH_KEEP:-0}
RESULTS=$HERE/results

SECTIONS=$("$PY" "$HERE/bench.py" check) || exit 2
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
EVENTBOX_LOCALE=${BENCH_LOCALE-} "$REPO/tools/cluster.sh" start "$DIR" --port "$PORT" --db eventbox_bench "${OPS_CONF[@]}" \
  --conf 'max_wal_size=4GB' \
  --conf 'checkpoint_timeout=1h' \
  --conf 'shared_buffers=256MB' \
  --conf 'track_commit_timestamp=on' >&2

mkdir -p "$RESULTS"
"$PY" "$HERE/bench.py" run --env-dir "$DIR" --build "$BUILD" \
  --out "$RESULTS/latest.txt" --json "$RESULTS/latest.json" --charts "$RESULTS"
echo "bench: table written to $RESULTS/latest.txt" >&2
