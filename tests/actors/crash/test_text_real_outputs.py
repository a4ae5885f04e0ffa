"""The output parsers of actors/crash/text.py on what crash 8.0.2 really printed on the vmcore fixture.

crash ran once (tests/support/crash_outputs.py, cached outside the repo by dump and crash version); each
parser's answer is compared with a reading of the same text written here (plain splits of crash's
columns and `KEY: value` lines, not the module's patterns) and, where it can be, with drgn's own reading
of the dump (task addresses, parents, CPUs, states, virtual sizes, the crashed thread and its frames).
Cases crash cannot print on this dump (a missing line, a task in D state, more than five tasks with
memory) are crash's own lines with a line taken out or hand-written rows in crash's columns, their
answers written out from what each parser documents.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from typing import Any

import pytest

from diagd.actors.crash import text as text
from tests.fixtures.vmcore import build
from tests.support import crash_outputs

pytestmark = pytest.mark.skipif(shutil.which("crash") is None, reason="crash is not installed")

# crash's ps ST column for the letters drgn's task_state_to_char gives (crash's `help ps`).
ST_OF_LETTER = {"R": "RU", "S": "IN", "D": "UN", "I": "ID", "T": "ST", "t": "TR", "Z": "ZO", "X": "DE"}


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    return crash_outputs.outputs(build())


def out(recorded: dict[str, Any], name: str) -> str:
    output: str = recorded["outputs"][name]
    return output


def drgn_view(recorded: dict[str, Any]) -> dict[str, Any]:
    if recorded["drgn"] is None:
        pytest.skip("drgn is not installed")
    view: dict[str, Any] = recorded["drgn"]
    return view


# ---------------------------------------------------------------------------------------------
# Independent readings


def key_values(output: str) -> dict[str, str]:
    """crash's `KEY: value` lines (`set`, `sys`): an upper-case key, a colon, the value."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        m = re.match(r"^\s*([A-Z][A-Z ]*[A-Z]|[A-Z]):(.*)$", line)
        if m and m[1] not in found:
            found[m[1]] = m[2].strip()
    return found


def ps_columns(output: str) -> list[dict[str, Any]]:
    """crash's ps table: `>` marks an active task; PID PPID CPU TASK ST %MEM VSZ RSS COMM."""
    rows = []
    lines = output.splitlines()
    assert lines[0].split() == ["PID", "PPID", "CPU", "TASK", "ST", "%MEM", "VSZ", "RSS", "COMM"]
    for line in lines[1:]:
        if not line.strip():
            continue
        words = line.split()
        active = words[0] == ">"
        if active:
            words = words[1:]
        pid, ppid, cpu, task, st, mem, vsz, rss = words[:8]
        rows.append({"pid": int(pid), "ppid": int(ppid), "cpu": int(cpu), "task": task, "state": st,
                     "mem_pct": float(mem), "vsz_kb": int(vsz), "rss_kb": int(rss), "comm": " ".join(words[8:]),
                     "active": active})
    return rows


def bt_reading(output: str) -> dict[str, Any]:
    """bt's first line `PID: n TASK: addr CPU: n COMMAND: "comm"`, then frame lines
    `#n [sp] function at pc`; the other lines (registers, `-f` stack words, `-l` source lines) are not frames."""
    lines = output.splitlines()
    words = lines[0].split()
    assert words[0::2][:4] == ["PID:", "TASK:", "CPU:", "COMMAND:"], lines[0]
    frames = []
    for line in lines[1:]:
        parts = line.split()
        if parts and parts[0].startswith("#") and parts[0][1:].isdigit():
            level, sp, function, at, pc = parts
            assert at == "at" and sp[0] + sp[-1] == "[]"
            frames.append({"level": int(level[1:]), "function": function, "sp": sp[1:-1], "pc": pc})
    return {"pid": int(words[1]), "task": words[3], "cpu": int(words[5]), "comm": words[7].strip('"'),
            "frames": frames, "functions": [f["function"] for f in frames]}


# ---------------------------------------------------------------------------------------------
# set -> Context


@pytest.mark.parametrize("name", ["set", "set_0", "set_cpu_0", "set_panic"])
def test_every_context_crash_printed_is_read_field_by_field(recorded: dict[str, Any], name: str) -> None:
    fields = key_values(out(recorded, name))
    expected = {"pid": int(fields["PID"]), "task": fields["TASK"].split()[0], "cpu": int(fields["CPU"]),
                "command": fields["COMMAND"].strip('"'), "state": fields["STATE"]}
    ctx = text.parse_context(out(recorded, name))
    assert ctx is not None
    assert ctx.to_json() == expected
    assert ctx.key == f"{expected['pid']}/{expected['task']}/{expected['cpu']}"


def test_contexts_name_the_tasks_drgn_finds(recorded: dict[str, Any]) -> None:
    drgn = drgn_view(recorded)
    panic, idle = text.parse_context(out(recorded, "set")), text.parse_context(out(recorded, "set_0"))
    assert panic is not None and idle is not None
    crashed, idle_0 = drgn["crashed"], drgn["idle_0"]
    assert (panic.pid, panic.task, panic.cpu, panic.command) == (crashed["pid"], crashed["task"], crashed["cpu"],
                                                                 crashed["comm"])
    assert (idle.pid, idle.task, idle.cpu, idle.command) == (idle_0["pid"], idle_0["task"], idle_0["cpu"],
                                                             idle_0["comm"])
    # crash's words for them, as printed: the panic task after loading, the idle task (trailing blank dropped)
    assert (panic.state, idle.state) == ("TASK_RUNNING (PANIC)", "TASK_RUNNING")
    # `set -c 0` and `set -p` go back to the panic task
    for name in ("set_cpu_0", "set_panic"):
        back = text.parse_context(out(recorded, name))
        assert back is not None and back.key == panic.key


def test_a_refused_set_is_no_context(recorded: dict[str, Any]) -> None:
    refused = out(recorded, "set_bad_pid")
    assert "invalid task or pid value" in refused
    assert text.parse_context(refused) is None
    assert text.parse_context("") is None


def without(output: str, key: str) -> str:
    kept = [line for line in output.splitlines() if line.split(":")[0].strip() != key]
    assert len(kept) == len(output.splitlines()) - 1
    return "\n".join(kept)


def test_a_context_missing_a_line_or_a_number(recorded: dict[str, Any]) -> None:
    """PID and TASK are required, CPU unknown is -1, COMMAND and STATE default to empty."""
    printed = out(recorded, "set")
    fields = key_values(printed)
    task = fields["TASK"].split()[0]
    assert text.parse_context(without(printed, "PID")) is None
    assert text.parse_context(without(printed, "TASK")) is None
    assert text.parse_context(printed.replace(fields["TASK"], "")) is None  # TASK: with nothing after it
    assert text.parse_context(printed.replace("PID: 1", "PID: one")) is None
    assert text.parse_context(printed.replace("CPU: 0", "CPU: zero")) is None
    assert text.parse_context(printed.replace("CPU: 0", "CPU:")) is None
    no_cpu = text.parse_context(without(printed, "CPU"))
    assert no_cpu is not None and no_cpu.to_json() == {"pid": 1, "task": task, "cpu": -1, "command": "init",
                                                       "state": "TASK_RUNNING (PANIC)"}
    assert no_cpu.key == f"1/{task}/-1"
    bare = text.parse_context(without(without(printed, "COMMAND"), "STATE"))
    assert bare is not None and bare.to_json() == {"pid": 1, "task": task, "cpu": 0, "command": "", "state": ""}
    # a CPU value with words after the number (as TASK has): the number
    assert text.parse_context(printed.replace("CPU: 0", "CPU: 0  [OFFLINE]")) == text.Context(
        1, task, 0, "init", "TASK_RUNNING (PANIC)")


def test_context_lines_are_upper_case_keys_and_the_first_one_counts(recorded: dict[str, Any]) -> None:
    printed = out(recorded, "set")
    task = key_values(printed)["TASK"].split()[0]
    # a lower-case `pid:` line (crash's error lines look like that) is no field; a second PID line is ignored
    ctx = text.parse_context("pid: 7\n" + printed + "    PID: 2\n")
    assert ctx is not None and (ctx.pid, ctx.task) == (1, task)
    assert text.parse_context("    pid: 1\n   task: " + task + "\n") is None
    # a line with no colon is no field (else an empty CPU would come first)
    ctx = text.parse_context("CPU\n" + printed)
    assert ctx is not None and ctx.cpu == 0
    # a command named with an X (crash quotes it; only the quotes go)
    ctx = text.parse_context(printed.replace('"init"', '"Xorg -nolisten tcp X"'))
    assert ctx is not None and ctx.command == "Xorg -nolisten tcp X"


# ---------------------------------------------------------------------------------------------
# sys


def test_sys_is_every_key_value_line_crash_printed(recorded: dict[str, Any]) -> None:
    printed = out(recorded, "sys")
    expected = {k.lower().replace(" ", "_"): v.strip('"') for k, v in key_values(printed).items()}
    assert len(expected) == len([line for line in printed.splitlines() if line.strip()])
    system = text.parse_sys(printed)
    assert system == expected
    fixture = build()
    assert system["release"] == fixture.release
    assert system["panic"] == fixture.manifest["panic"]
    assert system["load_average"] == "0.00, 0.00, 0.00" and int(system["cpus"]) >= 1
    assert int(system["tasks"]) == len(ps_columns(out(recorded, "ps")))
    # only the quotes around a value go (a host named with X at either end keeps them)
    renamed = text.parse_sys(printed.replace("NODENAME: (none)", "NODENAME: XBOX"))
    assert renamed == {**expected, "nodename": "XBOX"}


# ---------------------------------------------------------------------------------------------
# ps


@pytest.mark.parametrize("name", ["ps", "ps_kernel", "ps_user"])
def test_ps_rows_are_crash_columns(recorded: dict[str, Any], name: str) -> None:
    expected = ps_columns(out(recorded, name))
    assert expected
    assert text.parse_ps(out(recorded, name)) == expected


def test_ps_rows_are_the_tasks_drgn_reads(recorded: dict[str, Any]) -> None:
    drgn = drgn_view(recorded)
    by_pid = {t["pid"]: t for t in [*drgn["tasks"], drgn["idle_0"]]}
    rows = text.parse_ps(out(recorded, "ps"))
    assert [r["pid"] for r in rows] == [0, 1]  # crash 8.0.2 sees only the on-CPU tasks of this kernel
    for row in rows:
        task = by_pid[row["pid"]]
        assert (row["ppid"], row["cpu"], row["task"], row["state"], row["vsz_kb"]) == (
            task["ppid"], task["cpu"], task["task"], ST_OF_LETTER[task["state"]], task["vsz_kb"])
        # crash writes a kernel thread's name in brackets
        assert row["comm"] == (f"[{task['comm']}]" if task["vsz_kb"] == 0 else task["comm"])
        assert row["active"] == (row["pid"] == drgn["crashed"]["pid"])
    kernel, user = text.parse_ps(out(recorded, "ps_kernel")), text.parse_ps(out(recorded, "ps_user"))
    assert [r["pid"] for r in kernel] == [0] and [r["pid"] for r in user] == [1]


def summary_model(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """summarize_ps as documented for the triage report: the count, the count per ST, the active tasks
    (pid, cpu, comm, state), the D-state ones (pid, cpu, comm), and the five largest RSS that are not 0
    (pid, comm, rss_kb; equal RSS keep ps's order)."""
    largest = sorted(rows, key=lambda r: r["rss_kb"], reverse=True)
    return {
        "total": len(rows),
        "by_state": dict(Counter(r["state"] for r in rows)),
        "active": [{"pid": r["pid"], "cpu": r["cpu"], "comm": r["comm"], "state": r["state"]}
                   for r in rows if r["active"]],
        "uninterruptible": [{"pid": r["pid"], "cpu": r["cpu"], "comm": r["comm"]} for r in rows
                            if r["state"] == "UN"],
        "top_rss": [{"pid": r["pid"], "comm": r["comm"], "rss_kb": r["rss_kb"]}
                    for r in largest if r["rss_kb"] > 0][:5],
    }


@pytest.mark.parametrize("name", ["ps", "ps_kernel", "ps_user"])
def test_ps_summary_of_real_tables(recorded: dict[str, Any], name: str) -> None:
    rows = ps_columns(out(recorded, name))
    assert text.summarize_ps(text.parse_ps(out(recorded, name))) == summary_model(rows)


def test_ps_summary_of_the_real_table_written_out(recorded: dict[str, Any]) -> None:
    rows = text.parse_ps(out(recorded, "ps"))
    init = next(r for r in rows if r["pid"] == 1)
    assert text.summarize_ps(rows) == {
        "total": 2, "by_state": {"RU": 2}, "active": [{"pid": 1, "cpu": 0, "comm": "init", "state": "RU"}],
        "uninterruptible": [], "top_rss": [{"pid": 1, "comm": "init", "rss_kb": init["rss_kb"]}]}
    assert init["rss_kb"] > 0


# Rows in crash's ps columns for what this dump cannot show: several CPUs and active tasks, tasks in D
# state, more than five tasks with memory, two with the same RSS, a name with a blank.
WIDE_PS = """\
      PID    PPID  CPU       TASK        ST  %MEM      VSZ      RSS  COMM
        0       0   0  ffffffff8fe1aa40  RU   0.0        0        0  [swapper/0]
>       0       0   1  ffff9b5e01230000  RU   0.0        0        0  [swapper/1]
        1       0   1  ffff9b5e0125b000  IN   0.3   167432    12020  systemd
       42       2   0  ffff9b5e02a40000  UN   0.0        0        0  [kworker/0:2]
>     311       1   0  ffff9b5e03c4b000  RU  12.5  1048576   524288  stress-ng vm
      312     311   1  ffff9b5e03c48000  UN   1.5    65536     8192  stress-ng
      400       1   0  ffff9b5e04000000  IN   0.1    22000     4096  sshd
      401     400   1  ffff9b5e04001800  IN   0.1    22000     4096  sshd
      402     401   0  ffff9b5e04003000  ST   0.0     8000     2048  bash
      403     401   1  ffff9b5e04004800  ZO   0.0        0        0  defunct
      500       1   0  ffff9b5e04100000  IN   0.2    30000     8192  journald
"""


def test_ps_table_with_every_kind_of_row() -> None:
    rows = text.parse_ps(WIDE_PS)
    assert rows == ps_columns(WIDE_PS)
    assert [r["pid"] for r in rows] == [0, 0, 1, 42, 311, 312, 400, 401, 402, 403, 500]
    assert rows[4]["comm"] == "stress-ng vm" and rows[4]["mem_pct"] == 12.5 and rows[1]["active"]
    assert text.summarize_ps(rows) == {
        "total": 11,
        "by_state": {"RU": 3, "IN": 4, "UN": 2, "ST": 1, "ZO": 1},
        "active": [{"pid": 0, "cpu": 1, "comm": "[swapper/1]", "state": "RU"},
                   {"pid": 311, "cpu": 0, "comm": "stress-ng vm", "state": "RU"}],
        "uninterruptible": [{"pid": 42, "cpu": 0, "comm": "[kworker/0:2]"},
                            {"pid": 312, "cpu": 1, "comm": "stress-ng"}],
        "top_rss": [{"pid": 311, "comm": "stress-ng vm", "rss_kb": 524288},
                    {"pid": 1, "comm": "systemd", "rss_kb": 12020},
                    {"pid": 312, "comm": "stress-ng", "rss_kb": 8192},
                    {"pid": 500, "comm": "journald", "rss_kb": 8192},
                    {"pid": 400, "comm": "sshd", "rss_kb": 4096}],
    }
    assert text.summarize_ps(rows) == summary_model(rows)
    # fewer than five tasks with memory: only those
    assert text.summarize_ps(rows[:4])["top_rss"] == [{"pid": 1, "comm": "systemd", "rss_kb": 12020}]
    assert text.summarize_ps([]) == {"total": 0, "by_state": {}, "active": [], "uninterruptible": [], "top_rss": []}


def test_lines_that_are_not_ps_rows() -> None:
    assert text.parse_ps("ps: invalid task or pid value: 99\n") == []
    # a row needs every column: a cut-off one, or a lower-case ST, is not one
    assert text.parse_ps("      1       0   0  ffff9b5e0125b000  IN   0.3   167432\n") == []
    assert text.parse_ps("      1       0   0  ffff9b5e0125b000  in   0.3   167432    12020  systemd\n") == []


# ---------------------------------------------------------------------------------------------
# bt


@pytest.mark.parametrize("name", ["bt", "bt_frames_data", "bt_lines", "bt_0"])
def test_bt_head_and_frames_are_crash_lines(recorded: dict[str, Any], name: str) -> None:
    expected = bt_reading(out(recorded, name))
    assert len(expected["frames"]) >= 5
    assert text.parse_bt(out(recorded, name)) == expected


def test_bt_frames_do_not_depend_on_the_extra_lines(recorded: dict[str, Any]) -> None:
    """`bt -f` adds the stack words and `bt -l` the source lines below each frame: the same frames."""
    plain = text.parse_bt(out(recorded, "bt"))
    assert text.parse_bt(out(recorded, "bt_frames_data")) == plain
    assert text.parse_bt(out(recorded, "bt_lines")) == plain
    assert [f["level"] for f in plain["frames"]] == list(range(len(plain["frames"])))


def test_bt_is_the_panic_thread_drgn_unwinds(recorded: dict[str, Any]) -> None:
    drgn = drgn_view(recorded)
    bt = text.parse_bt(out(recorded, "bt"))
    crashed = drgn["crashed"]
    assert (bt["pid"], bt["task"], bt["cpu"], bt["comm"]) == (crashed["pid"], crashed["task"], crashed["cpu"],
                                                              crashed["comm"])
    # crash's frames from panic to the system call, in drgn's order (drgn adds inlined ones, names
    # .cold parts by their function)
    names = [f.removesuffix(".cold") for f in bt["functions"][: bt["functions"].index("do_syscall_64") + 1]]
    assert names[0] == "panic"
    drgn_frames = iter(drgn["crashed_frames"])
    assert all(name in drgn_frames for name in names), (names, drgn["crashed_frames"])
    idle = text.parse_bt(out(recorded, "bt_0"))
    assert (idle["pid"], idle["task"], idle["comm"]) == (0, drgn["idle_0"]["task"], drgn["idle_0"]["comm"])


def test_bt_without_a_head_has_frames_only() -> None:
    lines = (" #0 [ffffd1c7c0013b80] panic at ffffffffaf5cd21a\n"
             "#12 [ffffd1c7c0013ea8] do_sys_openat2 at ffffffffaef4a3eb\n")
    assert text.parse_bt(lines) == {
        "frames": [{"level": 0, "function": "panic", "sp": "ffffd1c7c0013b80", "pc": "ffffffffaf5cd21a"},
                   {"level": 12, "function": "do_sys_openat2", "sp": "ffffd1c7c0013ea8", "pc": "ffffffffaef4a3eb"}],
        "functions": ["panic", "do_sys_openat2"]}
    assert text.parse_bt("bt: invalid task or pid value: 85\n") == {"frames": [], "functions": []}


# ---------------------------------------------------------------------------------------------
# kmem -i


def kmem_reading(output: str) -> dict[str, dict[str, Any]]:
    """kmem -i rows: NAME (words), PAGES, TOTAL (a number and maybe a unit), then `----` or `N% of TOTAL X`."""
    rows = {}
    for line in output.splitlines():
        words = line.split()
        if not words or not (words[-1] == "----" or "of" in words):
            continue
        at = next(i for i, w in enumerate(words) if w.isdigit())
        tail = 1 if words[-1] == "----" else 4
        rows["_".join(words[:at]).lower()] = {
            "pages": int(words[at]), "size": " ".join(words[at + 1: len(words) - tail]),
            "percent": None if tail == 1 else int(words[-4].rstrip("%"))}
    return rows


def test_kmem_rows_are_crash_columns(recorded: dict[str, Any]) -> None:
    expected = kmem_reading(out(recorded, "kmem_i"))
    assert {"total_mem", "free", "used", "total_swap", "commit_limit", "committed"} <= set(expected)
    assert text.parse_kmem_i(out(recorded, "kmem_i")) == expected


# ---------------------------------------------------------------------------------------------
# Startup limits


def pid_hash_limit(version: str, seen: str, drgn: str) -> str:
    """The limit's sentence, as diagd documents it to the client."""
    return (f"{version} cannot read this kernel's PID hash (it printed 'WARNING: active task ... not found in PID "
            f"hash'): ps, foreach and sys TASKS list {seen} task(s), only those running on a CPU.{drgn} bt, log, "
            "kmem, dis, struct, p, sym and mod still work. For the full task list use run_drgn_command "
            "(for_each_task(prog)), or crash >= 8.0.4 (Linux 6.1.y backported the pid.numbers[] change that "
            "crash 8.0.2 predates).")


def test_the_real_startup_warning_becomes_the_pid_hash_limit(recorded: dict[str, Any]) -> None:
    startup, version = recorded["startup"], recorded["crash_version"]
    assert re.search(r"WARNING: active task [0-9a-f]+ on cpu \d+ not found in PID hash", startup), startup
    tasks_crash = int(text.parse_sys(out(recorded, "sys"))["tasks"])
    drgn_tasks = len(recorded["drgn"]["tasks"]) if recorded["drgn"] else 47
    assert text.startup_limits(startup, version, drgn_tasks, tasks_crash) == [
        pid_hash_limit(version, str(tasks_crash), f" drgn sees all {drgn_tasks}.")]
    # crash's TASKS unknown, drgn's count unknown (-1), crash's version unknown
    assert text.startup_limits(startup, None, -1, None) == [pid_hash_limit("this crash", "only the on-CPU", "")]
    assert text.startup_limits(startup, version, 0, 0) == [pid_hash_limit(version, "0", " drgn sees all 0.")]


def test_no_limit_without_the_warning(recorded: dict[str, Any]) -> None:
    startup = recorded["startup"]
    assert text.startup_limits(startup.replace("PID hash", "pid table"), "crash 8.0.2", 47, 2) == []
    assert text.startup_limits("", "crash 8.0.6", 47, 47) == []
