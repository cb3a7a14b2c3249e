#!/usr/bin/env bash
# tools/check_log.sh — scan a PostgreSQL server log for crashes.
#
# Usage: tools/check_log.sh LOGFILE [KILLED_PIDS_FILE]
#
# Crash lines are those containing
#   "terminated by signal"                  (backend or background worker died)
#   "server process (PID n) was terminated" (any way, e.g. by exception)
#   "PANIC:"                                (server PANIC)
#   "TRAP:"                                 (failed Assert in an assert-enabled build)
# A line whose "(PID n)" is listed in KILLED_PIDS_FILE (one pid per line,
# appended by tests that SIGKILL a process on purpose; blank lines and
# '#' comments allowed) is expected and ignored.
#
# Exit 0 (one-line summary) when no unexpected crash line is found;
# exit 1 printing the offending lines (with line numbers) otherwise, or when
# LOGFILE is missing; exit 2 on bad usage.
set -euo pipefail

if (($# < 1 || $# > 2)); then
  sed -n '4p' "$0" >&2
  exit 2
fi
logfile=$1
killed=${2:-}

if [[ ! -f "$logfile" ]]; then
  echo "check_log: ERROR: log file not found: $logfile" >&2
  exit 1
fi
if [[ -n "$killed" && ! -e "$killed" ]]; then
  # A test that never killed anything need not create it.
  killed=""
fi

out=$(awk -v killed_file="$killed" '
  BEGIN {
    if (killed_file != "") {
      while ((getline l < killed_file) > 0) {
        sub(/#.*/, "", l); gsub(/[ \t\r]/, "", l)
        if (l ~ /^[0-9]+$/) killed[l] = 1
      }
      close(killed_file)
    }
    bad = 0; expected = 0
  }
  /terminated by signal|server process \(PID [0-9]+\) was terminated|PANIC:|TRAP:/ {
    pid = ""
    if (match($0, /\(PID [0-9]+\)/)) pid = substr($0, RSTART + 5, RLENGTH - 6)
    if (pid != "" && (pid in killed)) { expected++; next }
    bad++
    printf "%s:%d: %s\n", FILENAME, FNR, $0
  }
  END { printf "#SUMMARY %d %d\n", bad, expected }
' "$logfile")

summary=${out##*#SUMMARY }
bad=${summary%% *}
expected=${summary##* }
lines=${out%#SUMMARY *}

if ((bad > 0)); then
  echo "check_log: $bad unexpected crash line(s) in $logfile:"
  printf "%s" "$lines"
  # Core files the crashes left (tools/cluster.sh starts the server with pg_ctl -c).
  shopt -s nullglob
  cores=("$(dirname "$logfile")"/data/core*)
  if ((${#cores[@]} > 0)); then
    echo "check_log: core file(s): ${cores[*]}"
  fi
  echo "check_log: FAIL ($bad unexpected, $expected expected kill(s) ignored)"
  exit 1
fi
echo "check_log: OK, no unexpected crashes in $logfile ($expected expected kill(s) ignored)"
