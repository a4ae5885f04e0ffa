"""The crash/drgn back end through the real path (SDK client -> diagd mcp shim -> daemon -> crash + drgn worker)
on a real panic dump built by tests/fixtures/make-vmcore.sh (Debian cloud kernel, `echo c > /proc/sysrq-trigger`).

One daemon and one shared session serve most tests (crash takes 5-9 s to load); the tests that kill or close
sessions open their own, with distinct crash options so they get their own session key. Nothing here depends on
KASLR addresses or exact task counts (crash 8.0.2 sees only the on-CPU tasks of these 6.1 kernels).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.conftest import DIAGD, SUPPORT, DaemonProcess, Env, start_daemon
from tests.fixtures.vmcore import VmcoreFixture, build, fake_vmlinux
from tests.support.progress import delivered

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("crash") is None, reason="crash is not installed (scripts/setup.sh installs it)"),
]

PANIC = "Kernel panic - not syncing: sysrq triggered crash"
SCRIPT = '"""Count tasks by command name (drgn)."""\nimport collections\n' \
         'print(sorted(collections.Counter(t.comm.string_().decode() for t in for_each_task(prog)).items()))\n'


def make_env(root: Path, config: str, state: Path | None = None) -> Env:
    runtime = Path(f"/tmp/diagd-crash-{os.getpid()}-{root.name[-10:]}")
    shutil.rmtree(runtime, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.toml").write_text(config)
    state = state or root / "state"
    variables = {**os.environ, "DIAGD_RUNTIME_DIR": str(runtime), "DIAGD_STATE_DIR": str(state),
                 "DIAGD_CONFIG": str(root / "config.toml"), "PYTHONPATH": str(SUPPORT)}
    return Env(root, runtime, state, root / "config.toml", variables)


@dataclass
class Setup:
    daemon: DaemonProcess
    fixture: VmcoreFixture
    root: Path
    session: dict[str, Any]
    progress: list[tuple[float, float | None, str | None]]


@asynccontextmanager
async def client_for(daemon: DaemonProcess) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=daemon.env.vars)
    async with Client(params, mode="legacy") as client:
        yield client


async def call_on(client: Client, tool: str, progress: Any = None, **args: Any) -> dict[str, Any]:
    with trio.fail_after(120):
        result = await client.call_tool(tool, args, progress_callback=progress)
    if progress is not None:
        await delivered()
    payload: dict[str, Any] = json.loads(result.content[0].text)
    if not result.is_error:
        assert result.structured_content == payload
    payload["_is_error"] = result.is_error
    return payload


async def call(daemon: DaemonProcess, tool: str, **args: Any) -> dict[str, Any]:
    async with client_for(daemon) as client:
        return await call_on(client, tool, **args)


def status(daemon: DaemonProcess) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(daemon.env.run("status", "--json").stdout)
    return result


def session_details(daemon: DaemonProcess, session_id: str) -> dict[str, Any] | None:
    for actor in status(daemon)["actors"]:
        if actor["kind"] == "crash" and actor["details"].get("session_id") == session_id:
            details: dict[str, Any] = actor["details"]
            return details
    return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: list[int], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, f"processes still alive: {[p for p in pids if alive(p)]}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    fixture = build()
    root = tmp_path_factory.mktemp("crashd")
    (root / "scripts").mkdir()
    (root / "scripts" / "task_names.py").write_text(SCRIPT)
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{fixture.dir}", "{root}"]\n'
                         f'[crash]\nscript_dirs = ["{root / "scripts"}"]\nidle_timeout_s = 900\n')
    daemon = start_daemon(env)
    progress: list[tuple[float, float | None, str | None]] = []

    async def open_shared() -> dict[str, Any]:
        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            progress.append((p, total, message))

        return await call(daemon, "open_vmcore_session", vmcore_path=str(fixture.vmcore),
                          vmlinux_path=str(fixture.vmlinux), progress=on_progress)

    try:
        session = trio.run(open_shared)
        assert not session["_is_error"], session
        yield Setup(daemon, fixture, root, session, progress)
    finally:
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)


async def crash(setup: Setup, command: str, **args: Any) -> dict[str, Any]:
    return await call(setup.daemon, "run_crash_command", command=command, session_id=setup.session["session_id"],
                      **args)


async def drgn(setup: Setup, code: str) -> dict[str, Any]:
    return await call(setup.daemon, "run_drgn_command", code=code, session_id=setup.session["session_id"])


# ---------------------------------------------------------------------------------------------


async def test_open_summarises_the_panic_reports_progress_and_states_the_crash_limit(setup: Setup) -> None:
    session = setup.session
    assert session["is_new"] and session["refcount"] == 1 and session["state"] == "ready"
    assert Path(session["workdir"]).is_dir() and session["workdir"].startswith(str(setup.daemon.env.state))
    summary = session["summary"]
    assert summary["panic"] == PANIC and summary["release"] == setup.fixture.release
    assert summary["panic_task"]["command"] == "init"
    assert summary["drgn"]["phase"] == "ready" and summary["drgn"]["tasks"] > 10
    assert any("build id" in m for m in session["match"])
    if any("not found in PID hash" in w for w in summary["crash_warnings"]):  # crash < 8.0.4 on 6.1.y
        assert any("PID hash" in lim and "run_drgn_command" in lim for lim in summary["limits"])
    assert setup.progress and setup.progress[-1][2] == "crash ready"
    assert any("crash is loading" in (m or "") for _, _, m in setup.progress)
    assert [p for p, _, _ in setup.progress] == sorted(p for p, _, _ in setup.progress)


async def test_opening_the_same_dump_again_joins_the_session(setup: Setup) -> None:
    before = session_details(setup.daemon, setup.session["session_id"])
    again = await call(setup.daemon, "open_vmcore_session", vmcore_path=str(setup.fixture.vmcore),
                       vmlinux_path=str(setup.fixture.vmlinux))
    after = session_details(setup.daemon, setup.session["session_id"])
    assert before is not None and after is not None
    assert (after["crash_pid"], after["drgn_pid"]) == (before["crash_pid"], before["drgn_pid"])  # no new load
    assert not again["is_new"] and again["session_id"] == setup.session["session_id"] and again["refcount"] == 2
    closed = await call(setup.daemon, "close_vmcore_session", session_id=again["session_id"])
    assert closed["closed"] is False and closed["refcount"] == 1


async def test_the_same_dump_through_a_copy_a_hard_link_or_a_symlink_joins_the_open_session(setup: Setup) -> None:
    others = setup.root / "same-dump"
    others.mkdir(exist_ok=True)
    copy, hard, soft = others / "vmcore.copy", others / "vmcore.hard", others / "vmcore.soft"
    for path in (copy, hard, soft):
        path.unlink(missing_ok=True)
    shutil.copyfile(setup.fixture.vmcore, copy)  # another inode and mtime, the same bytes
    os.link(copy, hard)
    soft.symlink_to(setup.fixture.vmcore)
    vmlinux_link = others / "vmlinux.soft"
    vmlinux_link.unlink(missing_ok=True)
    vmlinux_link.symlink_to(setup.fixture.vmlinux)
    before = session_details(setup.daemon, setup.session["session_id"])
    async with client_for(setup.daemon) as client:
        for path in (copy, hard, soft):
            joined = await call_on(client, "open_vmcore_session", vmcore_path=str(path),
                                   vmlinux_path=str(vmlinux_link))
            assert not joined["_is_error"], joined
            assert joined["session_id"] == setup.session["session_id"] and not joined["is_new"] and joined["joined"]
            assert joined["vmcore"] == str(setup.fixture.vmcore) == setup.session["vmcore"]  # opened as
            assert joined["requested"]["vmcore"] == str(path.resolve())
            assert f"opened as {setup.fixture.vmcore}" in joined["note"] or path == soft
        for _ in range(3):
            closed = await call_on(client, "close_vmcore_session", session_id=setup.session["session_id"])
            assert closed["closed"] is False
    after = session_details(setup.daemon, setup.session["session_id"])
    assert before is not None and after is not None
    assert (after["crash_pid"], after["drgn_pid"]) == (before["crash_pid"], before["drgn_pid"])  # no second load
    assert [a for a in status(setup.daemon)["actors"] if a["kind"] == "crash"
            and a["details"]["session_id"] != setup.session["session_id"]
            and a["details"]["vmcore"].startswith(str(others))] == []


async def test_sys_shows_the_sysrq_panic(setup: Setup) -> None:
    result = await crash(setup, "sys")
    assert f'PANIC: "{PANIC}"' in result["output"] and setup.fixture.release in result["output"]


async def test_bt_of_the_panic_task_includes_sysrq_handle_crash(setup: Setup) -> None:
    result = await crash(setup, "bt")
    assert 'COMMAND: "init"' in result["output"] and "sysrq_handle_crash" in result["output"]
    assert result["context"]["command"] == "init"


async def test_ps_lists_the_panic_task(setup: Setup) -> None:
    result = await crash(setup, "ps")
    rows = [line for line in result["output"].splitlines() if line.strip().endswith(" init")]
    assert rows and rows[0].startswith(">")


async def test_log_is_paged_and_searched_from_storage(setup: Setup) -> None:
    log = await crash(setup, "log", max_lines=5)
    assert log["lines_returned"] == 5 and log["total_lines"] > 100 and log["truncated"]
    page = await call(setup.daemon, "get_command_output", command_id=log["command_id"], offset=5, limit=500)
    assert page["returned"] == min(500, log["total_lines"] - 5) and page["offset"] == 5
    tail = await call(setup.daemon, "get_command_output", command_id=log["command_id"],
                      offset=log["total_lines"] - 3, limit=10)
    assert not tail["has_more"] and "end Kernel panic" in tail["output"]
    too_many = await call(setup.daemon, "get_command_output", command_id=log["command_id"], limit=501)
    assert too_many["code"] == "INVALID_ARGUMENT"
    found = await call(setup.daemon, "search_command_output", command_id=log["command_id"],
                       query=r"sysrq: (Trigger|trigger) a crash", context_lines=2)
    assert found["match_count"] >= 1
    match = found["matches"][0]
    assert len(match["before"]) == 2
    line = await call(setup.daemon, "get_command_output", command_id=log["command_id"],
                      offset=match["line_number"], limit=1)
    assert line["output"] == match["line"]
    bad = await call(setup.daemon, "search_command_output", command_id=log["command_id"], query="([")
    assert bad["code"] == "INVALID_ARGUMENT"


async def test_repeated_commands_hit_the_cache_and_force_execute_reruns(setup: Setup) -> None:
    first = await crash(setup, "kmem -i")
    again = await crash(setup, "kmem -i")
    assert again["cached"] and again["command_id"] == first["command_id"] and again["output"] == first["output"]
    forced = await crash(setup, "kmem -i", force_execute=True)
    assert not forced["cached"] and forced["command_id"] != first["command_id"]
    assert forced["output"] == first["output"]


async def test_set_pid_then_bt_is_keyed_by_the_new_context(setup: Setup) -> None:
    panic_bt = await crash(setup, "bt")
    try:
        switched = await crash(setup, "set 0")
        assert "PID: 0" in switched["output"]
        idle = await crash(setup, "bt")
        assert not idle["cached"] and idle["command_id"] != panic_bt["command_id"]
        assert "PID: 0 " in idle["output"] and "sysrq_handle_crash" not in idle["output"]
        forced = await crash(setup, "bt", force_execute=True)
        assert "PID: 0 " in forced["output"] and "sysrq_handle_crash" not in forced["output"]
    finally:
        await crash(setup, "set -p")
    back = await crash(setup, "bt")
    assert back["cached"] and back["command_id"] == panic_bt["command_id"] and "sysrq_handle_crash" in back["output"]


async def test_drgn_reads_init_task_and_walks_the_tasks(setup: Setup) -> None:
    comm = await drgn(setup, "prog['init_task'].comm")
    assert comm["output"] == '(char [16])"swapper/0"' and comm["engine"] == "drgn"
    walk = await drgn(setup, "names = [t.comm.string_().decode() for t in for_each_task(prog)]\n"
                             "print(len(names)); print(sorted(set(names)))")
    count, names = walk["output"].splitlines()[:2]
    assert int(count) > 10 and all(n in names for n in ("'init'", "'sleep'", "'cat'"))
    trace = await drgn(setup, "print(prog.crashed_thread().stack_trace())")
    assert "sysrq_handle_crash" in trace["output"]
    reused = await drgn(setup, "len(names)")  # variables persist between calls
    assert reused["output"] == count


async def test_a_drgn_exception_is_an_error_and_the_worker_survives(setup: Setup) -> None:
    before = session_details(setup.daemon, setup.session["session_id"])
    failed = await drgn(setup, "print('partial')\nprog['no_such_symbol_anywhere']")
    assert failed["_is_error"] and failed["code"] == "INVALID_ARGUMENT"
    assert "ObjectNotFoundError" in failed["message"] or "KeyError" in failed["message"]
    assert "Traceback" in failed["details"]["traceback"] and failed["details"]["output"].startswith("partial")
    stored = await call(setup.daemon, "get_command_output", command_id=failed["details"]["command_id"])
    assert "no_such_symbol_anywhere" in stored["output"]
    ok = await drgn(setup, "prog['init_task'].pid")
    assert not ok["_is_error"] and ok["output"].endswith("0")
    after = session_details(setup.daemon, setup.session["session_id"])
    assert before and after and before["drgn_pid"] == after["drgn_pid"]


async def test_prefixes_route_to_drgn_and_crash_and_pykdump_is_explained(setup: Setup) -> None:
    via_drgn = await crash(setup, "drgn: prog['init_task'].comm")
    assert via_drgn["engine"] == "drgn" and "swapper/0" in via_drgn["output"]
    via_crash = await crash(setup, "crash:sys")
    assert via_crash["engine"] == "crash" and PANIC in via_crash["output"]
    pykdump = await crash(setup, "pykdump: xportshow")
    assert pykdump["code"] == "BACKEND_UNAVAILABLE" and "pykdump" in pykdump["message"]


async def test_shell_escapes_pipes_and_quit_are_refused(setup: Setup) -> None:
    for command in ("log | tail -5", "!id", "quit", "gdb shell id"):
        refused = await crash(setup, command)
        assert refused["_is_error"] and refused["code"] == "INVALID_ARGUMENT", command
    assert not (await crash(setup, "sys"))["_is_error"]


async def test_a_vmlinux_of_another_kernel_is_refused_before_anything_starts(setup: Setup) -> None:
    wrong_release = fake_vmlinux(setup.root / "vmlinux-5.10", release="5.10.0-99-amd64", build_id=b"\x11" * 20)
    same_release = fake_vmlinux(setup.root / "vmlinux-rebuilt", release=setup.fixture.release, build_id=b"\x22" * 20)
    actors_before = [a["id"] for a in status(setup.daemon)["actors"] if a["kind"] == "crash"]
    for vmlinux, words in ((wrong_release, ("5.10.0-99-amd64", setup.fixture.release)), (same_release, ("build id",))):
        refused = await call(setup.daemon, "open_vmcore_session", vmcore_path=str(setup.fixture.vmcore),
                             vmlinux_path=str(vmlinux))
        assert refused["_is_error"] and refused["code"] == "INVALID_ARGUMENT"
        assert refused["details"]["reason"] == "vmlinux_mismatch"
        assert all(w in refused["message"] for w in words)
    assert [a["id"] for a in status(setup.daemon)["actors"] if a["kind"] == "crash"] == actors_before
    outside = await call(setup.daemon, "open_vmcore_session", vmcore_path="/proc/kcore",
                         vmlinux_path=str(setup.fixture.vmlinux))
    assert outside["code"] in ("PERMISSION_DENIED", "FILE_NOT_FOUND")  # outside allowed_dirs, if it exists at all


async def test_get_crash_info_is_a_structured_triage(setup: Setup) -> None:
    info = await call(setup.daemon, "get_crash_info", session_id=setup.session["session_id"])
    assert info["panic"] == PANIC and info["system"]["release"] == setup.fixture.release
    assert info["panic_task"]["command"] == "init"
    assert "sysrq_handle_crash" in info["backtrace"]["functions"] and info["backtrace"]["comm"] == "init"
    assert any("end Kernel panic" in line for line in info["log_tail"]["lines"])
    assert info["memory"]["total_mem"]["pages"] > 0
    assert info["tasks"]["crash"]["total"] >= 1 and info["tasks"]["crash"]["active"][0]["comm"] == "init"
    assert info["tasks"]["drgn"]["total"] > info["tasks"]["crash"]["total"] - 1
    assert {"init", "sleep", "cat"} <= set(info["tasks"]["drgn"]["commands"])
    page = await call(setup.daemon, "get_command_output", command_id=info["backtrace"]["command_id"])
    assert "sysrq_handle_crash" in page["output"]


def crash_directly(fixture: VmcoreFixture, where: Path, commands: dict[str, str]) -> dict[str, list[str]]:
    """Run `crash -s` on the dump ourselves (no diagd, no pty, no sandbox), each command's output
    redirected to its own file by crash, and return the lines of each."""
    where.mkdir(parents=True, exist_ok=True)
    script = where / "commands"
    script.write_text("".join(f"{command} > {where / name}\n" for name, command in commands.items()) + "exit\n")
    subprocess.run(["crash", "-s", "--no_crashrc", "-i", str(script), str(fixture.vmlinux), str(fixture.vmcore)],
                   env={**os.environ, "TERM": "dumb", "LC_ALL": "C", "PAGER": "cat"}, stdin=subprocess.DEVNULL,
                   capture_output=True, timeout=300, check=True)
    return {name: (where / name).read_text().splitlines() for name in commands}


def drgn_directly(fixture: VmcoreFixture) -> dict[str, Any]:
    """The same figures from a drgn Program of our own on the same dump and vmlinux."""
    from drgn import Program
    from drgn.helpers.linux.pid import for_each_task
    from drgn.helpers.linux.sched import task_state_to_char

    prog = Program()
    prog.set_core_dump(str(fixture.vmcore))
    prog.load_debug_info([str(fixture.vmlinux)])
    by_state: dict[str, int] = {}
    names, blocked = [], []
    for task in for_each_task(prog):
        state = task_state_to_char(task)
        by_state[state] = by_state.get(state, 0) + 1
        comm = task.comm.string_().decode(errors="replace")
        names.append(comm)
        if state == "D":
            blocked.append({"pid": task.pid.value_(), "comm": comm})
    thread = prog.crashed_thread()
    return {"tasks": {"total": len(names), "by_state": by_state, "uninterruptible": blocked,
                      "commands": sorted(set(names))},
            "crashed_pid": thread.tid, "crashed_comm": thread.object.comm.string_().decode(),
            "release": prog["init_uts_ns"].name.release.string_().decode()}


def colon_fields(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        key, _, value = line.partition(": ")
        if key.strip():
            out.setdefault(key.strip(), value.strip())
    return out


async def test_get_crash_info_matches_crash_and_drgn_run_directly_on_the_same_dump(setup: Setup,
                                                                                   tmp_path: Path) -> None:
    pytest.importorskip("drgn")
    info = await call(setup.daemon, "get_crash_info", session_id=setup.session["session_id"])
    assert not info["_is_error"], info
    direct = await trio.to_thread.run_sync(crash_directly, setup.fixture, tmp_path / "crash", {
        "sys": "sys", "set": "set", "bt": "bt", "ps": "ps", "log": "log", "kmem": "kmem -i"})
    program = await trio.to_thread.run_sync(drgn_directly, setup.fixture)

    # sys: every field, as crash printed it
    system = {k.lower().replace(" ", "_"): v.strip('"') for k, v in colon_fields(direct["sys"]).items()}
    assert info["system"] == system and info["panic"] == system["panic"]
    assert info["system"]["release"] == program["release"]

    # the panic task: crash's `set` right after loading, and drgn's crashed thread
    context = colon_fields(direct["set"])
    assert info["panic_task"] == {"pid": int(context["PID"]), "task": context["TASK"].split()[0],
                                  "cpu": int(context["CPU"]), "command": context["COMMAND"].strip('"'),
                                  "state": context["STATE"]}
    assert (info["panic_task"]["pid"], info["panic_task"]["command"]) == (program["crashed_pid"],
                                                                        program["crashed_comm"])

    # the panic task's backtrace, line for line, and the frames derived from it
    assert info["backtrace"]["text"] == "\n".join(direct["bt"][:60])
    frames = [line.split() for line in direct["bt"] if line.lstrip().startswith("#")]
    assert info["backtrace"]["functions"] == [f[2] for f in frames]
    head = direct["bt"][0].split()
    assert (info["backtrace"]["pid"], info["backtrace"]["task"], info["backtrace"]["cpu"]) == (
        int(head[1]), head[3], int(head[5]))

    # ps: the count and every figure derived from the rows
    rows = []
    for line in direct["ps"][1:]:
        active = line.startswith(">")
        pid, _ppid, cpu, _task, state, _mem, _vsz, rss, comm = line.lstrip(">").split(None, 8)
        rows.append({"pid": int(pid), "cpu": int(cpu), "comm": comm, "state": state, "rss_kb": int(rss),
                     "active": active})
    crash_tasks = info["tasks"]["crash"]
    assert crash_tasks["total"] == len(rows) == int(system["tasks"])
    assert crash_tasks["by_state"] == {s: sum(r["state"] == s for r in rows) for s in {r["state"] for r in rows}}
    assert crash_tasks["active"] == [{k: r[k] for k in ("pid", "cpu", "comm", "state")} for r in rows if r["active"]]
    assert crash_tasks["uninterruptible"] == [{k: r[k] for k in ("pid", "cpu", "comm")} for r in rows
                                              if r["state"] == "UN"]
    assert crash_tasks["top_rss"] == [{k: r[k] for k in ("pid", "comm", "rss_kb")}
                                      for r in sorted(rows, key=lambda r: -r["rss_kb"])[:5] if r["rss_kb"]]

    # the log: its length, its tail, and the panic line in it
    assert info["log_tail"]["total_lines"] == len(direct["log"])
    assert info["log_tail"]["lines"] == direct["log"][-40:]
    assert any(line.split("] ", 1)[-1] == system["panic"] for line in direct["log"])

    # kmem -i: every row
    memory = {}
    for line in direct["kmem"]:
        parts = re.match(r"^\s*([A-Z][A-Z ]*[A-Z])\s+(\d+)\s+(.*?)\s+(----|\d+% of TOTAL \w+)$", line)
        if parts:
            pct = parts[4]
            memory[parts[1].lower().replace(" ", "_")] = {
                "pages": int(parts[2]), "size": parts[3], "percent": None if pct == "----" else int(pct.split("%")[0])}
    assert {k: v for k, v in info["memory"].items() if k != "command_id"} == memory and memory

    # drgn's view of all tasks, and what the session summary derives from it
    assert {k: v for k, v in info["tasks"]["drgn"].items() if k != "command_id"} == program["tasks"]
    summary = setup.session["summary"]
    assert summary["drgn"]["tasks"] == program["tasks"]["total"]
    assert (summary["drgn"]["crashed_pid"], summary["drgn"]["crashed_comm"]) == (program["crashed_pid"],
                                                                                  program["crashed_comm"])
    for limit in summary["limits"]:
        if "PID hash" in limit:
            assert f"list {system['tasks']} task(s)" in limit and f"drgn sees all {program['tasks']['total']}." in limit


async def test_analysis_scripts_are_listed_and_run(setup: Setup) -> None:
    listed = await call(setup.daemon, "list_analysis_scripts")
    assert [s["name"] for s in listed["scripts"]] == ["task_names"]
    assert listed["scripts"][0]["description"] == "Count tasks by command name (drgn)."
    ran = await call(setup.daemon, "run_analysis_script", name="task_names", session_id=setup.session["session_id"])
    assert "('init', 1)" in ran["output"] and ran["command"] == "[script] task_names"
    missing = await call(setup.daemon, "run_analysis_script", name="nope", session_id=setup.session["session_id"])
    assert missing["code"] == "NOT_FOUND"


async def test_other_calls_answer_while_a_dump_opens_then_refcounts_close_it(setup: Setup) -> None:
    daemon = setup.daemon
    opened: dict[str, Any] = {}
    progress: list[str | None] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    async def open_it() -> None:
        opened.update(await call(daemon, "open_vmcore_session", vmcore_path=str(setup.fixture.vmcore),
                                 vmlinux_path=str(setup.fixture.vmlinux), crash_args=["--dec"], progress=on_progress))

    async with client_for(daemon) as other, trio.open_nursery() as nursery:
        await call_on(other, "list_vmcore_sessions")  # client started and initialised
        nursery.start_soon(open_it)
        new_id = None
        with trio.fail_after(30):
            while new_id is None:
                sessions = (await call_on(other, "list_vmcore_sessions"))["sessions"]
                new_id = next((s["session_id"] for s in sessions if s["state"] == "opening"), None)
        # Ordering, not wall-clock: calls made while crash loads must come back before the open does.
        answered_while_opening = 0
        answered_drgn = None
        while not opened:
            await call_on(other, "list_vmcore_sessions")
            answered_while_opening += not opened
            if answered_drgn is None:
                result = await call_on(other, "run_drgn_command", code="prog['init_task'].comm", session_id=new_id)
                answered_drgn = (result, bool(opened))
            await trio.sleep(0.2)
    assert answered_while_opening >= 3, "other calls waited for the dump to open"
    assert answered_drgn is not None and not answered_drgn[1], "drgn should answer before crash is ready"
    assert "swapper/0" in answered_drgn[0]["output"]
    assert opened["is_new"] and opened["session_id"] == new_id and opened["session_id"] != setup.session["session_id"]
    assert any("drgn ready" in (m or "") for m in progress)
    details = session_details(daemon, new_id)
    assert details is not None
    pids = [details["crash_pid"], details["drgn_pid"]]
    joined = await call(daemon, "open_vmcore_session", vmcore_path=str(setup.fixture.vmcore),
                        vmlinux_path=str(setup.fixture.vmlinux), crash_args=["--dec"])
    assert not joined["is_new"] and joined["refcount"] == 2
    command = await call(daemon, "run_crash_command", command="sys", session_id=new_id)
    first_close = await call(daemon, "close_vmcore_session", session_id=new_id)
    assert not first_close["closed"] and first_close["refcount"] == 1 and all(alive(p) for p in pids)
    last_close = await call(daemon, "close_vmcore_session", session_id=new_id)
    assert last_close["closed"] and last_close["stopped"] == {"crash": "quit", "drgn": "quit"}
    wait_gone(pids, timeout=2)
    after = await call(daemon, "run_crash_command", command="sys", session_id=new_id)
    assert after["code"] == "NOT_FOUND" and "closed" in after["message"]
    kept = await call(daemon, "get_command_output", command_id=command["command_id"])
    assert PANIC in kept["output"]


async def test_a_killed_crash_is_started_again_by_the_next_call_and_a_killed_drgn_is_restarted(
        setup: Setup) -> None:
    daemon = setup.daemon
    args = {"vmcore_path": str(setup.fixture.vmcore), "vmlinux_path": str(setup.fixture.vmlinux),
            "crash_args": ["--hex"]}
    doomed = await call(daemon, "open_vmcore_session", **args)
    details = session_details(daemon, doomed["session_id"])
    assert details is not None
    os.kill(details["crash_pid"], signal.SIGKILL)
    wait_gone([details["crash_pid"], details["drgn_pid"]], timeout=10)
    with trio.fail_after(10):
        while True:  # the session notices its crash died (its pty closes)
            listing = await call(daemon, "list_vmcore_sessions")
            state = {s["session_id"]: s for s in listing["sessions"]}[doomed["session_id"]]
            if state["state"] == "failed":
                break
            await trio.sleep(0.05)
    assert "SIGKILL" in state["error"]
    result = await call(daemon, "run_crash_command", command="bt", session_id=doomed["session_id"])
    assert not result["_is_error"], result
    assert "sysrq_handle_crash" in result["output"]  # back at the panic task
    restarted = result["session_restarted"]
    assert "SIGKILL" in restarted["reason"] and restarted["revival"] == 1 and "context" in restarted["note"]
    revived = session_details(daemon, doomed["session_id"])
    assert revived is not None and revived["crash_pid"] != details["crash_pid"]
    again = await call(daemon, "run_drgn_command", code="1", session_id=doomed["session_id"])
    assert not again["_is_error"] and again["output"] == "1", again
    assert not (await crash(setup, "sys"))["_is_error"]  # the other session carried on throughout
    closed = await call(daemon, "close_vmcore_session", session_id=doomed["session_id"])
    assert closed["closed"]
    fresh = await call(daemon, "open_vmcore_session", **args)
    assert fresh["is_new"] and fresh["session_id"] != doomed["session_id"]
    # the drgn worker is a worker: killed, it is restarted by the next drgn call and crash carries on
    fresh_details = session_details(daemon, fresh["session_id"])
    assert fresh_details is not None
    os.kill(fresh_details["drgn_pid"], signal.SIGKILL)
    wait_gone([fresh_details["drgn_pid"]], timeout=10)
    result = await call(daemon, "run_drgn_command", code="1", session_id=fresh["session_id"])
    assert not result["_is_error"] and result["output"] == "1", result
    assert alive(fresh_details["crash_pid"])
    closed = await call(daemon, "close_vmcore_session", session_id=fresh["session_id"])
    assert closed["closed"] and closed["state"] == "closed"


async def test_outputs_survive_a_daemon_restart_and_crash_never_outlives_the_daemon(setup: Setup,
                                                                                   tmp_path: Path) -> None:
    stored = await crash(setup, "sys")
    # A second daemon on the same state dir stands for the restarted one.
    env = make_env(tmp_path, f'[daemon]\nallowed_dirs = ["{setup.fixture.dir}"]\n', state=setup.daemon.env.state)
    second = start_daemon(env)
    try:
        page = await call(second, "get_command_output", command_id=stored["command_id"])
        assert PANIC in page["output"]
        found = await call(second, "search_command_output", command_id=stored["command_id"], query="^ +PANIC:")
        assert found["match_count"] == 1
        # (Naming the first daemon's session here would reopen it: tests/e2e/test_crash_reopen.py.)

        async def open_it() -> None:
            try:
                await call(second, "open_vmcore_session", vmcore_path=str(setup.fixture.vmcore),
                           vmlinux_path=str(setup.fixture.vmlinux))
            except Exception:  # the daemon is stopped under this call on purpose
                pass

        pids: list[int] = []
        with trio.move_on_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(open_it)
                while not pids:  # crash is still loading: stop the daemon now
                    await trio.sleep(0.1)
                    for actor in status(second)["actors"]:
                        if actor["kind"] == "crash" and actor["details"].get("crash_pid"):
                            assert actor["details"]["crash"] == "loading"
                            pids = [actor["details"]["crash_pid"], actor["details"]["drgn_pid"]]
                assert all(alive(p) for p in pids)
                second.proc.send_signal(signal.SIGTERM)
                await trio.to_thread.run_sync(lambda: second.proc.wait(30))
                nursery.cancel_scope.cancel()
        assert pids and second.proc.returncode == 0
        wait_gone(pids, timeout=1)
    finally:
        second.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)


async def test_stored_outputs_and_session_files_are_owner_only(setup: Setup) -> None:
    await crash(setup, "sys")
    await drgn(setup, "print('kept')")
    problems = []
    for path in [setup.daemon.env.state, *setup.daemon.env.state.rglob("*")]:
        st = path.lstat()
        want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        if stat.S_IMODE(st.st_mode) != want or stat.S_ISLNK(st.st_mode):
            problems.append(f"{path} {stat.filemode(st.st_mode)}")
    assert problems == []
    assert any(setup.daemon.env.state.rglob("cmd-*.out"))


def cli(env: Env, tool: str, *args: str) -> tuple[int, dict[str, Any]]:
    done = env.run("call", tool, *args, "--visibility=off", timeout=120)
    assert done.stdout, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, result


def test_diagd_call_holds_no_reference_after_it_exits_and_finds_the_only_session(tmp_path: Path) -> None:
    fixture = build()
    env = make_env(tmp_path, f'[daemon]\nallowed_dirs = ["{fixture.dir}"]\n')
    daemon = start_daemon(env)
    try:
        code, opened = cli(env, "open_vmcore_session", f"vmcore_path={fixture.vmcore}",
                           f"vmlinux_path={fixture.vmlinux}")
        assert code == 0 and opened["is_new"] and "only while this command runs" in opened["reference"]
        sid = opened["session_id"]
        code, listing = cli(env, "list_vmcore_sessions")
        (session,) = listing["sessions"]
        # The command that opened it is gone, and so is its reference; the session stays for the next one.
        assert (session["session_id"], session["state"], session["refcount"], session["held_by"]) == (
            sid, "ready", 0, [])
        assert (session["crash"], session["drgn"]) == ("ready", "ready")
        assert listing["default_for_this_client"] == sid  # the only open session
        code, sys_out = cli(env, "run_crash_command", "command=sys")  # no session_id: the only one
        assert code == 0 and sys_out["session_id"] == sid and PANIC in sys_out["output"]
        details = session_details(daemon, sid)
        assert details is not None
        code, closed = cli(env, "close_vmcore_session")  # no session_id either
        assert code == 0 and closed["closed"] and closed["session_id"] == sid
        assert closed["stopped"] == {"crash": "quit", "drgn": "quit"}
        wait_gone([details["crash_pid"], details["drgn_pid"]], timeout=5)
        code, listing = cli(env, "list_vmcore_sessions")
        (session,) = listing["sessions"]
        assert (session["state"], session["crash"], session["drgn"]) == ("closed", "closed", "closed")
        code, none_open = cli(env, "close_vmcore_session")
        assert code == 1 and none_open["code"] == "NOT_FOUND" and "no session is open" in none_open["message"]
    finally:
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)


async def test_a_reload_reaches_open_sessions_and_names_what_waits_for_a_reopen(tmp_path: Path) -> None:
    fixture = build()
    daemon_table = f'[daemon]\nallowed_dirs = ["{fixture.dir}"]\n'
    env = make_env(tmp_path, daemon_table)
    daemon = start_daemon(env)
    try:
        opened = await call(daemon, "open_vmcore_session", vmcore_path=str(fixture.vmcore),
                            vmlinux_path=str(fixture.vmlinux))
        sid = opened["session_id"]
        before = await call(daemon, "run_crash_command", command="log", session_id=sid)
        assert before["lines_returned"] == 20 and "output_truncated" not in before
        env.write_config(daemon_table + "max_line_bytes = 4194304\n"
                         "[crash]\noutput_lines = 3\nmax_output_bytes = 2000\ncommand_timeout_s = 300\ndrgn = false\n")
        done = env.run("reload")
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["changed"] == ["[daemon] max_line_bytes", "[crash] command_timeout_s", "[crash] drgn",
                                     "[crash] max_output_bytes", "[crash] output_lines"]
        notes = {n["setting"]: n for n in answer["not_yet_applied"]}
        assert set(notes) == {"[daemon] max_line_bytes", "[crash] drgn"}  # the limits apply at once
        assert notes["[crash] drgn"]["until_reopened"] == [sid]
        after = await call(daemon, "run_crash_command", command="log", session_id=sid, force_execute=True)
        assert after["lines_returned"] == 3 and after["output_truncated"]
        assert "2000 bytes" in after["truncated_reason"]
        kept = await call(daemon, "run_drgn_command", code="1", session_id=sid)  # drgn=false: new sessions only
        assert not kept["_is_error"] and kept["output"] == "1"
        env.write_config(daemon_table + "[crash]\noutput_lines = 0\n")
        refused = env.run("reload")
        assert refused.returncode == 1 and "output_lines" in refused.stderr
        still = await call(daemon, "run_crash_command", command="sys", session_id=sid)
        assert still["lines_returned"] == 3  # the refused config changed nothing
    finally:
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)


def test_doctor_states_the_crash_version_limit(setup: Setup) -> None:
    done = subprocess.run([DIAGD, "doctor", "--json"], env=setup.daemon.env.vars, capture_output=True, text=True,
                          timeout=60, check=False)
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    version = checks["crash version"]
    # What crash itself says, read here: below 8.0.4 (no pid.numbers[] support) doctor must say so.
    line = subprocess.run(["crash", "--version"], capture_output=True, text=True, timeout=60,
                          check=False).stdout.strip().splitlines()[0]
    found = re.search(r"(\d+)\.(\d+)\.(\d+)", line)
    assert found is not None, line
    too_old = tuple(int(x) for x in found.groups()) < (8, 0, 4)
    assert version["ok"] is not too_old and version["detail"].startswith(line), (line, version)
    assert ("PID hash" in version["detail"] and "8.0.4" in version["detail"]) is too_old, version
