#!/usr/bin/env bash
# tools/build_dist.sh — the PGXN archive (`make dist`): build/dist/pg_eventbox-VERSION.zip, the
# committed tree (git archive HEAD) under the prefix pg_eventbox-VERSION/, as PGXN expects it.
# VERSION is pg_eventbox.control's default_version; META.json must carry the same (checked here
# and by test/integration/test_pgxn.py), or PGXN would index the archive under another version.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" pg_eventbox.control)
meta=$(git show HEAD:META.json) || { echo "dist: META.json is not committed" >&2; exit 1; }
meta_version=$(printf '%s' "$meta" | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')
if [[ "$meta_version" != "$version" ]]; then
  echo "dist: META.json's version $meta_version differs from pg_eventbox.control's $version" >&2
  exit 1
fi
if ! git diff --quiet HEAD -- . ':!build'; then
  echo "dist: note: uncommitted changes are not in the archive (git archive HEAD)" >&2
fi
mkdir -p build/dist
out=build/dist/pg_eventbox-$version.zip
git archive --format=zip --prefix="pg_eventbox-$version/" -o "$out" HEAD
echo "dist: $out"
