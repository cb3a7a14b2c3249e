#!/usr/bin/env bash
# make demo: a throwaway PostgreSQL with pg_eventbox preloaded plus the dev broker, and the
# outbox pipeline shown live, with a RabbitMQ node (tools/cluster.sh starts one when
# rabbitmq-server is installed). The environment keeps running afterwards so you can look around.
# EVENTBOX_PGBIN (another PostgreSQL's bin directory) and EVENTBOX_RABBITMQ_PORT are passed on to
# tools/cluster.sh.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PORT=${EVENTBOX_DEMO_PORT:-54330}
DIR=${EVENTBOX_DEMO_DIR:-/tmp/eventbox-demo}

if [[ -f "$DIR/env" ]]; then
  echo "demo: stopping the previous demo environment in $DIR"
  "$REPO/tools/cluster.sh" stop "$DIR" >/dev/null 2>&1 || true
fi
rm -rf "$DIR"
"$REPO/tools/cluster.sh" start "$DIR" --port "$PORT" --db app >/dev/null
set -a
# shellcheck disable=SC1091
. "$DIR/env"
set +a

/usr/bin/python3 "$REPO/tools/demo.py" "${EVENTBOX_DEMO_MESSAGES:-5000}"

cat <<INFO

The demo environment is still running:
  psql:        psql -h $PGHOST -p $PGPORT -U postgres app
  Kafka:       kcat -b $EVENTBOX_BOOTSTRAP -C -t orders -e -f '%p/%o %k %h %s\n'
  RabbitMQ:    ${EVENTBOX_AMQP_URL:-(none)}, queue warehouse.invoices (guest/guest)
  server log:  $EVENTBOX_LOG
  stop it:     tools/cluster.sh stop $DIR
INFO
