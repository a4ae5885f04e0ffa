"""Every way out of crash found on crash 8.0.2 is refused by the command filter, and, with the filter
bypassed, the sandbox around the real crash still stops the ones that reach a shell or write files."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from diagd.actors import sandbox as _confine
from diagd.actors.crash import text as text
from diagd.actors.crash.pty import CrashDriver, MemorySink
from diagd.actors.sandbox import kernel as _confine_exec
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.fixtures.vmcore import build

# Each ran `id` (or wrote a file) on the fixture with crash 8.0.2 when typed at its prompt, unless noted.
ESCAPES = [
    "!id", "! id", "!!",
    "gdb shell id", "gdb she id", "gdb sh id", "gdb shel id", "g she id", "she id", "shell id",  # prefixes, alias g
    "gdb  shell id", "gdb\tshell id", "gdb \"shell\" id", "gdb 'she' id", "gdb she\\ll id", '"gdb" shell id',
    "gdb !id", "gdb | p 1 | id", "gdb pipe p 1 | id", "p 1 | id", "log > /tmp/x", "ps >> /tmp/x",
    "< /tmp/commands", "ps -p < /tmp/pids",  # crash reads commands or arguments from any file
    "alias zz !id", "alias yy gdb shell id", "alias xx g she id", "alias ww sou /tmp/script",  # alias bodies
    "gdb eval \"shell id\"", "gdb ev \"she id\"", "gdb with confirm off -- shell id", "gdb w confirm off -- she id",
    "gdb alias xx = shell", "gdb interpreter-exec console \"shell id\"", "gdb tfaas shell id",
    "gdb thread apply all shell id", "gdb frame apply all shell id", "gdb make", "gdb cd /tmp",
    "gdb source /tmp/script", "gdb sou /tmp/script", "sou /tmp/script",  # source runs shell lines from a file
    "gdb pi", "gdb python-interactive", "gdb py print(1)", "gdb pyt print(1)", "pyt print(1)", "gdb guile 1",
    "gdb set logging file /tmp/x", "gdb set logging on", "gdb set logg on", "gdb set trace-commands on",
    "gdb set history filename /tmp/x", "gdb maint print symbols /tmp/x", "gdb dump memory /tmp/x 0 1",
    "gdb generate-core-file /tmp/x", "gdb gcore /tmp/x", "gdb define foo", "gdb document foo", "gdb edit",
    "gdb tui enable", "gdb compile code 1", "gdb call system(0)", "gdb run", "gdb r",
    "r", "sn", "set scroll on", "set console /tmp/x", "repeat bt", "wr jiffies 0",
]
READ_ONLY = ["sys", "bt", "p jiffies", "jiffies", "task_struct", "gdb p jiffies", "gdb info registers",
             "g ptype struct task_struct", "gdb set var $x = 1", "gdb x/4x &jiffies", "gdb list schedule",
             "gdb disassemble schedule", "gdb show version", "gdb echo hi", "alias zz bt -a", "set scroll off", "sf",
             "hex", "eval 1 + 1", "struct task_struct.pid", "help bt", "log -T", "set -p 1"]


@pytest.mark.parametrize("command", ESCAPES)
def test_every_known_way_out_of_crash_is_refused_with_a_code(command: str) -> None:
    with pytest.raises(DiagdError) as refused:
        text.classify(command)
    assert refused.value.code == ErrorCode.INVALID_ARGUMENT and refused.value.message


@pytest.mark.parametrize("command", READ_ONLY)
def test_read_only_commands_and_gdb_inspection_still_pass(command: str) -> None:
    text.classify(command)


def test_only_gdb_and_its_alias_count_as_gdb_passthrough() -> None:
    assert text.is_gdb_passthrough("gdb p 1") and text.is_gdb_passthrough("g p 1")
    assert not text.is_gdb_passthrough("p 1") and not text.is_gdb_passthrough("bt")


@pytest.mark.skipif(shutil.which("crash") is None or _confine_exec.landlock_abi() < 1,
                    reason="needs crash and Landlock")
def test_with_the_filter_bypassed_the_sandbox_still_stops_a_shell_and_file_writes(tmp_path: Path) -> None:
    fixture = build()
    workdir = tmp_path / "session"
    workdir.mkdir()
    outside = tmp_path / "outside.txt"
    policy = _confine.crash_policy(vmcore=fixture.vmcore, vmlinux=fixture.vmlinux, workdir=workdir)
    argv = _confine.wrap(["crash", "-s", "--no_crashrc", str(fixture.vmlinux), str(fixture.vmcore)], policy)
    driver = CrashDriver.spawn(argv, cwd=str(workdir), env={"TERM": "dumb", "LC_ALL": "C", "PATH": "/usr/bin:/bin"})
    abort = threading.Event()
    try:
        driver.wait_ready(180, abort)

        def run(command: str) -> str:
            sink = MemorySink(1 << 20)
            driver.run(command, timeout_s=60, abort=abort, sink=sink)
            return sink.text()

        run("set scroll off")
        assert "sysrq" in run("bt")
        # measured: crash prints "cannot open pipe" for !cmd, gdb "Cannot execute /bin/sh: Permission denied"
        assert "cannot open pipe" in run("!id")
        for command in ("gdb she id", "she id", "gdb eval \"shell id\""):
            out = run(command)
            assert "uid=" not in out and "Permission denied" in out, command
        run(f"gdb set logging file {outside}")
        run("gdb set logging on")
        run("log > " + str(tmp_path / "redirected.txt"))
        assert not outside.exists() and not (tmp_path / "redirected.txt").exists()
    finally:
        driver.request_quit()
        driver.close()
