#!/usr/bin/env bash
# mypy --strict over the diagd.* namespace. The repository keeps daemon/, actors/, protocol/ at the
# top level (mapped into diagd.* by pyproject), which mypy cannot see through an editable install:
# build a symlinked diagd/ tree once and check that.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
tree="$top/build/typecheck"
mkdir -p "$tree/diagd"
for part in daemon actors protocol systemd; do ln -sfn "$top/$part" "$tree/diagd/$part"; done
ln -sf "$top/diagd/__init__.py" "$tree/diagd/__init__.py"
cd "$tree"
exec "${PYTHON:-$top/.venv/bin/python}" -m mypy --config-file "$top/pyproject.toml" -p diagd
