#!/usr/bin/env bash
# tools/deps.sh — install the Debian 12 packages pg_eventbox needs to build and test.
#
# Idempotent and fast: each package is checked with dpkg-query; apt-get runs
# (one `apt-get update`, then one `apt-get install`) only when something is
# missing. Works without a TTY (CI=true, no stdin).
#
# As non-root it never installs: it lists what is missing and exits 1.
#
# Usage: tools/deps.sh            install what is missing
#        tools/deps.sh --check    only report; exit 1 if anything is missing
set -euo pipefail

PACKAGES=(
  build-essential g++ make cmake pkg-config
  postgresql-15 postgresql-server-dev-15
  librdkafka-dev nlohmann-json3-dev libssl-dev
  postgresql-15-pgtap libtap-parser-sourcehandler-pgtap-perl
  kcat googletest libgtest-dev
  python3-pytest python3-psycopg2 python3-confluent-kafka python3-kafka python3-pyflakes
  procps util-linux clang-format
  prometheus
  libcurl4-openssl-dev curl nginx-light wrk
  # Schema Registry formats (Avro C, Protobuf descriptors) and their independent encoders.
  libavro-dev libprotobuf-dev libprotoc-dev protobuf-compiler python3-avro python3-protobuf
  # RabbitMQ: the broker the tests start, the C client, the independent Python client.
  rabbitmq-server librabbitmq-dev python3-pika
  # Packaging (make deb) and the benchmark's charts.
  debhelper postgresql-server-dev-all dpkg-dev fakeroot lintian python3-matplotlib
  # The monitoring test reads the alert rules (YAML).
  python3-yaml
)

check_only=0
case "${1:-}" in
  "") ;;
  --check) check_only=1 ;;
  -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
  *) echo "deps.sh: unknown argument: $1 (try --help)" >&2; exit 2 ;;
esac

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "deps.sh: dpkg-query not found: this script supports Debian 12 (bookworm) only." >&2
  exit 1
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "deps.sh: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "deps.sh: missing packages: ${missing[*]}"

if ((check_only)); then
  exit 1
fi

if [[ "$(id -u)" != 0 ]]; then
  {
    echo "deps.sh: not running as root, cannot install. Run as root:"
    echo "  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
  } >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt_opts=(-y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)

echo "deps.sh: apt-get update"
apt-get update -q </dev/null
echo "deps.sh: apt-get install ${missing[*]}"
apt-get install "${apt_opts[@]}" --no-install-recommends "${missing[@]}" </dev/null

# Verify: a package that apt could not install must not pass silently.
still=()
for pkg in "${missing[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || still+=("$pkg")
done
if ((${#still[@]})); then
  echo "deps.sh: still missing after apt-get install: ${still[*]}" >&2
  exit 1
fi
echo "deps.sh: installed ${#missing[@]} package(s)"
