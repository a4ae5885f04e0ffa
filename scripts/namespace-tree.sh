#!/usr/bin/env bash
# Prints a directory holding a symlinked diagd/ package tree (daemon/, actors/, protocol/, systemd/ and
# samples/ as subpackages of diagd): what the repository's top-level folders are once installed. Tools
# that walk a package's files (mypy, import-linter) cannot see through the editable install's mapping.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
tree="$top/build/typecheck"
mkdir -p "$tree/diagd"
for part in daemon actors protocol systemd; do ln -sfn "$top/$part" "$tree/diagd/$part"; done
ln -sf "$top/diagd/__init__.py" "$tree/diagd/__init__.py"
ln -sfn "$top/diagd/samples" "$tree/diagd/samples"  # the sample captures (diagd examples)
echo "$tree"
