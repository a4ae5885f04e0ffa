"""Command policy, context/state classification and the output parsers (samples from crash 8.0.2)."""

from __future__ import annotations

import re
import subprocess

import pytest

from diagd.actors.crash import text as text
from diagd.protocol.errors import DiagdError
from tests.fixtures.vmcore import build

SET = '    PID: 1\nCOMMAND: "init"\n   TASK: ffff8edec3deb000  [THREAD_INFO: ffff8edec3deb000]\n    CPU: 0\n' \
      '  STATE: TASK_RUNNING (PANIC)\n'
SYS = ('      KERNEL: vmlinux\n    DUMPFILE: vmcore  [PARTIAL DUMP]\n        CPUS: 1\nLOAD AVERAGE: 0.00, 0.00, 0.00\n'
       '       TASKS: 2\n     RELEASE: 6.1.0-56-cloud-amd64\n       PANIC: "Kernel panic - not syncing: sysrq '
       'triggered crash"\n')
PS = ('      PID    PPID  CPU       TASK        ST  %MEM      VSZ      RSS  COMM\n'
      '        0       0   0  fffffffface1aa40  RU   0.0        0        0  [swapper/0]\n'
      '>       1       0   0  ffff8edec3deb000  RU   0.1     2260       60  init\n'
      '       42       1   0  ffff8edec3de0000  UN   0.0     2260       12  cat\n')
KMEM = ('                 PAGES        TOTAL      PERCENTAGE\n    TOTAL MEM    15508      60.6 MB         ----\n'
        '         FREE     8860      34.6 MB   57% of TOTAL MEM\n   TOTAL SWAP        0            0         ----\n')
BT = ('PID: 1        TASK: ffff8edec3deb000  CPU: 0    COMMAND: "init"\n'
      ' #0 [ffffd17680013c60] panic at ffffffffabdcd21a\n'
      ' #1 [ffffd17680013ce0] sysrq_handle_crash at ffffffffabaa8a06\n'
      '#10 [ffffd17680013e58] do_dup2 at ffffffffab774bf6\n    RIP: 000000000047b7a0  RSP: 00007ffceb100c68\n')


@pytest.mark.parametrize("command", ["log | tail -5", "sym x > /tmp/out", "!ls", "gdb shell ls", "shell id", "quit",
                                     "q", "exit", "repeat 1 bt", "gdb python print(1)", "bt\nps", "extend x.so"])
def test_commands_that_leave_the_session_or_reach_the_shell_are_refused(command: str) -> None:
    with pytest.raises(DiagdError) as err:
        text.classify(command)
    assert err.value.code == "INVALID_ARGUMENT"


def test_a_quoted_pipe_is_not_a_pipe_and_config_can_allow_shell_and_extend() -> None:
    assert text.classify('search -c "a|b"') == text.Kind.PLAIN
    assert text.classify("log | tail -5", allow_shell=True) == text.Kind.PLAIN
    assert text.classify("extend /x/mpykdump.so", allow_extend=True) == text.Kind.STATE


@pytest.mark.parametrize(("command", "kind"), [
    ("bt", text.Kind.PLAIN), ("set", text.Kind.PLAIN), ("set -v", text.Kind.PLAIN), ("set radix", text.Kind.PLAIN),
    ("set 1", text.Kind.CONTEXT), ("set ffff8edec3deb000", text.Kind.CONTEXT), ("set -p", text.Kind.CONTEXT),
    ("set -c 0", text.Kind.CONTEXT), ("set radix 16", text.Kind.STATE), ("hex", text.Kind.STATE),
    ("mod -s qemu_fw_cfg /x.ko", text.Kind.STATE), ("mod", text.Kind.PLAIN),
    ("gdb set print pretty on", text.Kind.STATE),
    ("alias", text.Kind.STATE), ("struct task_struct.comm ffff8edec3deb000", text.Kind.PLAIN)])
def test_context_and_state_commands_are_told_apart(command: str, kind: text.Kind) -> None:
    assert text.classify(command) == kind


def test_an_alias_is_defined_only_where_the_shell_is_allowed_and_then_changes_state() -> None:
    with pytest.raises(DiagdError):
        text.classify("alias x bt")
    assert text.classify("alias x bt", allow_shell=True) == text.Kind.STATE


def test_context_sys_ps_kmem_and_bt_parse() -> None:
    ctx = text.parse_context(SET)
    assert ctx is not None and (ctx.pid, ctx.task, ctx.cpu, ctx.command) == (1, "ffff8edec3deb000", 0, "init")
    assert ctx.key == "1/ffff8edec3deb000/0"
    assert text.parse_context("set: invalid task or pid value: 99\n") is None
    system = text.parse_sys(SYS)
    assert system["panic"] == "Kernel panic - not syncing: sysrq triggered crash" and system["tasks"] == "2"
    assert system["load_average"] == "0.00, 0.00, 0.00"
    rows = text.parse_ps(PS)
    assert [r["comm"] for r in rows] == ["[swapper/0]", "init", "cat"] and rows[1]["active"]
    summary = text.summarize_ps(rows)
    assert summary["by_state"] == {"RU": 2, "UN": 1} and summary["uninterruptible"][0]["comm"] == "cat"
    kmem = text.parse_kmem_i(KMEM)
    assert kmem["total_mem"] == {"pages": 15508, "size": "60.6 MB", "percent": None}
    assert kmem["free"]["percent"] == 57
    bt = text.parse_bt(BT)
    assert bt["pid"] == 1 and bt["comm"] == "init" and bt["functions"] == ["panic", "sysrq_handle_crash", "do_dup2"]


def test_the_pid_hash_warning_becomes_a_plain_limit() -> None:
    warning = "WARNING: active task ffff8edec3deb000 on cpu 0 not found in PID hash\n"
    limits = text.startup_limits(warning, "crash 8.0.2", 47, 2)
    assert len(limits) == 1 and "crash 8.0.2" in limits[0] and "drgn sees all 47" in limits[0]
    assert "2 task(s)" in limits[0] and "8.0.4" in limits[0]
    assert text.startup_limits("", "crash 8.0.6", 47, 47) == []



def test_crash_commands_are_exactly_what_crash_help_lists_on_the_fixture() -> None:
    """A word missing from CRASH_COMMANDS goes through the gdb check and may be refused (`sym` was)."""
    fixture = build()
    done = subprocess.run(["crash", "-s", str(fixture.vmlinux), str(fixture.vmcore)], input="help\nquit\n",
                          capture_output=True, text=True, timeout=120, check=False)
    table = done.stdout.split("crash version:")[0]  # help's table of commands comes before its footer
    rows = [line.split() for line in table.splitlines()]
    listed = {word for row in rows if row and all(re.fullmatch(r"[a-z]+|\*", w) for w in row) for word in row}
    assert listed == text.CRASH_COMMANDS, done.stdout[-2000:]
