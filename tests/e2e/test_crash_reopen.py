"""An open crash session comes back by id after a daemon restart: the real SDK client over `diagd mcp`
(the reconnecting shim), a real daemon stopped or killed and started again on the same directories, and
the real vmcore fixture."""

from __future__ import annotations

import functools
import os
import shutil
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.conftest import DIAGD, DaemonProcess, start_daemon
from tests.e2e.test_crash import call, call_on, make_env, session_details, status, wait_gone
from tests.fixtures.vmcore import build

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("crash") is None, reason="crash is not installed (scripts/setup.sh installs it)"),
]

Progress = list[tuple[float, float | None, str | None]]


@asynccontextmanager
async def shim_client(daemon: DaemonProcess) -> AsyncIterator[Client]:
    """One MCP session through `diagd mcp`, kept across the restarts of the daemon under it."""
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=daemon.env.vars)
    async with Client(params, mode="legacy") as client:
        yield client


def restart(daemon: DaemonProcess, how: str = "stop") -> DaemonProcess:
    if how == "kill":
        daemon.proc.send_signal(signal.SIGKILL)
    daemon.stop(timeout=60)
    return start_daemon(daemon.env)


def crash_actors(daemon: DaemonProcess) -> list[dict[str, Any]]:
    return [a["details"] for a in status(daemon)["actors"] if a["kind"] == "crash"]


def recorder() -> tuple[Progress, Any]:
    seen: Progress = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        seen.append((p, total, message))

    return seen, on_progress


async def test_a_session_open_before_a_restart_answers_by_id_reopened_with_progress_and_a_closed_one_stays_closed(
        tmp_path: Path) -> None:
    fixture = build()
    env = make_env(tmp_path, f'[daemon]\nallowed_dirs = ["{fixture.dir}"]\n')
    daemons = [start_daemon(env)]
    try:
        async with shim_client(daemons[0]) as client:
            opened = await call_on(client, "open_vmcore_session", vmcore_path=str(fixture.vmcore),
                                   vmlinux_path=str(fixture.vmlinux))
            sid = opened["session_id"]
            sys_out = await call_on(client, "run_crash_command", command="sys", session_id=sid)
            assert not sys_out["_is_error"] and "session_reopened" not in sys_out
            old_pids = session_details(daemons[0], sid)
            assert old_pids is not None

            daemons.append(await trio.to_thread.run_sync(restart, daemons[0]))
            wait_gone([old_pids["crash_pid"], old_pids["drgn_pid"]])
            seen, on_progress = recorder()
            bt = await call_on(client, "run_crash_command", on_progress, command="bt", session_id=sid)
            assert not bt["_is_error"], bt
            assert bt["session_id"] == sid and "sysrq_handle_crash" in bt["output"]
            reopened = bt["session_reopened"]
            assert reopened["reason"] == "daemon restarted" and reopened["previous_state"] == "stopped"
            assert "set" in reopened["note"]  # the agent learns that its context was reset
            messages = [m for _p, _t, m in seen]
            assert any("reopening" in (m or "") for m in messages) and messages[-1] == "crash ready", messages
            assert not bt["command_id"].endswith(":1")  # numbering goes on after the old session's outputs
            page = await call_on(client, "get_command_output", command_id=sys_out["command_id"])
            assert page["output"] == sys_out["output"] or page["output"].startswith(sys_out["output"])
            again = await call_on(client, "run_drgn_command", code="1 + 1", session_id=sid)
            assert not again["_is_error"] and again["output"] == "2" and "session_reopened" not in again

            # Killed this time, and two calls race for the session: one reopen serves both.
            daemons.append(await trio.to_thread.run_sync(restart, daemons[1], "kill"))
            answers: dict[str, dict[str, Any]] = {}

            async def one(tool: str, **args: Any) -> None:
                answers[tool] = await call_on(client, tool, session_id=sid, **args)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(one, "run_crash_command", command="log"))
                nursery.start_soon(functools.partial(one, "run_drgn_command", code="prog['init_task'].pid"))
            assert not answers["run_crash_command"]["_is_error"], answers
            assert not answers["run_drgn_command"]["_is_error"] and answers["run_drgn_command"]["output"] == "(pid_t)0"
            told = [a["session_reopened"] for a in answers.values() if "session_reopened" in a]
            assert len(told) == 1 and told[0]["previous_state"] == "ready"  # once per client
            assert [a["session_id"] for a in crash_actors(daemons[2])] == [sid]

            closed = await call_on(client, "close_vmcore_session", session_id=sid)
            assert closed["closed"]
            daemons.append(await trio.to_thread.run_sync(restart, daemons[2]))
            gone = await call_on(client, "run_crash_command", command="sys", session_id=sid)
            assert gone["_is_error"] and gone["code"] == "NOT_FOUND" and "closed" in gone["message"], gone
            assert gone["details"]["reopen"] == {"vmcore_path": str(fixture.vmcore),
                                                 "vmlinux_path": str(fixture.vmlinux)}
            assert crash_actors(daemons[3]) == []
    finally:
        for d in daemons:
            d.stop(timeout=60)
        shutil.rmtree(env.runtime, ignore_errors=True)


async def test_a_dump_no_longer_allowed_or_rewritten_since_is_not_reopened_and_says_why(tmp_path: Path) -> None:
    fixture = build()
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    vmcore = dumps / "vmcore"
    shutil.copy2(fixture.vmcore, vmcore)
    allowed = f'[daemon]\nallowed_dirs = ["{fixture.dir}", "{dumps}"]\n'
    env = make_env(tmp_path / "env", allowed)
    daemon = start_daemon(env)
    try:
        opened = await call(daemon, "open_vmcore_session", vmcore_path=str(vmcore), vmlinux_path=str(fixture.vmlinux),
                            crash_args=["--dec"])
        assert not opened["_is_error"], opened
        sid = opened["session_id"]
        reopen = {"vmcore_path": str(vmcore), "vmlinux_path": str(fixture.vmlinux), "crash_args": ["--dec"]}
        record = env.state / "crash" / sid / "session.json"
        assert oct(record.stat().st_mode & 0o777) == "0o600"

        env.write_config(f'[daemon]\nallowed_dirs = ["{fixture.dir}"]\n')  # the dump's dir is no longer allowed
        daemon = await trio.to_thread.run_sync(restart, daemon)
        refused = await call(daemon, "run_crash_command", command="sys", session_id=sid)
        assert refused["_is_error"] and refused["code"] == "PERMISSION_DENIED", refused
        assert refused["details"]["session_id"] == sid and refused["details"]["reopen"] == reopen
        assert crash_actors(daemon) == []

        env.write_config(allowed)
        stat = vmcore.stat()
        os.utime(vmcore, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # rewritten, as far as anyone can tell
        daemon = await trio.to_thread.run_sync(restart, daemon)
        changed = await call(daemon, "run_drgn_command", code="1", session_id=sid)
        assert changed["_is_error"] and changed["code"] == "DAEMON_RESTARTED", changed
        assert changed["details"]["reason"] == "files_changed" and "vmcore was rewritten" in changed["message"]
        assert changed["details"]["reopen"] == reopen
        assert crash_actors(daemon) == []
        # Closed now, without being reopened: it never comes back, and the same files open afresh.
        closed = await call(daemon, "close_vmcore_session", session_id=sid)
        assert not closed["_is_error"] and closed["closed"] and closed["state"] == "closed", closed
        gone = await call(daemon, "run_crash_command", command="sys", session_id=sid)
        assert gone["_is_error"] and gone["code"] == "NOT_FOUND" and gone["details"]["reopen"] == reopen, gone
        fresh = await call(daemon, "open_vmcore_session", **reopen)
        assert not fresh["_is_error"] and fresh["is_new"] and fresh["session_id"] != sid
    finally:
        daemon.stop(timeout=60)
        shutil.rmtree(env.runtime, ignore_errors=True)
