"""What crash really prints on the vmcore fixture for a fixed set of commands, run once and cached on disk.

actors/crash/text.py parses crash's `set`, `sys`, `ps`, `bt` and `kmem -i` outputs and the warnings crash
prints while loading. The fast test (tests/actors/crash/test_text_real_outputs.py) feeds it these real
outputs. crash runs once, as diagd starts it (`crash -s --no_crashrc`) and as tests/e2e/test_crash.py's
`crash_directly` does, with each command's output redirected by crash to a file of its own; what crash
prints on stdout before its first command is its startup output (the PID hash warning). drgn reads the
same dump for a second, independent view of its tasks and panic thread (when drgn is installed).

The cache (beside the sharkd trees, `sharkd_trees.CACHE`) is keyed by the vmcore's and vmlinux's
sha256 (the fixture manifest), crash's version, drgn's and the commands: it only avoids re-running
crash (~15 s to load the dump) when the mutation gate asks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.fixtures.vmcore import VmcoreFixture
from tests.support.sharkd_trees import CACHE

CRASH = shutil.which("crash")
LAYOUT = 3  # bumped when what is recorded changes
HANG_GUARD_S = 300  # not a measurement: only stops a crash that hangs

# name: crash command. Order matters: crash runs them in this order in one session.
COMMANDS: dict[str, str] = {
    "set": "set",
    "sys": "sys",
    "ps": "ps",
    "ps_kernel": "ps -k",
    "ps_user": "ps -u",
    "bt": "bt",
    "bt_frames_data": "bt -f",
    "bt_lines": "bt -l",
    "kmem_i": "kmem -i",
    "set_0": "set 0",
    "bt_0": "bt",
    "set_cpu_0": "set -c 0",
    "set_bad_pid": "set 99999",
    "set_panic": "set -p",
    # words crash does not know (it says so; upper case is not lowered, by crash or by gdb), a quoted set
    # variable, then a quoted quit (crash drops the quotes: nothing after it runs)
    "x_q": "Xq",
    "q_x": "qX",
    "x_wr": "Xwr",
    "x_gdb": "Xgdb p 1",
    "x_g": "Xg p 1",
    "x_backslash_q": "X\\q",
    "set_quoted_radix": 'set "radix" 16',
    "quoted_quit": '"q"',
    "after_quoted_quit": "sys",
}


def _version() -> str:
    assert CRASH is not None
    done = subprocess.run([CRASH, "--version"], capture_output=True, text=True, timeout=60, check=False)
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return lines[0] if lines else ""


def _drgn(fixture: VmcoreFixture) -> dict[str, Any] | None:
    """drgn's own reading of the dump: every task (pid, parent, cpu, task address, state letter, comm,
    virtual size in kB), the idle task of CPU 0, the crashed thread and its frames' function names."""
    try:
        from drgn import Program
        from drgn.helpers.linux.mm import task_vsize
        from drgn.helpers.linux.pid import for_each_task
        from drgn.helpers.linux.sched import idle_task, task_cpu, task_state_to_char
    except ImportError:
        return None
    prog = Program()
    prog.set_core_dump(str(fixture.vmcore))
    prog.load_debug_info([str(fixture.vmlinux)])

    def row(task: Any) -> dict[str, Any]:
        return {"pid": task.pid.value_(), "ppid": task.real_parent.pid.value_(), "cpu": task_cpu(task),
                "task": f"{task.value_():x}", "state": task_state_to_char(task),
                "comm": task.comm.string_().decode(errors="replace"),
                "vsz_kb": task_vsize(task) // 1024}

    thread = prog.crashed_thread()
    return {"version": __import__("drgn").__version__, "tasks": [row(t) for t in for_each_task(prog)],
            "idle_0": row(idle_task(prog, 0)), "crashed": row(thread.object),
            "crashed_frames": [frame.name for frame in thread.stack_trace() if frame.name]}


def outputs(fixture: VmcoreFixture) -> dict[str, Any]:
    """{"crash_version": first line of `crash --version`, "startup": what crash printed before its first
    command, "outputs": {name: that command's output, None if it never ran}, "drgn": `_drgn`'s view or None}."""
    try:
        import drgn
        drgn_version: str | None = drgn.__version__
    except ImportError:
        drgn_version = None
    # the manifest's `file: <name> <size> <sha256>` lines of the dump and its vmlinux
    manifest = (fixture.dir / "manifest.txt").read_text().splitlines()
    identity = [line for line in manifest if line.startswith(("file: vmcore ", "file: vmlinux "))]
    if len(identity) != 2:
        identity = [f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in (fixture.vmcore, fixture.vmlinux)]
    key = hashlib.sha256(json.dumps([LAYOUT, identity, _version(), drgn_version, COMMANDS]).encode()).hexdigest()[:24]
    cached = CACHE / f"crash-outputs.{key}.json"
    if not cached.exists():
        found = _record(fixture)
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(found))
        tmp.replace(cached)
    recorded: dict[str, Any] = json.loads(cached.read_text())
    return recorded


def _record(fixture: VmcoreFixture) -> dict[str, Any]:
    assert CRASH is not None
    with tempfile.TemporaryDirectory(prefix="crash-outputs-") as folder:
        where = Path(folder)
        script = where / "commands"
        script.write_text("".join(f"{command} > {where / name}\n" for name, command in COMMANDS.items()) + "exit\n")
        done = subprocess.run([CRASH, "-s", "--no_crashrc", "-i", str(script), str(fixture.vmlinux),
                               str(fixture.vmcore)],
                              env={**os.environ, "TERM": "dumb", "LC_ALL": "C", "PAGER": "cat"},
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HANG_GUARD_S,
                              check=True)
        found = {name: (where / name).read_text() if (where / name).exists() else None for name in COMMANDS}
    # An error message goes to the command's file and to stdout (and stderr): the startup output is what
    # stdout holds before the first of those.
    starts = [done.stdout.find(text) for text in found.values() if text and text.strip()]
    startup = done.stdout[: min([at for at in starts if at >= 0], default=len(done.stdout))]
    return {"crash_version": _version(), "startup": startup, "outputs": found, "drgn": _drgn(fixture)}
