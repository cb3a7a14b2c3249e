#!/usr/bin/env bash
# tools/cluster.sh — throwaway PostgreSQL 15 cluster + pg_eventbox dev broker.
#
# Usage:
#   tools/cluster.sh start DIR [--port PORT] [--db NAME] [--conf 'key=value' ...]
#   tools/cluster.sh stop DIR
#   tools/cluster.sh status DIR
#   tools/cluster.sh psql DIR [psql args...]
#
# start: DIR must be absent or empty (e.g. from `mktemp -d /tmp/eventbox.XXXXXX`).
#   It is made owned by `postgres` (mode 755), then:
#     DIR/broker.log, broker.pid, broker.ready   dev broker (--brokers 1 --partitions 4)
#     DIR/data                                   initdb --auth=trust (superuser postgres)
#     DIR/postgres.log                           server log (pg_ctl -l)
#     DIR/.s.PGSQL.PORT                          unix socket (also TCP on 127.0.0.1:PORT)
#     DIR/killed_pids                            empty; tests append PIDs they SIGKILL on purpose
#     DIR/rabbitmq/                              a RabbitMQ node (tools/rabbitmq.sh) on 127.0.0.1
#     DIR/env                                    sourceable: PGHOST PGPORT PGUSER PGDATABASE
#                                                EVENTBOX_{DATADIR,LOG,BOOTSTRAP,CONTROL_HOST,
#                                                CONTROL_PORT,DEVBROKER,PGBIN,ENV_DIR,KILLED_PIDS}
#                                                EVENTBOX_AMQP_{URL,PORT,NODE,DIR} (empty
#                                                without RabbitMQ)
#   Default port 54329, default database eventbox_test (created, owned by postgres;
#   the pg_eventbox extension is NOT created in it). If start fails, whatever it
#   started is stopped again and the logs are printed; DIR is left in place.
# stop: fast shutdown (immediate if that hangs, SIGKILL as last resort), kills
#   the broker; leaves DIR and its logs. Safe to call twice or after a failed start.
#
# Environment knobs (read by `start`):
#   EVENTBOX_LOCALE     the cluster's locale: C (the default: test outputs sort bytewise),
#                       empty for initdb's own default (the environment's locale, as a
#                       user's initdb or pg_createcluster), or icu:LOCALE for an ICU one
#                       (e.g. icu:en-US).
#   EVENTBOX_PRELOAD    shared_preload_libraries value; default 'pg_eventbox'.
#                       Set to empty (EVENTBOX_PRELOAD=) to not set it at all,
#                       e.g. to test these scripts before the extension is installed.
#   EVENTBOX_NO_BROKER  =1: do not start the dev broker; eventbox.brokers = '' and
#                       EVENTBOX_BOOTSTRAP / EVENTBOX_CONTROL_PORT are empty.
#   EVENTBOX_DEVBROKER  dev broker binary; default <repo>/tools/devbroker/eventbox-devbroker.
#   EVENTBOX_PGBIN      PostgreSQL bin dir; default /usr/lib/postgresql/15/bin.
#   EVENTBOX_BROKER_TIMEOUT  seconds to wait for DIR/broker.ready; default 30.
#   EVENTBOX_NO_RABBITMQ =1: do not start a RabbitMQ node; eventbox.amqp_url = ''. Also when
#                       rabbitmq-server is not installed (said in the output).
#   EVENTBOX_RABBITMQ_PORT  the node's AMQP port; default: the first free one from 5682 up (see
#                       tools/rabbitmq.sh for the other ports it takes). Not EVENTBOX_AMQP_PORT:
#                       the env file exports that one, and a cluster started from inside a test
#                       environment (tests start their own) must not ask for the same port.
#
# Runs as root (initdb/pg_ctl are run as `postgres` via runuser) or as any
# non-root user (then everything runs as that user; the DB superuser is still
# named postgres).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
PGBIN=${EVENTBOX_PGBIN:-/usr/lib/postgresql/15/bin}
DEVBROKER=${EVENTBOX_DEVBROKER:-$REPO/tools/devbroker/eventbox-devbroker}
BROKER_READY_TIMEOUT=${EVENTBOX_BROKER_TIMEOUT:-30}

log() { echo "cluster.sh: $*"; }
die() { echo "cluster.sh: ERROR: $*" >&2; exit 1; }

usage() {
  sed -n '2,8p' "$0" >&2
  exit 2
}

# Run a command as the postgres OS user (or as ourselves when not root), from
# inside DIR so that the command never needs access to the caller's cwd.
as_pg() {
  if [[ "$(id -u)" == 0 ]]; then
    (cd "$DIR" && runuser -u postgres -- "$@")
  else
    (cd "$DIR" && "$@")
  fi
}

abspath() {
  local p=$1
  [[ "$p" == /* ]] || p="$PWD/$p"
  # normalise without requiring existence
  realpath -m -- "$p"
}

port_in_use() {
  # true if something accepts TCP connections on 127.0.0.1:$1
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

sql_quote() {
  # 'value' with single quotes doubled, for postgresql.conf
  local v=${1//\'/\'\'}
  printf "'%s'" "$v"
}

# True when $1 (from DIR/broker.pid) is alive and still leads the session that
# start_broker created for it with setsid (guards against a recycled pid).
broker_pid_alive() {
  local pid=$1 sid
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  sid=$(ps -o sid= -p "$pid" 2>/dev/null | tr -d ' ') || return 1
  [[ "$sid" == "$pid" ]]
}

stop_broker() {
  local pidfile=$DIR/broker.pid pid i
  [[ -f "$pidfile" ]] || return 0
  pid=$(head -n1 "$pidfile" 2>/dev/null || true)
  if broker_pid_alive "$pid"; then
    log "stopping dev broker (pid $pid)"
    # signal the whole process group (pgid == pid after setsid)
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do # 10 s
      broker_pid_alive "$pid" || break
      sleep 0.1
    done
    if broker_pid_alive "$pid"; then
      log "dev broker did not exit on SIGTERM within 10 s, sending SIGKILL"
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$pidfile"
}

pg_running() {
  [[ -f "$DIR/data/PG_VERSION" ]] || return 1
  as_pg "$PGBIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1
}

stop_postgres() {
  [[ -d "$DIR/data" ]] || return 0
  pg_running || return 0
  log "stopping PostgreSQL (fast)"
  if as_pg "$PGBIN/pg_ctl" -D "$DIR/data" -m fast -w -t 30 stop >/dev/null; then
    return 0
  fi
  log "fast shutdown did not finish in 30 s, trying immediate"
  if as_pg "$PGBIN/pg_ctl" -D "$DIR/data" -m immediate -w -t 15 stop >/dev/null; then
    return 0
  fi
  local pid
  pid=$(head -n1 "$DIR/data/postmaster.pid" 2>/dev/null || true)
  if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
    log "immediate shutdown failed, sending SIGKILL to postmaster $pid"
    kill -KILL "$pid" 2>/dev/null || true
  fi
}

do_stop() {
  if [[ ! -d "$DIR" ]]; then
    log "$DIR does not exist, nothing to stop"
    return 0
  fi
  local rc=0
  stop_postgres || rc=1
  stop_broker || rc=1
  stop_rabbitmq || rc=1
  ((rc == 0)) && log "stopped ($DIR left in place)"
  return "$rc"
}

show_logs() {
  local f
  for f in "$DIR/broker.log" "$DIR/postgres.log"; do
    if [[ -s "$f" ]]; then
      echo "----- last 40 lines of $f -----" >&2
      tail -n 40 "$f" >&2
      echo "-----" >&2
    fi
  done
}

start_broker() {
  if [[ "${EVENTBOX_NO_BROKER:-}" == 1 ]]; then
    log "EVENTBOX_NO_BROKER=1: not starting the dev broker"
    BOOTSTRAP=""
    CONTROL_PORT=""
    return 0
  fi
  [[ -x "$DEVBROKER" ]] ||
    die "dev broker binary not found or not executable: $DEVBROKER
  (build it first, or set EVENTBOX_DEVBROKER=/path/to/binary, or EVENTBOX_NO_BROKER=1 to skip it)"

  local ready=$DIR/broker.ready
  rm -f "$ready"
  log "starting dev broker: $DEVBROKER"
  # setsid: own session, like the postmaster (pg_ctl detaches too), so a Ctrl-C
  # aimed at the caller does not kill it behind our back; `stop` kills it.
  # The inner shell records its own pid and execs, so the pid file is the
  # broker's pid even if setsid has to fork.
  # shellcheck disable=SC2016  # $$ and $1 are for the inner shell
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$DIR/broker.pid" \
    "$DEVBROKER" --brokers 1 --partitions 4 --ready-file "$ready" \
    </dev/null >"$DIR/broker.log" 2>&1 &

  local i pid="" line=""
  for ((i = 0; i < BROKER_READY_TIMEOUT * 10; i++)); do
    [[ -n "$pid" ]] || pid=$(head -n1 "$DIR/broker.pid" 2>/dev/null || true)
    if [[ -s "$ready" ]]; then
      line=$(head -n1 "$ready")
      break
    fi
    if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
      die "dev broker exited before becoming ready (see $DIR/broker.log)"
    fi
    sleep 0.1
  done
  [[ -n "$line" ]] ||
    die "dev broker did not write $ready within ${BROKER_READY_TIMEOUT} s (see $DIR/broker.log)"

  local re='^bootstrap=([^ ]+) control=([^ :]+):([0-9]+)[[:space:]]*$'
  [[ "$line" =~ $re ]] ||
    die "unexpected ready line from dev broker in $ready: '$line'
  (expected: bootstrap=127.0.0.1:PORT[,...] control=127.0.0.1:PORT)"
  BOOTSTRAP=${BASH_REMATCH[1]}
  CONTROL_PORT=${BASH_REMATCH[3]}
  log "dev broker ready: bootstrap=$BOOTSTRAP control=127.0.0.1:$CONTROL_PORT"
}

start_rabbitmq() {
  AMQP_URL=""
  if [[ "${EVENTBOX_NO_RABBITMQ:-}" == 1 ]]; then
    log "EVENTBOX_NO_RABBITMQ=1: not starting RabbitMQ"
    return 0
  fi
  if [[ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server && -z "${EVENTBOX_RABBITMQ_BIN:-}" ]]; then
    log "rabbitmq-server is not installed: no RabbitMQ node (run tools/deps.sh)"
    return 0
  fi
  local -a args=()
  [[ -n "${EVENTBOX_RABBITMQ_PORT:-}" ]] && args=(--port "$EVENTBOX_RABBITMQ_PORT")
  "$SCRIPT_DIR/rabbitmq.sh" start "$DIR/rabbitmq" "${args[@]}" ||
    die "RabbitMQ did not start (logs in $DIR/rabbitmq/log)"
  # shellcheck source=/dev/null
  AMQP_URL=$(. "$DIR/rabbitmq/rabbitmq.env" && echo "$EVENTBOX_AMQP_URL")
}

stop_rabbitmq() {
  [[ -f "$DIR/rabbitmq/port" ]] || return 0
  "$SCRIPT_DIR/rabbitmq.sh" stop "$DIR/rabbitmq"
}

do_start() {
  local port=54329 db=eventbox_test
  local -a confs=()
  while (($#)); do
    case "$1" in
      --port) (($# >= 2)) || die "--port needs a value"; port=$2; shift 2 ;;
      --port=*) port=${1#--port=}; shift ;;
      --db) (($# >= 2)) || die "--db needs a value"; db=$2; shift 2 ;;
      --db=*) db=${1#--db=}; shift ;;
      --conf) (($# >= 2)) || die "--conf needs a value"; confs+=("$2"); shift 2 ;;
      --conf=*) confs+=("${1#--conf=}"); shift ;;
      *) die "start: unknown option '$1'" ;;
    esac
  done
  if ! [[ "$port" =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then die "invalid port '$port'"; fi
  [[ "$db" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "invalid database name '$db' (use [A-Za-z_][A-Za-z0-9_]*)"
  local c
  for c in "${confs[@]}"; do
    [[ "$c" =~ ^[[:space:]]*[A-Za-z_][A-Za-z0-9_.]*[[:space:]]*= ]] ||
      die "--conf expects 'key=value', got '$c'"
  done

  # --- preflight -----------------------------------------------------------
  [[ -x "$PGBIN/initdb" && -x "$PGBIN/pg_ctl" ]] ||
    die "PostgreSQL binaries not found in $PGBIN (run tools/deps.sh as root)"
  if [[ "$(id -u)" == 0 ]]; then
    id postgres >/dev/null 2>&1 || die "OS user 'postgres' does not exist (run tools/deps.sh)"
    command -v runuser >/dev/null || die "runuser not found (apt-get install util-linux)"
  fi
  if [[ -e "$DIR" ]]; then
    [[ -d "$DIR" ]] || die "$DIR exists and is not a directory"
    [[ -z "$(ls -A "$DIR")" ]] ||
      die "$DIR is not empty (stop the cluster in it and pass a fresh directory, e.g. \$(mktemp -d /tmp/eventbox.XXXXXX))"
  fi
  local sock="$DIR/.s.PGSQL.$port"
  ((${#sock} <= 107)) ||
    die "unix socket path too long (${#sock} > 107 bytes): $sock; use a shorter DIR, e.g. under /tmp"
  port_in_use "$port" &&
    die "port $port on 127.0.0.1 is already in use (pass --port with a free port)"

  # --- directory -----------------------------------------------------------
  mkdir -p "$DIR"
  chmod 755 "$DIR"
  : >"$DIR/killed_pids"
  chmod 666 "$DIR/killed_pids"
  if [[ "$(id -u)" == 0 ]]; then
    chown postgres: "$DIR"
    runuser -u postgres -- test -w "$DIR" -a -x "$DIR" ||
      die "user postgres cannot write to $DIR (a parent directory is not searchable by postgres?); use a directory under /tmp"
  fi

  # From here on a failure stops whatever was started.
  trap 'rc=$?; if ((rc != 0)); then show_logs; log "start failed, cleaning up"; do_stop || true; fi' EXIT

  start_broker
  start_rabbitmq

  # --- initdb + configuration ------------------------------------------------
  log "initdb $DIR/data"
  local locale=${EVENTBOX_LOCALE-C} locale_opts=()
  case "$locale" in
    "") ;;
    icu:?*) locale_opts=(--locale-provider=icu "--icu-locale=${locale#icu:}") ;;
    *) locale_opts=("--locale=$locale") ;;
  esac
  as_pg "$PGBIN/initdb" -D "$DIR/data" -U postgres --auth=trust --no-sync -E UTF8 "${locale_opts[@]}" \
    >"$DIR/initdb.log" 2>&1 || {
    cat "$DIR/initdb.log" >&2
    die "initdb failed (output above, also in $DIR/initdb.log)"
  }

  local preload=${EVENTBOX_PRELOAD-pg_eventbox}
  {
    echo ""
    echo "# ---- added by tools/cluster.sh ----"
    echo "port = $port"
    echo "unix_socket_directories = $(sql_quote "$DIR")"
    echo "listen_addresses = '127.0.0.1'"
    if [[ -n "$preload" ]]; then
      echo "shared_preload_libraries = $(sql_quote "$preload")"
    else
      echo "# shared_preload_libraries not set (EVENTBOX_PRELOAD is empty)"
    fi
    echo "eventbox.database = $(sql_quote "$db")"
    echo "eventbox.brokers = $(sql_quote "$BOOTSTRAP")"
    echo "eventbox.amqp_url = $(sql_quote "$AMQP_URL")"
    [[ -n "$AMQP_URL" ]] && echo "eventbox.amqp_options = 'user=guest,password=guest'"
    echo "logging_collector = off"
    echo "log_line_prefix = '%m [%p] %b '"
    echo "max_worker_processes = 32"
    if ((${#confs[@]})); then
      echo "# --conf"
      printf '%s\n' "${confs[@]}"
    fi
  } >>"$DIR/data/postgresql.conf"

  # --- start ---------------------------------------------------------------
  log "starting PostgreSQL on port $port (socket dir $DIR)"
  # -c: a process that crashes leaves a core file (in DIR/data with the default core_pattern),
  # which tools/check_log.sh names: a crash seen once in a while can then be read.
  as_pg "$PGBIN/pg_ctl" -D "$DIR/data" -c -l "$DIR/postgres.log" -w -t 60 start >/dev/null ||
    die "pg_ctl start failed (see $DIR/postgres.log)"

  if [[ "$db" != postgres ]]; then
    log "creating database $db"
    "$PGBIN/createdb" -h "$DIR" -p "$port" -U postgres -O postgres "$db" ||
      die "createdb $db failed"
  fi

  # --- env file (atomic) ----------------------------------------------------
  local tmp="$DIR/env.tmp.$$"
  {
    echo "# generated by tools/cluster.sh start; source it: . $DIR/env"
    printf 'export PGHOST=%q\n' "$DIR"
    printf 'export PGPORT=%q\n' "$port"
    printf 'export PGUSER=%q\n' postgres
    printf 'export PGDATABASE=%q\n' "$db"
    printf 'export EVENTBOX_DATADIR=%q\n' "$DIR/data"
    printf 'export EVENTBOX_LOG=%q\n' "$DIR/postgres.log"
    printf 'export EVENTBOX_BOOTSTRAP=%q\n' "$BOOTSTRAP"
    printf 'export EVENTBOX_CONTROL_HOST=%q\n' 127.0.0.1
    printf 'export EVENTBOX_CONTROL_PORT=%q\n' "$CONTROL_PORT"
    printf 'export EVENTBOX_DEVBROKER=%q\n' "$DEVBROKER"
    printf 'export EVENTBOX_PGBIN=%q\n' "$PGBIN"
    printf 'export EVENTBOX_ENV_DIR=%q\n' "$DIR"
    printf 'export EVENTBOX_KILLED_PIDS=%q\n' "$DIR/killed_pids"
    if [[ -f "$DIR/rabbitmq/rabbitmq.env" ]]; then
      cat "$DIR/rabbitmq/rabbitmq.env"
    else
      printf 'export EVENTBOX_AMQP_URL= EVENTBOX_AMQP_PORT= EVENTBOX_AMQP_NODE= EVENTBOX_AMQP_DIR=\n'
    fi
  } >"$tmp"
  chmod 644 "$tmp"
  mv -f "$tmp" "$DIR/env"

  trap - EXIT
  log "ready: . $DIR/env   (stop: tools/cluster.sh stop $DIR)"
}

do_status() {
  [[ -d "$DIR" ]] || die "$DIR does not exist"
  local rc=0 pid
  if pg_running; then log "PostgreSQL: running"; else log "PostgreSQL: not running"; rc=1; fi
  pid=$(head -n1 "$DIR/broker.pid" 2>/dev/null || true)
  if broker_pid_alive "$pid"; then
    log "dev broker: running (pid $pid)"
  else
    log "dev broker: not running"
    [[ "${EVENTBOX_NO_BROKER:-}" == 1 ]] || rc=1
  fi
  return "$rc"
}

do_psql() {
  [[ -f "$DIR/env" ]] || die "$DIR/env not found (was 'tools/cluster.sh start $DIR' successful?)"
  # shellcheck source=/dev/null
  . "$DIR/env"
  exec "$EVENTBOX_PGBIN/psql" "$@"
}

(($# >= 2)) || usage
cmd=$1
DIR=$(abspath "$2")
shift 2
BOOTSTRAP=""
CONTROL_PORT=""
AMQP_URL=""

case "$cmd" in
  start) do_start "$@" ;;
  stop) (($# == 0)) || die "stop takes no options"; do_stop ;;
  status) do_status ;;
  psql) do_psql "$@" ;;
  *) usage ;;
esac
