"""What bpftrace really prints where tracefs is not mounted, and for a probe the kernel refuses to attach
without a quoted name: run once and cached on disk, as `bpftrace_outputs` does for its programs.

The runs without tracefs happen in a private mount namespace (`unshare -m --propagation private`) in
which /sys/kernel/tracing (and /sys/kernel/debug/tracing) is unmounted first, so the machine's own mount
is never touched. There bpftrace 0.17 finds no tracepoint, cannot create a kprobe event, and, in its
dry run (`-d`, what `bpftrace_helpers` uses), prints "Error while reading traceable functions from
PATH: REASON" without a newline, so it runs into the next message; with `-v` it prints its steps on
stderr before the attach error. The `hardware` and `two_unsafe` runs are made as they are (tracefs
mounted): a kernel without a PMU refuses the hardware probe with `Error attaching probe: NAME`, the name
not quoted as a kprobe's is; `two_unsafe` calls two unsafe builtins without --unsafe. Keyed by
bpftrace's version, the kernel release and the runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from typing import Any

from tests.support.bpftrace_outputs import BPFTRACE, HANG_GUARD_S, MARKER, _version
from tests.support.sharkd_trees import CACHE

UNSHARE = shutil.which("unshare")
# Inside the namespace: unmount tracefs, prove it is gone (exit 97 otherwise), then run bpftrace.
_UNMOUNT = ("umount /sys/kernel/tracing 2>/dev/null; umount /sys/kernel/debug/tracing 2>/dev/null; "
            "[ ! -e /sys/kernel/tracing/available_events ] && [ ! -e /sys/kernel/debug/tracing/available_events ] "
            '|| exit 97; exec "$@"')
NO_TRACEFS_EXIT = 97

# name: (bpftrace arguments, whether tracefs is unmounted for the run).
RUNS: dict[str, tuple[tuple[str, ...], bool]] = {
    "tracepoint_text": (("-f", "text", "-e", "tracepoint:sched:sched_switch { exit(); }"), True),
    "tracepoint_json": (("-f", "json", "-e", "tracepoint:sched:sched_switch { exit(); }"), True),
    "kprobe_text": (("-f", "text", "-e", "kprobe:do_nanosleep { exit(); }"), True),
    "kprobe_json": (("-f", "json", "-e", "kprobe:do_nanosleep { exit(); }"), True),
    "dry_run_kprobe": (("-d", "-e", "kprobe:do_nanosleep { exit(); }"), True),
    "list_tracepoints": (("-l", "tracepoint:sched:*"), True),
    "verbose_kprobe": (("-v", "-e", "kprobe:do_nanosleep { exit(); }"), True),
    "hardware": (("-f", "text", "-e", "hardware:cpu-cycles:1000000 { exit(); }"), False),
    "two_unsafe": (("-f", "text", "-e", 'BEGIN { system("true"); signal("KILL"); exit(); }'), False),
}


def _run(args: tuple[str, ...], unmounted: bool) -> dict[str, Any]:
    assert BPFTRACE is not None and UNSHARE is not None
    argv = [BPFTRACE, *args]
    if unmounted:
        argv = [UNSHARE, "-m", "--propagation", "private", "sh", "-c", _UNMOUNT, "sh", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False,
                          env={**os.environ, MARKER: "1"})
    if unmounted and done.returncode == NO_TRACEFS_EXIT:
        raise RuntimeError("tracefs could not be unmounted in a private mount namespace")
    # A dry run prints the program's AST and IR on stdout: only its stderr is read.
    return {"stdout": "" if "-d" in args else done.stdout, "stderr": done.stderr, "returncode": done.returncode}


def outputs() -> dict[str, dict[str, Any]]:
    """{run name: {stdout, stderr, returncode}} for RUNS."""
    key = hashlib.sha256(json.dumps([_version(), os.uname().release, RUNS]).encode()).hexdigest()[:24]
    cached = CACHE / f"bpftrace-outputs-no-tracefs.{key}.json"
    if not cached.exists():
        found = {name: _run(args, unmounted) for name, (args, unmounted) in RUNS.items()}
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(found))
        tmp.replace(cached)
    runs: dict[str, dict[str, Any]] = json.loads(cached.read_text())
    return runs
