#!/usr/bin/env bash
# tools/test_package.sh — the `package` layer of tools/run_tests.sh: build the Debian package
# (tools/build_deb.sh, lintian included), install it into the system PostgreSQL 15 with
# `apt-get install ./build/deb/postgresql-15-eventbox_*.deb`, run the regression suites
# (`make installcheck`) on a throwaway cluster (tools/cluster.sh) against the packaged files,
# remove the package, and check that it left nothing behind.
#
# The files `make install` put into the system PostgreSQL (pg_eventbox.so, pg_eventbox.control,
# pg_eventbox--*.sql) are moved to build/package-aside/ first, or dpkg would take them over and
# its removal would delete them; they are ALWAYS moved back at the end (EXIT trap), so the other
# layers and the next run find them. A run interrupted hard (SIGKILL) leaves them there: the
# next run puts them back first.
#
# Needs root (apt-get, dpkg). Environment: EVENTBOX_PACKAGE_PORT (default: the first free port
# from 54430 up) for the cluster.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
PKG=postgresql-15-eventbox
SYS_PGBIN=/usr/lib/postgresql/15/bin
PGC=$SYS_PGBIN/pg_config
ASIDE=$REPO/build/package-aside

say() { echo "package: $*"; }
die() { echo "package: ERROR: $*" >&2; exit 1; }

[[ "$(id -u)" == 0 ]] || die "needs root: it installs and removes $PKG with apt-get"
[[ -x "$PGC" ]] || die "$PGC missing (postgresql-server-dev-15)"
LIBDIR=$("$PGC" --pkglibdir)
EXTDIR=$("$PGC" --sharedir)/extension
cd "$REPO"

installed() {
  [[ "$(dpkg-query -W -f='${db:Status-Status}' "$PKG" 2>/dev/null || true)" == installed ]]
}

apt_get() {
  DEBIAN_FRONTEND=noninteractive apt-get -y -q -o Dpkg::Use-Pty=0 "$@" </dev/null
}

# The package out, the set-aside files back (safe to call twice).
ENV_DIR=""
restore() {
  local rc=$?
  set +e
  if [[ -n "$ENV_DIR" ]]; then
    "$SCRIPT_DIR/cluster.sh" stop "$ENV_DIR" >/dev/null 2>&1
    ENV_DIR=""
  fi
  if installed; then
    say "apt-get remove $PKG"
    apt_get remove "$PKG" >/dev/null || { echo "package: apt-get remove $PKG failed" >&2; rc=1; }
  fi
  if [[ -d "$ASIDE" ]]; then
    local f
    for f in "$ASIDE"/lib/* "$ASIDE"/extension/*; do
      [[ -e "$f" ]] || continue
      case "$f" in
        "$ASIDE"/lib/*) mv -f "$f" "$LIBDIR"/ ;;
        *) mv -f "$f" "$EXTDIR"/ ;;
      esac || { echo "package: could not restore $f" >&2; rc=1; }
    done
    rmdir "$ASIDE"/lib "$ASIDE"/extension "$ASIDE" 2>/dev/null
    say "make install's files restored into $LIBDIR and $EXTDIR"
  fi
  return "$rc"
}

# A run killed before its trap ran: undo it first.
if [[ -d "$ASIDE" ]]; then
  say "files of an interrupted run in $ASIDE: restoring them first"
  restore || die "could not restore $ASIDE"
elif installed; then
  die "$PKG is installed already (not by this test): remove it first, this test would"
fi

say "make deb"
"$SCRIPT_DIR/build_deb.sh"
version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" pg_eventbox.control)
deb=$(ls "$REPO"/build/deb/${PKG}_"$version"-1_*.deb)

trap restore EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# Set aside what `make install` put there (only the extension's own files).
mkdir -p "$ASIDE/lib" "$ASIDE/extension"
shopt -s nullglob
for f in "$LIBDIR"/pg_eventbox.so; do mv "$f" "$ASIDE/lib/"; done
for f in "$EXTDIR"/pg_eventbox.control "$EXTDIR"/pg_eventbox--*.sql; do mv "$f" "$ASIDE/extension/"; done
shopt -u nullglob
say "set aside: $(cd "$ASIDE" && find . -type f | sort | tr '\n' ' ')"

say "apt-get install $deb"
apt_get install --no-install-recommends "$deb"
installed || die "$PKG is not installed after apt-get install"

# The package owns the files the server loads, as built (dpkg --verify: checksums).
mapfile -t files < <(dpkg -L "$PKG" | while read -r p; do [[ -f "$p" ]] && echo "$p"; done)
for want in "$LIBDIR/pg_eventbox.so" "$EXTDIR/pg_eventbox.control" \
  "$EXTDIR/pg_eventbox--$version.sql"; do
  printf '%s\n' "${files[@]}" | grep -qxF "$want" || die "the package lacks $want"
done
dpkg --verify "$PKG" || die "dpkg --verify $PKG: installed files differ from the package"
say "installed ${#files[@]} files; dpkg --verify clean"

port=${EVENTBOX_PACKAGE_PORT:-}
if [[ -z "$port" ]]; then
  port=54430
  while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && ((port < 54520)); do
    port=$((port + 1))
  done
fi
ENV_DIR=$(mktemp -d /tmp/eventbox-package.XXXXXX)
say "cluster in $ENV_DIR (port $port), the packaged extension preloaded"
EVENTBOX_NO_RABBITMQ=1 EVENTBOX_PGBIN=$SYS_PGBIN "$SCRIPT_DIR/cluster.sh" start "$ENV_DIR" --port "$port"
# shellcheck source=/dev/null
. "$ENV_DIR/env"
"$SYS_PGBIN/psql" -X -At -v ON_ERROR_STOP=1 -c "SELECT default_version FROM pg_available_extensions WHERE name = 'pg_eventbox'" |
  grep -qxF "$version" || die "the server does not offer pg_eventbox $version"

rm -f regression.diffs regression.out
if ! make -C "$REPO" installcheck PG_CONFIG="$PGC" PGHOST="$PGHOST" PGPORT="$PGPORT" \
  PGUSER=postgres; then
  [[ -f regression.diffs ]] && head -n 200 regression.diffs
  die "installcheck against the packaged install failed"
fi
"$SCRIPT_DIR/cluster.sh" stop "$ENV_DIR"
"$SCRIPT_DIR/check_log.sh" "$EVENTBOX_LOG" "$EVENTBOX_KILLED_PIDS"
rm -rf "${ENV_DIR:?}/data"
ENV_DIR=""

say "apt-get remove $PKG"
apt_get remove "$PKG"
for f in "${files[@]}"; do
  [[ ! -e "$f" ]] || die "$f is still there after apt-get remove"
done
say "removed: none of its ${#files[@]} files left"
