#!/usr/bin/env bash
# tools/run_tests.sh — run every pg_eventbox test layer against one throwaway
# environment (tools/cluster.sh), always stop it, then scan its server log.
#
# Usage: tools/run_tests.sh [LAYER ...]
#   LAYER: lint regress pgtap unit devbroker integration fault logscan package
#          (default: all, in that order)
#   lint checks the sources (pyflakes over bench/, tools/ and test/, clang-format over the C++)
#   and needs no cluster.
#   Layers that need the cluster (regress pgtap integration fault) start it once;
#   whenever the cluster was started, logscan runs at the end too.
#   package (tools/test_package.sh, as root) builds the Debian package, installs it into the
#   system PostgreSQL in place of `make install`'s files (restored afterwards), runs the
#   regression suites against it on a cluster of its own, and removes it; last, once the
#   shared cluster is stopped.
#   Every selected layer runs even after another failed; the exit status is
#   non-zero when any failed, and the failed layers are listed.
#
# Prerequisites: tools/deps.sh done; extension built and installed
# (`make install`, as root); dev broker built (tools/devbroker/eventbox-devbroker).
#
# Environment:
#   EVENTBOX_KEEP=1      leave the cluster running at the end and print how to use it
#   EVENTBOX_PORT=N      PostgreSQL port (default: first free port from 54329 up)
#   EVENTBOX_PRELOAD, EVENTBOX_NO_BROKER, EVENTBOX_DEVBROKER, EVENTBOX_PGBIN
#                        passed on to tools/cluster.sh (see there)
#   PYTEST_ADDOPTS       extra pytest options (pytest reads it itself)
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
PYTHON=/usr/bin/python3
ALL_LAYERS=(lint regress pgtap unit devbroker integration fault logscan package)

export PYTHONDONTWRITEBYTECODE=1
export EVENTBOX_DEVBROKER=${EVENTBOX_DEVBROKER:-$REPO/tools/devbroker/eventbox-devbroker}
PGBIN=${EVENTBOX_PGBIN:-/usr/lib/postgresql/15/bin}

say() { echo "run_tests: $*"; }

# ---- arguments ---------------------------------------------------------------
layers=()
if (($# == 0)); then
  layers=("${ALL_LAYERS[@]}")
else
  for a in "$@"; do
    case "$a" in
      lint | regress | pgtap | unit | devbroker | integration | fault | logscan | package) layers+=("$a") ;;
      log) layers+=(logscan) ;;
      -h | --help) sed -n '2,26p' "$0"; exit 0 ;;
      *) echo "run_tests: unknown layer '$a' (known: ${ALL_LAYERS[*]})" >&2; exit 2 ;;
    esac
  done
fi
has_layer() {
  local l
  for l in "${layers[@]}"; do [[ "$l" == "$1" ]] && return 0; done
  return 1
}
need_cluster=0
for l in regress pgtap integration fault; do has_layer "$l" && need_cluster=1; done
if ((need_cluster)) && ! has_layer logscan; then layers+=(logscan); fi
# package swaps the system install: last, after the shared cluster stopped (logscan).
if has_layer package; then
  rest=()
  for l in "${layers[@]}"; do [[ "$l" == package ]] || rest+=("$l"); done
  layers=("${rest[@]}" package)
fi

cd "$REPO"

# ---- cluster -------------------------------------------------------------------
ENV_DIR=""
cluster_ok=0
stopped=0

stop_cluster() {
  ((stopped)) && return 0
  stopped=1
  [[ -n "$ENV_DIR" ]] || return 0
  if [[ "${EVENTBOX_KEEP:-}" == 1 ]]; then
    say "EVENTBOX_KEEP=1: environment left running in $ENV_DIR"
    say "  connect:  . $ENV_DIR/env && psql      (or: tools/cluster.sh psql $ENV_DIR)"
    say "  stop:     tools/cluster.sh stop $ENV_DIR"
    return 0
  fi
  "$SCRIPT_DIR/cluster.sh" stop "$ENV_DIR" || say "WARNING: cluster.sh stop $ENV_DIR failed"
}
# A layer runs in the background and is waited for, so that a signal is acted
# on at once (bash defers traps while a foreground command runs): the layer's
# process tree is terminated, then the EXIT trap stops the cluster.
layer_pid=""
kill_tree() {
  local p=$1 c
  for c in $(ps -o pid= --ppid "$p" 2>/dev/null); do kill_tree "$c"; done
  kill -TERM "$p" 2>/dev/null || true
}
on_signal() {
  trap - INT TERM
  echo "run_tests: interrupted (signal), stopping" >&2
  [[ -n "$layer_pid" ]] && kill_tree "$layer_pid"
  exit "$1"
}
trap stop_cluster EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start_cluster() {
  local preload=${EVENTBOX_PRELOAD-pg_eventbox}
  if [[ "$preload" == *pg_eventbox* ]]; then
    local libdir sharedir
    libdir=$("$PGBIN/pg_config" --pkglibdir 2>/dev/null || echo /usr/lib/postgresql/15/lib)
    sharedir=$("$PGBIN/pg_config" --sharedir 2>/dev/null || echo /usr/share/postgresql/15)
    if [[ ! -f "$libdir/pg_eventbox.so" || ! -f "$sharedir/extension/pg_eventbox.control" ]]; then
      say "ERROR: pg_eventbox is not installed ($libdir/pg_eventbox.so, $sharedir/extension/pg_eventbox.control); run 'make install' as root first"
      return 1
    fi
  fi
  local port=${EVENTBOX_PORT:-}
  if [[ -z "$port" ]]; then
    port=54329
    while port_in_use "$port" && ((port < 54429)); do port=$((port + 1)); done
  fi
  ENV_DIR=$(mktemp -d /tmp/eventbox-test.XXXXXX)
  say "starting environment in $ENV_DIR (port $port)"
  if ! "$SCRIPT_DIR/cluster.sh" start "$ENV_DIR" --port "$port"; then
    say "ERROR: could not start the test environment (logs in $ENV_DIR)"
    return 1
  fi
  # shellcheck source=/dev/null
  . "$ENV_DIR/env"
  cluster_ok=1
}

# ---- layers ----------------------------------------------------------------------
need_cluster_ok() {
  ((cluster_ok)) && return 0
  echo "layer needs the test environment, which did not start" >&2
  return 1
}

# The lint layer runs every check of LINT_CHECKS (a function lint_<check> each), all of them
# even after one failed.
LINT_CHECKS=(pyflakes clang_format)

# The C++ sources clang-format checks: ours, as git lists them (a file not yet added is not
# checked).
cxx_sources() {
  git -C "$REPO" ls-files 'src/*.cpp' 'src/*.hpp' 'test/unit/*.cpp' 'test/unit/*.hpp' \
    'tools/devbroker/*.cpp'
}

lint_clang_format() {
  # The checked-in .clang-format (100 columns, includes sorted within their blocks); `make
  # format` rewrites the files the same way.
  local files
  mapfile -t files < <(cxx_sources)
  (cd "$REPO" && clang-format --dry-run --Werror "${files[@]}")
}

lint_pyflakes() {
  # python3-pyflakes: unused imports and variables, undefined names, redefinitions.
  "$PYTHON" -m pyflakes bench tools test
}

layer_lint() {
  local check failed=()
  for check in "${LINT_CHECKS[@]}"; do
    echo "lint: $check"
    "lint_$check" || failed+=("$check")
  done
  if ((${#failed[@]})); then
    echo "lint: failed: ${failed[*]}" >&2
    return 1
  fi
}

layer_regress() {
  need_cluster_ok
  rm -f "$REPO/regression.diffs" "$REPO/regression.out"
  # PGHOST/PGPORT/PGUSER are exported from the env file as well.
  if ! make -C "$REPO" installcheck PGHOST="$PGHOST" PGPORT="$PGPORT" PGUSER=postgres; then
    if [[ -f "$REPO/regression.diffs" ]]; then
      local n
      n=$(wc -l <"$REPO/regression.diffs")
      echo "---- $REPO/regression.diffs ($n lines, first 400) ----"
      head -n 400 "$REPO/regression.diffs"
      echo "---- end of regression.diffs ----"
    fi
    return 1
  fi
}

layer_pgtap() {
  need_cluster_ok
  local files=()
  shopt -s nullglob
  files=(test/pgtap/*.sql)
  shopt -u nullglob
  if ((${#files[@]} == 0)); then
    echo "ERROR: no pgTAP tests: test/pgtap/*.sql matches nothing" >&2
    return 1
  fi
  # pgTAP itself is made available; the tests create pg_eventbox themselves.
  "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -c 'CREATE EXTENSION IF NOT EXISTS pgtap' >/dev/null
  pg_prove --psql-bin "$PGBIN/psql" -h "$PGHOST" -p "$PGPORT" -U postgres -d "$PGDATABASE" \
    "${files[@]}"
}

layer_unit() {
  # Released install and upgrade scripts never change (a change goes into the next release's
  # upgrade script): their checksums are recorded in extension/released.sha256.
  (cd "$REPO/extension" && sha256sum --check --strict released.sha256)
  local build=$REPO/build/unit
  cmake -S "$REPO" -B "$build" -DCMAKE_BUILD_TYPE=Debug
  cmake --build "$build" -j2
  ctest --test-dir "$build" --output-on-failure --no-tests=error
}

run_pytest() {
  local dir=$1 rc=0
  "$PYTHON" -m pytest -q -p no:cacheprovider "$dir" || rc=$?
  if ((rc == 5)); then
    echo "ERROR: pytest collected no tests in $dir" >&2
  fi
  return "$rc"
}

layer_devbroker() {
  if [[ ! -d test/devbroker ]]; then
    echo "no test/devbroker directory: nothing to run"
    return 0
  fi
  [[ -x "$EVENTBOX_DEVBROKER" ]] || {
    echo "ERROR: dev broker binary missing: $EVENTBOX_DEVBROKER (build it first)" >&2
    return 1
  }
  run_pytest test/devbroker
}

layer_integration() {
  need_cluster_ok
  if [[ ! -d test/integration ]]; then
    echo "ERROR: test/integration does not exist" >&2
    return 1
  fi
  run_pytest test/integration
}

layer_fault() {
  need_cluster_ok || return 1
  if [[ ! -d test/fault ]]; then
    echo "ERROR: test/fault does not exist" >&2
    return 1
  fi
  run_pytest test/fault
}

layer_package() {
  "$SCRIPT_DIR/test_package.sh"
}

layer_logscan() {
  need_cluster_ok
  "$SCRIPT_DIR/check_log.sh" "$EVENTBOX_LOG" "$EVENTBOX_KILLED_PIDS"
}

# ---- main ------------------------------------------------------------------------
if ((need_cluster)); then
  start_cluster || true
fi

passed=()
failed=()
declare -A took
t_all=$EPOCHREALTIME
for l in "${layers[@]}"; do
  echo
  echo "==================== [$l] start ===================="
  t0=$EPOCHREALTIME
  # Scan the log after shutdown, so that crashes during shutdown are seen too.
  [[ "$l" == logscan ]] && stop_cluster
  # Run the layer in a subshell with errexit on (not inside if/||, which would
  # disable errexit in the layer), so the first failing command fails the layer;
  # in the background, see on_signal. Its stdin is /dev/null (no TTY needed).
  set +e
  (
    set -e
    "layer_$l"
  ) &
  layer_pid=$!
  wait "$layer_pid"
  rc=$?
  layer_pid=""
  set -e
  dt=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  took[$l]=$dt
  if ((rc == 0)); then
    passed+=("$l")
    echo "==================== [$l] PASS (${dt}s) ===================="
  else
    failed+=("$l")
    echo "==================== [$l] FAIL (exit $rc, ${dt}s) ===================="
    if [[ "$l" =~ ^(regress|pgtap|integration|fault)$ ]] && ((cluster_ok)); then
      echo "---- last 30 lines of $EVENTBOX_LOG ----"
      tail -n 30 "$EVENTBOX_LOG" || true
      echo "----"
    fi
  fi
done

stop_cluster

total=$(awk -v a="$t_all" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
echo
echo "==================== summary (${total}s) ===================="
for l in "${layers[@]}"; do
  status=PASS
  for f in "${failed[@]}"; do [[ "$f" == "$l" ]] && status=FAIL; done
  printf '  %-12s %s  %ss\n' "$l" "$status" "${took[$l]}"
done
[[ -n "$ENV_DIR" ]] && echo "  environment and logs: $ENV_DIR"
echo "layers: ${#passed[@]} passed, ${#failed[@]} failed"
if ((${#failed[@]} == 0)) && [[ -n "$ENV_DIR" && "${EVENTBOX_KEEP:-}" != 1 ]]; then
  rm -rf "${ENV_DIR:?}/data" # all passed: keep only the logs
fi
if ((${#failed[@]})); then
  echo "run_tests: FAILED layers: ${failed[*]}"
  exit 1
fi
echo "run_tests: all layers passed"
