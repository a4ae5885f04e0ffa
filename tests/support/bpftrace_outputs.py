"""What bpftrace really prints for a fixed set of programs, run once and cached on disk.

actors/bpftrace/parse.py reads bpftrace's stdout (the attach announcement, JSON events) and stderr
(located errors and warnings with their quoted line and `~` underline, notices, other lines). The fast
test (tests/actors/bpftrace/test_parse_fast.py) feeds it these real outputs; each program is run with
`-f text` and `-f json`, so the JSON run is a second reading of what the text run announced. The cache
(beside the sharkd trees, `sharkd_trees.CACHE`) is keyed by bpftrace's version, the kernel release and
the programs: it only avoids re-running bpftrace (seconds a program) when the mutation gate asks.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.support.sharkd_trees import CACHE

MARKER = "__BPFTRACE_NOTIFY_PROBES_ATTACHED"  # bpftrace prints it on stderr once its probes are attached
HANG_GUARD_S = 120  # not a measurement: every program exits by itself
BPFTRACE = shutil.which("bpftrace")

# name: (program, ends by itself without error). Multi-line programs run from a file: bpftrace names it.
PROGRAMS: dict[str, tuple[str, bool]] = {
    "one_probe": ('BEGIN { @a = 1; @k["x"] = count(); exit(); }', True),
    "two_probes": ("BEGIN { @a = 1; exit(); } END { @b = count(); }", True),
    "printing": ('BEGIN { printf("hello %d\\n", 5); print(("t", 1)); @h = hist(5); @s = stats(3); exit(); }',
                 True),
    "three_probes": ("BEGIN { exit(); } interval:s:10 { @i = 1; } END { @e = 1; }", True),
    "syntax": ("BEGIN { @x = ; }", False),
    "end_of_input": ("BEGIN {", False),
    "unknown_function": ("BEGIN { @x = foo(1); }", False),
    "two_errors": ('BEGIN {\n  @x[1] = 1;\n  @x = 2;\n  printf("%d\\n");\n}', False),
    "unsafe": ('BEGIN {\n  @x = 1;\n  system("true");\n  exit();\n}', False),
    "no_tracepoint": ("tracepoint:nope:nope { }", False),
    "not_traceable": ("kprobe:no_such_fn_xyz { exit(); }", False),
}
AS_NOBODY = "as_nobody"


@functools.cache
def _version() -> str:
    assert BPFTRACE is not None
    return subprocess.run([BPFTRACE, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()


def _run(program: str, output_format: str, prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    assert BPFTRACE is not None
    with tempfile.TemporaryDirectory(prefix="bpftrace-prog-") as folder:
        if "\n" in program:
            source = Path(folder, "prog.bt")
            source.write_text(program)
            argv = [*prefix, BPFTRACE, "-f", output_format, str(source)]
        else:
            argv = [*prefix, BPFTRACE, "-f", output_format, "-e", program]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False,
                              env={**os.environ, MARKER: "1"})
    return {"stdout": done.stdout, "stderr": done.stderr, "returncode": done.returncode,
            "file": str(source) if "\n" in program else None}


def outputs() -> dict[str, dict[str, dict[str, Any]]]:
    """{program name: {"text": run, "json": run}}, each run {stdout, stderr, returncode, file}; and
    AS_NOBODY: {"text": one_probe run by user nobody} (bpftrace 0.17 refuses to run but as root)."""
    key = hashlib.sha256(json.dumps([_version(), os.uname().release, PROGRAMS]).encode()).hexdigest()[:24]
    cached = CACHE / f"bpftrace-outputs.{key}.json"
    if not cached.exists():
        found = {name: {fmt: _run(program, fmt) for fmt in ("text", "json")} for name, (program, _) in PROGRAMS.items()}
        found[AS_NOBODY] = {"text": _run(PROGRAMS["one_probe"][0], "text", ("runuser", "-u", "nobody", "--"))}
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(found))
        tmp.replace(cached)
    runs: dict[str, dict[str, dict[str, Any]]] = json.loads(cached.read_text())
    return runs
