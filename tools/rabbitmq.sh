#!/usr/bin/env bash
# tools/rabbitmq.sh — a throwaway RabbitMQ node on loopback, for tests, the demo and the bench.
#
# Usage:
#   tools/rabbitmq.sh start DIR [--port PORT]
#   tools/rabbitmq.sh stop DIR
#   tools/rabbitmq.sh restart DIR      (stop, then start again with the same ports and data)
#   tools/rabbitmq.sh status DIR
#   tools/rabbitmq.sh ctl DIR ARGS...  (rabbitmqctl ARGS for this node, e.g. close_all_connections)
#
# start: DIR is created if absent. The node keeps everything in it:
#     DIR/rabbitmq.conf, enabled_plugins    configuration (no plugins: no management, no
#                                           stream protocol; AMQP 0-9-1 reads streams itself)
#     DIR/mnesia, DIR/log, DIR/.erlang.cookie
#     DIR/rabbitmq.pid                      pid of the node's session (setsid)
#     DIR/rabbitmq.env                      sourceable: EVENTBOX_AMQP_URL EVENTBOX_AMQP_PORT
#                                           EVENTBOX_AMQP_NODE EVENTBOX_AMQP_DIR
#   PORT (default: the first free port from 5682 up) is the AMQP listener on 127.0.0.1; the
#   node's Erlang distribution listens on PORT+20000 and its own epmd on PORT+10000, so nodes
#   of different environments never share an epmd. The node name is eventbox-PORT@localhost.
#   Returns once the node answers an AMQP handshake (EVENTBOX_RABBITMQ_TIMEOUT seconds, default
#   60); if it does not, everything it started is stopped and the log is printed.
# stop: `rabbitmqctl stop`, SIGKILL of the node's session if that does not end it within 30 s,
#   then the node's epmd. Safe to call twice or after a failed start.
#
# Runs as root (the node runs as root with HOME=DIR) or as any other user.
set -euo pipefail

RMQ_BIN=${EVENTBOX_RABBITMQ_BIN:-/usr/lib/rabbitmq/bin}
READY_TIMEOUT=${EVENTBOX_RABBITMQ_TIMEOUT:-60}

log() { echo "rabbitmq.sh: $*"; }
die() { echo "rabbitmq.sh: ERROR: $*" >&2; exit 1; }
usage() { sed -n '2,8p' "$0" >&2; exit 2; }

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# True when the AMQP listener on $1 answers the protocol header with a method frame
# (connection.start): the node has booted, not merely bound its port.
amqp_answers() {
  local first
  first=$(
    exec 2>/dev/null
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf 'AMQP\x00\x00\x09\x01' >&3
    # read one byte (frame type 1 = method); od prints it as a number
    timeout 2 head -c 1 <&3 | od -An -tu1 | tr -d ' '
  ) || return 1
  [[ "$first" == 1 ]]
}

# The environment every rabbitmq-* command of this node runs with.
node_env() {
  export HOME=$DIR
  export RABBITMQ_NODENAME=eventbox-$PORT@localhost
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT=$PORT
  export RABBITMQ_DIST_PORT=$((PORT + 20000))
  export ERL_EPMD_PORT=$((PORT + 10000))
  export ERL_EPMD_ADDRESS=127.0.0.1
  export RABBITMQ_MNESIA_BASE=$DIR/mnesia
  export RABBITMQ_LOG_BASE=$DIR/log
  export RABBITMQ_CONFIG_FILE=$DIR/rabbitmq.conf
  export RABBITMQ_ENABLED_PLUGINS_FILE=$DIR/enabled_plugins
  export RABBITMQ_PID_FILE=$DIR/node.pid
  export RABBITMQ_CONF_ENV_FILE=$DIR/rabbitmq-env.conf
  export RABBITMQ_ADVANCED_CONFIG_FILE=$DIR/advanced.config
}

session_alive() {
  local pid
  pid=$(head -n1 "$DIR/rabbitmq.pid" 2>/dev/null || true)
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  [[ "$(ps -o sid= -p "$pid" 2>/dev/null | tr -d ' ')" == "$pid" ]]
}

read_port() {
  [[ -f "$DIR/port" ]] || return 1
  PORT=$(head -n1 "$DIR/port")
  [[ "$PORT" =~ ^[0-9]+$ ]]
}

do_stop() {
  [[ -d "$DIR" ]] || { log "$DIR does not exist, nothing to stop"; return 0; }
  read_port || { log "no node recorded in $DIR"; return 0; }
  node_env
  if session_alive; then
    local pid i
    pid=$(head -n1 "$DIR/rabbitmq.pid")
    log "stopping node eventbox-$PORT@localhost"
    timeout 30 "$RMQ_BIN/rabbitmqctl" -n "$RABBITMQ_NODENAME" stop >/dev/null 2>&1 || true
    for ((i = 0; i < 100; i++)); do
      session_alive || break
      sleep 0.1
    done
    if session_alive; then
      log "node did not stop, sending SIGKILL to its session $pid"
      kill -KILL -- "-$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$DIR/rabbitmq.pid"
  # The node's own epmd (started by erl with ERL_EPMD_PORT): nothing else uses that port.
  epmd -port "$ERL_EPMD_PORT" -kill >/dev/null 2>&1 || true
  return 0
}

do_start() {
  local reuse=${1:-0}
  if ((!reuse)); then
    PORT=""
    shift || true
    while (($#)); do
      case "$1" in
        --port) (($# >= 2)) || die "--port needs a value"; PORT=$2; shift 2 ;;
        --port=*) PORT=${1#--port=}; shift ;;
        *) die "start: unknown option '$1'" ;;
      esac
    done
    if [[ -z "$PORT" ]]; then
      PORT=5682
      while { port_in_use "$PORT" || port_in_use $((PORT + 10000)) ||
        port_in_use $((PORT + 20000)); } && ((PORT < 5782)); do PORT=$((PORT + 1)); done
    fi
    [[ "$PORT" =~ ^[0-9]+$ ]] && ((PORT >= 1024 && PORT <= 45535)) ||
      die "invalid port '$PORT' (1024..45535: the node also uses PORT+10000 and PORT+20000)"
  fi
  [[ -x "$RMQ_BIN/rabbitmq-server" ]] ||
    die "rabbitmq-server not found in $RMQ_BIN (apt-get install rabbitmq-server)"
  local p
  for p in "$PORT" $((PORT + 10000)) $((PORT + 20000)); do
    port_in_use "$p" && die "port $p on 127.0.0.1 is in use (pass --port with a free port)"
  done
  mkdir -p "$DIR/mnesia" "$DIR/log"
  echo "$PORT" >"$DIR/port"
  node_env
  if ((!reuse)); then
    {
      echo "listeners.tcp.1 = 127.0.0.1:$PORT"
      echo "loopback_users = none"
      echo "disk_free_limit.absolute = 1MB"
      echo "vm_memory_high_watermark.relative = 0.6"
    } >"$RABBITMQ_CONFIG_FILE"
    echo "[]." >"$RABBITMQ_ENABLED_PLUGINS_FILE"
    : >"$RABBITMQ_CONF_ENV_FILE"
    echo "[]." >"$RABBITMQ_ADVANCED_CONFIG_FILE"
  fi
  trap 'rc=$?; if ((rc != 0)); then tail -n 40 "$DIR"/log/*.log "$DIR/rabbitmq.out" >&2 2>/dev/null; do_stop || true; fi' EXIT
  log "starting node eventbox-$PORT@localhost on 127.0.0.1:$PORT (in $DIR)"
  # shellcheck disable=SC2016  # $$ and $1 are for the inner shell
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$DIR/rabbitmq.pid" \
    "$RMQ_BIN/rabbitmq-server" </dev/null >>"$DIR/rabbitmq.out" 2>&1 &
  local i
  for ((i = 0; i < READY_TIMEOUT * 4; i++)); do
    amqp_answers "$PORT" && break
    if ((i > 8)) && ! session_alive; then die "the node exited while starting (see $DIR/log)"; fi
    sleep 0.25
  done
  amqp_answers "$PORT" || die "the node did not answer on 127.0.0.1:$PORT within ${READY_TIMEOUT} s"
  local tmp=$DIR/rabbitmq.env.tmp
  {
    printf 'export EVENTBOX_AMQP_URL=%q\n' "amqp://127.0.0.1:$PORT/%2f"
    printf 'export EVENTBOX_AMQP_PORT=%q\n' "$PORT"
    printf 'export EVENTBOX_AMQP_NODE=%q\n' "$RABBITMQ_NODENAME"
    printf 'export EVENTBOX_AMQP_DIR=%q\n' "$DIR"
  } >"$tmp"
  mv -f "$tmp" "$DIR/rabbitmq.env"
  trap - EXIT
  log "ready: amqp://127.0.0.1:$PORT/%2f (guest/guest)"
}

do_status() {
  read_port || die "no node recorded in $DIR"
  if session_alive && amqp_answers "$PORT"; then
    log "node eventbox-$PORT@localhost: running"
  else
    log "node eventbox-$PORT@localhost: not running"
    return 1
  fi
}

(($# >= 2)) || usage
cmd=$1
DIR=$(realpath -m -- "$2")
shift 2
PORT=""
case "$cmd" in
  start) do_start 0 "$@" ;;
  stop) do_stop ;;
  restart) read_port || die "no node recorded in $DIR"; do_stop; do_start 1 ;;
  status) do_status ;;
  ctl) read_port || die "no node recorded in $DIR"; node_env
    exec "$RMQ_BIN/rabbitmqctl" -n "$RABBITMQ_NODENAME" "$@" ;;
  *) usage ;;
esac
