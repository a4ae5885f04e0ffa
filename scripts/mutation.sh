#!/usr/bin/env bash
# Mutation testing (mutmut) of a chosen module set against its fast tests: scripts/mutation.sh [--smoke | module ...]
#
# Modules are repository paths (default: actors/pcap/ngap/*.py). The tests run are those of
# MUTATION_TESTS (default: the fast NGAP tests, the in-process field oracle on cached sharkd trees).
# The repository maps actors/, daemon/, protocol/ into diagd.* only at install time (pyproject); mutmut
# mutates the files it copies into mutants/ and the tests must import those copies, so the run happens
# in build/mutation/: a real diagd/ package tree (copied, not linked) plus tests/, whose mutants/ copy
# comes first on sys.path, ahead of the editable install. Results: `mutmut results` in that folder;
# the baseline is docs/testing-mutation.md. Slow on 2 cores: run one module set at a time.
#
# --smoke: a small fixed set (SMOKE_MODULES with SMOKE_TESTS, a few minutes) that fails (exit 1) when
# fewer than MUTATION_MIN % (default 80 there, provisional: not yet measured) of its mutants are killed. MUTATION_MIN works for any run.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$top/.venv/bin/python}
"$py" -c "import mutmut" 2>/dev/null || { echo "mutmut is not installed: $top/.venv/bin/pip install -e '.[test]'" >&2; exit 2; }
SMOKE_MODULES=(actors/pcap/ngap/model.py actors/serial/urc.py)
SMOKE_TESTS="tests/actors/pcap/test_ngap_procedures_model.py tests/actors/pcap/test_ngap_fields.py tests/actors/serial/test_codec.py tests/actors/serial/test_urc.py"
modules=("$@")
min=${MUTATION_MIN:-0}
if [ "${1:-}" = --smoke ]; then
    modules=("${SMOKE_MODULES[@]}")
    MUTATION_TESTS=${MUTATION_TESTS:-$SMOKE_TESTS}
    min=${MUTATION_MIN:-80}
fi
[ ${#modules[@]} -gt 0 ] || modules=(actors/pcap/ngap/*.py)
tests=${MUTATION_TESTS:-"tests/actors/pcap/test_ngap_fields.py tests/actors/pcap/test_tree.py"}
work="$top/build/mutation"
rm -rf "$work"
mkdir -p "$work/diagd"
cp "$top/diagd/__init__.py" "$work/diagd/"
for part in daemon actors protocol systemd; do cp -r "$top/$part" "$work/diagd/$part"; done
cp -r "$top/tests" "$work/tests"
find "$work" -name __pycache__ -prune -exec rm -rf {} +
only=""
for m in "${modules[@]}"; do
    case "$m" in diagd/*) ;; *) m="diagd/$m" ;; esac
    only+="\"$m\", "
done
selection=""
for t in $tests; do selection+="\"$t\", "; done
cat > "$work/pyproject.toml" <<TOML
[tool.pytest.ini_options]
trio_mode = true
testpaths = ["tests"]
addopts = "--strict-markers -q -p no:cacheprovider"
filterwarnings = ["error", "ignore::DeprecationWarning:mcp", "ignore::pytest.PytestUnraisableExceptionWarning"]
markers = ["e2e: starts real diagd processes"]

[tool.mutmut]
source_paths = ["diagd"]
only_mutate = [${only%, }]
pytest_add_cli_args_test_selection = [${selection%, }]
TOML
cd "$work"
# Warm the sharkd-tree and oracle caches once (a mutant's run then only re-runs the model).
"$py" -m pytest -x -q -p no:cacheprovider $tests >/dev/null
# mutmut's progress line is rewritten in place thousands of times: kept in run.log, its last state printed.
"$py" -m mutmut run --max-children "${MUTATION_JOBS:-2}" > run.log 2>&1 || true
tr '\r' '\n' < run.log | grep -v '^\s*$' | tail -n 2
"$py" -m mutmut results > results.txt 2>&1 || true
# One Markdown row per module, as docs/testing-mutation.md records them, then the total against MUTATION_MIN.
"$py" - "$work" "$min" <<'PY'
import collections, json, pathlib, sys
from mutmut.stats import status_by_exit_code
work, minimum = pathlib.Path(sys.argv[1]), float(sys.argv[2])
counts = collections.defaultdict(collections.Counter)
for meta in (work / "mutants").rglob("*.meta"):
    module = str(meta.relative_to(work / "mutants")).removesuffix(".meta")
    for code in json.loads(meta.read_text()).get("exit_code_by_key", {}).values():
        counts[module][status_by_exit_code[code]] += 1
print("| module | mutants | killed | survived | timeout | no tests | killed % |")
print("|---|---|---|---|---|---|---|")
for module, c in sorted(counts.items()):
    total = sum(c.values())
    print(f"| {module.removeprefix('diagd/')} | {total} | {c['killed']} | {c['survived']} | {c['timeout']} "
          f"| {c['no tests']} | {100 * c['killed'] / max(total, 1):.1f} % |")
total = sum(sum(c.values()) for c in counts.values())
killed = sum(c["killed"] for c in counts.values())
share = 100 * killed / max(total, 1)
print(f"total: {killed}/{total} killed ({share:.1f} %)" + (f", minimum {minimum:g} %" if minimum else ""))
if not total or share < minimum:
    sys.exit(1)
PY
