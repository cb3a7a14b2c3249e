#!/usr/bin/env bash
# tools/build_deb.sh — build the Debian package postgresql-15-eventbox (`make deb`).
#
# The tree (git's tracked and untracked, not ignored files: what a commit would hold) is copied
# into build/deb/pg-eventbox-VERSION/, debian/changelog is written there with the version of
# pg_eventbox.control's default_version (Debian revision 1), dpkg-buildpackage -us -uc -b builds
# it (debian/rules: debhelper 13 and pg_buildext), and lintian checks the result: it must be
# clean but for the tags debian/postgresql-15-eventbox.lintian-overrides explains. The
# repository itself is never written.
#
# Output: build/deb/postgresql-15-eventbox_VERSION-1_ARCH.deb (and the .changes, .buildinfo).
# Environment: DEB_LINTIAN=0 skips lintian.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" pg_eventbox.control)
[[ -n "$version" ]] || { echo "build_deb: no default_version in pg_eventbox.control" >&2; exit 1; }
out=$REPO/build/deb
stage=$out/pg-eventbox-$version

rm -rf "$out"
mkdir -p "$stage"
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done |
  tar -c --null -T - | tar -x -C "$stage"

# The changelog's version is the control file's: one place to bump for a release. Its date is
# the last commit's (the same tree builds the same package).
maintainer=$(sed -n 's/^Maintainer: //p' debian/control)
date=$(git log -1 --format=%aD 2>/dev/null || date -R)
cat >"$stage/debian/changelog" <<CHANGELOG
pg-eventbox ($version-1) unstable; urgency=medium

  * pg_eventbox $version, packaged from the repository (make deb).

 -- $maintainer  $date
CHANGELOG

echo "build_deb: dpkg-buildpackage in $stage"
(cd "$stage" && dpkg-buildpackage -us -uc -b)
rm -rf "$stage"

deb=$(ls "$out"/postgresql-15-eventbox_"$version"-1_*.deb)
echo "build_deb: built $deb"
if [[ "${DEB_LINTIAN:-1}" != 0 ]]; then
  echo "build_deb: lintian"
  lintian --info --display-info --fail-on error,warning,info "$out"/*.changes
fi
