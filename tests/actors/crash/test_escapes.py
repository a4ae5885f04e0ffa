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
    # issue 20: an alias is judged by its name when used, so no alias may be defined at all
    "alias zz gdb", "alias zz g", 'alias zz "gdb"', "alias zz 'g'", '"alias" zz gdb', "alias zz gdb p 1", "alias zz ''",
    'alias zz ""', "alias zz bt -a", "alias  zz\tgdb",
    # crash `set` variables outside the output ones: gdb mode hands every later line to gdb
    "set gdb on", "set gdb  on", "set error /tmp/x", "set core on", "set silent on", "set debug 9",
    "set namelist /tmp/x", "set edit vi", "set scroll less", "set scroll CRASHPAGER", '"set" gdb on', "set 'gdb' on",
    # gdb's ways to run commands from other commands, to define commands, to reach files or programs
    "gdb define zz", "gdb define-prefix zz", "gdb document zz", "gdb alias -a zz = shell", "gdb eval \"she id\"",
    "gdb with print pretty -- shell id", "gdb frame apply 1 shell id", "gdb thread apply 1 shell id",
    "gdb taas shell id", "gdb tfaas shell id", "gdb faas shell id", "gdb if 1", "gdb while 1", "gdb commands",
    "gdb interpreter-exec mi \"-interpreter-exec console \\\"shell id\\\"\"", "gdb pipe p 1 | id", "gdb | p 1 | id",
    "gdb python import os", "gdb source /tmp/x", "gdb set logging redirect on", "gdb set logging overwrite on",
    "gdb dump value /tmp/x 1", "gdb append value /tmp/x 1", "gdb restore /tmp/x", "gdb shell", "gdb !", "gdb ! id",
    "gdb SHELL id", "gdb Shell id", "gdb SHE id", "gdb 'shell' id", "gdb \"sh\"ell id", "gdb\t\tshe id",
    "gdb she\\\nll id", "g she id", "'g' she id", '"g" she id', "gdb she", "gdb tf shell id", "gdb ta shell id",
    "gdb end", "gdb dont-repeat", "gdb init-if-undefined $x = 1", "gdb set auto-load safe-path /",
    "gdb set history save on", "gdb save breakpoints /tmp/x", "gdb tsave /tmp/x", "gdb new-ui console /dev/tty",
    "gdb shell-anything", "she", "sh id", "she\\ll id", "pi", "py", "ev \"she id\"", "tfaas she id", "taas she id",
    "def zz", "doc zz", "pipe p 1 | id", "dump value /tmp/x 1", "interpreter-exec console \"she id\"",
    "!", "! id", " !id", "\t!id", "p 1 |id", "p 1 >/tmp/x", "p 1 >>/tmp/x", "bt -a < /tmp/x", "<", "|", ">",
    "foreach bt | sh", "foreach bt > /tmp/x",
]
READ_ONLY = ["sys", "bt", "p jiffies", "jiffies", "task_struct", "gdb p jiffies", "gdb info registers",
             "g ptype struct task_struct", "gdb set var $x = 1", "gdb x/4x &jiffies", "gdb list schedule",
             "gdb disassemble schedule", "gdb show version", "gdb echo hi", "alias", "alias g", "set scroll off", "sf",
             "hex", "eval 1 + 1", "struct task_struct.pid", "help bt", "log -T", "set -p 1", "set radix 16",
             "set print_max 64", "set radix", "set scroll", "set -c 0", "set -v", "set 1", "foreach bt",
             "gdb show environment"]


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


# Typed at the real crash with the filter bypassed: each tried to start a program (crash's popen or gdb's
# shell); with the launcher's seccomp filter, with or without Landlock, each fails at execve.
EXEC_FORMS = ["!id", "gdb she id", "she id", "gdb eval \"shell id\"", "gdb with confirm off -- shell id",
              "gdb interpreter-exec console \"shell id\"", "p 1 | id", "gdb pipe p 1 | id", "gdb | p 1 | id",
              "alias zz gdb", "zz she id"]
DENIED_MARKS = ("cannot open pipe", "Operation not permitted", "Permission denied")


@pytest.mark.skipif(shutil.which("crash") is None or not _confine_exec.seccomp_available(),
                    reason="needs crash and seccomp")
@pytest.mark.parametrize("landlock", [
    pytest.param(True, id="landlock", marks=pytest.mark.skipif(_confine_exec.landlock_abi() < 1, reason="no Landlock")),
    pytest.param(False, id="no-landlock")])
def test_with_the_filter_bypassed_the_sandbox_still_stops_a_shell_and_file_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, landlock: bool) -> None:
    if not landlock:
        monkeypatch.setenv(_confine.FORCE_ENV, "off")
    fixture = build()
    workdir = tmp_path / "session"
    workdir.mkdir()
    outside = tmp_path / "outside.txt"
    policy = _confine.crash_policy(vmcore=fixture.vmcore, vmlinux=fixture.vmlinux, workdir=workdir)
    assert policy.landlock == landlock and policy.exec_once
    argv = _confine.wrap(["crash", "-s", "--no_crashrc", str(fixture.vmlinux), str(fixture.vmcore)], policy)
    driver = CrashDriver.spawn(argv, cwd="/", env={"TERM": "dumb", "LC_ALL": "C", "PATH": "/usr/bin:/bin",
                                                   "DIAGD_TEST_SECRET": "hunter2"})
    abort = threading.Event()
    try:
        driver.wait_ready(180, abort)

        def run(command: str) -> str:
            sink = MemorySink(1 << 20)
            driver.run(command, timeout_s=60, abort=abort, sink=sink)
            return sink.text()

        run("set scroll off")
        assert "sysrq" in run("bt")
        for command in EXEC_FORMS:
            out = run(command)
            assert "uid=" not in out, (command, out)
            if not command.startswith("alias"):
                assert any(mark in out for mark in DENIED_MARKS), (command, out)
        environment = run("gdb show environment")
        assert "HOME=/nonexistent" in environment and "hunter2" not in environment
        assert '"exec":"denied after this one"' in environment
        assert "bt" in run("help")  # crash still answers after every refusal
        if landlock:  # files: Landlock's part (without it, the command check is what refuses these)
            run(f"gdb set logging file {outside}")
            run("gdb set logging on")
            run("log > " + str(tmp_path / "redirected.txt"))
            assert not outside.exists() and not (tmp_path / "redirected.txt").exists()
    finally:
        driver.request_quit()
        driver.close()


def _verdict(command: str) -> str:
    try:
        return str(text.classify(command))
    except DiagdError as refused:
        assert refused.code == ErrorCode.INVALID_ARGUMENT
        return "refused"


@pytest.mark.parametrize("command", ESCAPES + READ_ONLY)
def test_a_leading_backslash_is_read_as_crash_reads_it(command: str) -> None:
    """crash takes one backslash off the first word (quotes around it dropped) and skips alias expansion
    for it: the check does the same, so a backslash never turns a refusal into a pass, and never changes
    what a pass means."""
    parts = command.strip().split(None, 1)
    word, rest = parts[0].strip("\"'"), (" " + parts[1] if len(parts) > 1 else "")
    plain = _verdict(command)
    for backslashed in (f"\\{word}{rest}", f'"\\{word}"{rest}'):
        if word in text.CRASH_ALIASES:
            # `\sn` is the word `sn` itself, no alias: crash hands it to gdb, and it is judged as such.
            assert text.as_crash_reads(backslashed) == f"{word}{rest}"
            continue
        verdict = _verdict(backslashed)
        assert verdict == plain or (plain != "refused" and verdict == "refused"), (command, backslashed)


def test_backslash_forms_from_the_third_attack_round() -> None:
    assert text.is_gdb_passthrough("\\gdb p 1") and text.is_gdb_passthrough('"\\gdb" p 1')
    for command in ("\\gdb she id", "\\alias zz gdb", "\\set gdb on", "\\q", "\\quit", "\\extend /tmp/x.so",
                    "\\gdb dump binary value /root/.ssh/authorized_keys \"x\"", "\\\\gdb p 1", "\\!id",
                    "\\g she id", "p 1\rgdb shell id", "p 1\ngdb she id", "\\p 1\r"):
        assert _verdict(command) == "refused", command
    assert _verdict("\\bt") == _verdict("bt") and _verdict("\\sys") == "plain"
