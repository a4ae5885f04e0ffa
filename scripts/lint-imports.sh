#!/usr/bin/env bash
# The import contracts of pyproject.toml's [tool.importlinter] (layers: daemon > actors > protocol;
# back ends independent of each other; a light wire protocol), checked with import-linter in the
# symlinked tree of scripts/namespace-tree.sh, where diagd.daemon/actors/protocol are subpackages.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$("$top/scripts/namespace-tree.sh")"
exec "${LINT_IMPORTS:-$top/.venv/bin/lint-imports}" "$top/pyproject.toml"
