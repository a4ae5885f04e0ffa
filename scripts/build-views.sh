#!/usr/bin/env bash
# Builds diagd's views (daemon/views: MCP Apps, docs/views.md) with npm and prints the directory that
# holds them, one self-contained HTML file per view (<name>.html). The build lives outside the repository,
# in a cache directory named by a hash of daemon/views' sources (~/.cache/diagd/views/<hash>/dist; the
# test-only MCP Apps host in .../<hash>/test): unchanged sources build once. Needs npm (and the registry
# for `npm ci`, the first time).
#
#   scripts/build-views.sh            build (when not built yet) and print the views' directory
#   scripts/build-views.sh --install  the same, and copy the views into daemon/views/dist, where the
#                                     daemon looks by default (an editable install) and from where a wheel
#                                     built afterwards ships them (package data of diagd.daemon)
#
# The daemon finds the views in $DIAGD_VIEWS_DIR, else in <package>/views/dist (`diagd doctor` says which).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
src=$top/daemon/views
log() { printf '\033[1m[views]\033[0m %s\n' "$*" >&2; }
command -v npm >/dev/null || { log "npm is not installed: the views cannot be built"; exit 3; }

# The sources: everything under daemon/views except what building or installing puts there.
files=$(cd "$src" && find . -type f -not -path './node_modules/*' -not -path './dist/*' | LC_ALL=C sort)
hash=$(cd "$src" && { echo "$files" | tr '\n' '\0' | xargs -0 sha256sum; node --version; } | sha256sum | cut -c1-16)
cache=${DIAGD_VIEWS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/diagd/views}
out=$cache/$hash
if [ ! -e "$out/.built" ]; then
  log "building the views into $out"
  work=$out/work
  rm -rf "$work" "$out/dist" "$out/test"
  mkdir -p "$work"
  (cd "$src" && echo "$files" | tr '\n' '\0' | xargs -0 cp --parents -t "$work")
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >&2 && npx tsc --noEmit >&2 && node build.mjs --out "$out" >&2)
  touch "$out/.built"
fi
if [ "${1:-}" = "--install" ]; then
  mkdir -p "$src/dist"
  rm -f "$src"/dist/*.html "$src"/dist/*.js
  cp "$out"/dist/*.html "$out"/dist/*.js "$src/dist/"
fi
echo "$out/dist"
