#!/usr/bin/env bash
# mypy --strict over the diagd.* namespace, checked in the symlinked tree of scripts/namespace-tree.sh
# (the repository keeps daemon/, actors/, protocol/ at the top level, mapped into diagd.* by pyproject).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$("$top/scripts/namespace-tree.sh")"
exec "${PYTHON:-$top/.venv/bin/python}" -m mypy --config-file "$top/pyproject.toml" -p diagd
