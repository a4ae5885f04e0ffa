"""What a crash session reports about its dump: open_vmcore_session's summary and get_crash_info's
triage report.

Both are assembled from outputs the session already ran and stored (`Entry`, first lines in memory),
parsed with `text`; running the commands and asking drgn is the actor's job, so everything
here is pure. `DRGN_TASK_SUMMARY` is the drgn code behind the triage report's view of all tasks: it
prints one JSON object (counts by state, the uninterruptible tasks, the distinct commands).
"""

from __future__ import annotations

from typing import Any

from diagd.actors.crash import text as text
from diagd.actors.crash.replies import TriageReply
from diagd.actors.crash.store import Entry

DRGN_TASK_SUMMARY = (
    "def __diagd_tasks():\n"
    "    import json\n"
    "    counts, blocked, names = {}, [], []\n"
    "    for t in for_each_task(prog):\n"
    "        st = task_state_to_char(t)\n"
    "        counts[st] = counts.get(st, 0) + 1\n"
    "        comm = t.comm.string_().decode(errors='replace')\n"
    "        names.append(comm)\n"
    "        if st == 'D':\n"
    "            blocked.append({'pid': t.pid.value_(), 'comm': comm})\n"
    "    print(json.dumps({'total': sum(counts.values()), 'by_state': counts, 'uninterruptible': blocked,\n"
    "                      'commands': sorted(set(names))}))\n"
    "__diagd_tasks()\n"
    "del __diagd_tasks\n")


def session_summary(system: dict[str, str], *, startup_output: str, crash_version: str | None,
                    crash_load_s: float | None, panic: text.Context | None, drgn: dict[str, Any],
                    drgn_tasks: int, sys_command_id: str | None) -> dict[str, Any]:
    """The summary of an opened session: `sys`, the panic task, crash's load time and warnings,
    drgn's state (`drgn`, as the actor describes it) and the limits known from startup."""
    tasks_crash = None
    try:
        tasks_crash = int(system.get("tasks", ""))
    except ValueError:
        pass
    limits = text.startup_limits(startup_output, crash_version, drgn_tasks, tasks_crash)
    warnings = [line.strip() for line in startup_output.splitlines() if line.strip()]
    summary: dict[str, Any] = {
        "system": system,
        "panic": system.get("panic"),
        "release": system.get("release"),
        "panic_task": panic.to_json() if panic else None,
        "crash_version": crash_version,
        "crash_load_s": round(crash_load_s or 0, 3),
        "crash_warnings": warnings[:20],
        "drgn": drgn,
        "limits": limits,
    }
    if sys_command_id is not None:
        summary["sys_command_id"] = sys_command_id
    return summary


def triage_report(session_id: str, *, sys_e: Entry, bt_e: Entry, log_e: Entry, kmem_e: Entry, ps_e: Entry,
                  log_lines: list[str], ps_lines: list[str], panic: text.Context | None,
                  drgn_tasks: dict[str, Any] | None, limits: list[Any], log_tail_lines: int) -> TriageReply:
    """get_crash_info's report from the stored `sys`, `bt`, `log`, `kmem -i` and `ps` outputs (the log
    and ps in full) and drgn's task summary (None when drgn is not ready)."""
    system = text.parse_sys("\n".join(sys_e.head))
    bt = text.parse_bt("\n".join(bt_e.head))
    tasks: dict[str, Any] = {"command_id": ps_e.command_id, "crash": text.summarize_ps(text.parse_ps(
        "\n".join(ps_lines)))}
    if drgn_tasks is not None:
        tasks["drgn"] = drgn_tasks
    return {
        "session_id": session_id,
        "system": system,
        "panic": system.get("panic"),
        "panic_task": panic.to_json() if panic else None,
        "backtrace": {"command_id": bt_e.command_id, "command": bt_e.command, **bt,
                      "text": "\n".join(bt_e.head[:60])},
        "log_tail": {"command_id": log_e.command_id, "total_lines": log_e.total_lines,
                     "lines": log_lines[-log_tail_lines:]},
        "memory": {"command_id": kmem_e.command_id, **text.parse_kmem_i("\n".join(kmem_e.head))},
        "tasks": tasks,
        "limits": limits,
        "next_steps": ["get_command_output / search_command_output on these command ids",
                       "run_crash_command: 'bt -a', 'log', 'kmem -s', 'struct <type> <addr>', 'dis -l <fn>'",
                       "run_drgn_command: prog.crashed_thread().stack_trace(), for_each_task(prog)"],
    }
