"""Big outputs and dead children through the real path (SDK client -> shim -> daemon -> crash, drgn worker,
sharkd), on the real vmcore fixture and the shared captures.

- Outputs past [crash] max_output_bytes (1 MB here, so the tests stay fast) come back cut and flagged,
  with no traceback, and the session answers the next call; the stored file pages and searches to its end.
- A child that dies is reaped at once (no zombie of the daemon, checked without making another call)
  and its pipes are closed then; a dead worker (sharkd, the drgn worker) is restarted by the next call,
  and a call in flight when it dies gets BACKEND_UNAVAILABLE naming the signal.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from diagd.actors.sandbox import namespaces
from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_crash import call, make_env, session_details, status
from tests.fixtures.vmcore import VmcoreFixture, build
from tests.pcaps import PCAPS, pcap
from tests.support import procs

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("crash") is None, reason="crash is not installed (scripts/setup.sh installs it)"),
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]

CAP = 1_000_000


@dataclass
class Setup:
    daemon: DaemonProcess
    fixture: VmcoreFixture
    session_id: str
    workdir: Path
    pipes_idle: int  # the daemon's pipe fds with no child running


def children(pid: int) -> dict[int, str]:
    """The daemon's children (of all its threads) and their states; a zombie is 'Z'."""
    return {p.pid: p.state for p in procs.children(pid)}


def pipe_fds(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd).startswith("pipe:")
        except OSError:
            pass
    return count


def pipe_workers(pid: int) -> int:
    """Live children that talk over pipes (sharkd, drgn workers; crash has a pty): their stdin is a pipe
    (crash's sandbox supervisor, a Python process, has the pty)."""
    count = 0
    for kid, state in children(pid).items():
        try:
            count += state != "Z" and os.readlink(f"/proc/{kid}/fd/0").startswith("pipe:")
        except OSError:
            pass
    return count


def in_scratch(supervisor: int, name: str) -> bool:
    """Whether the sandboxed worker under `supervisor` has `name` in its scratch (its /tmp)."""
    tool = namespaces.tool_pid(supervisor)
    return tool is not None and os.path.exists(f"/proc/{tool}/root/tmp/{name}")


async def settled(setup: Setup, gone: list[int]) -> None:
    """Without another call: the `gone` children are reaped (no zombie stays) and the daemon holds
    exactly the pipes of its live pipe workers (3 each: stdin, stdout, stderr), none of the dead."""
    pid = setup.daemon.proc.pid
    with trio.fail_after(10):
        while True:
            kids = children(pid)
            if not any(k in kids for k in gone) and "Z" not in kids.values() \
                    and pipe_fds(pid) == setup.pipes_idle + 3 * pipe_workers(pid):
                return
            await trio.sleep(0.05)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    fixture = build()
    root = tmp_path_factory.mktemp("outputs")
    # These tests are about outputs and children, not confinement: with Landlock forced off
    # (DIAGD_LANDLOCK=off) they still run drgn code, unconfined.
    unconfined = "allow_unconfined = true\n" if os.environ.get("DIAGD_LANDLOCK") in ("off", "0") else ""
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{fixture.dir}", "{PCAPS}"]\n'
                         f'[crash]\nmax_output_bytes = {CAP}\nidle_timeout_s = 900\n{unconfined}'
                         # one sharkd per capture: the tests kill the worker a call runs on
                         "[pcap]\nworkers_per_capture = 1\n")
    daemon = start_daemon(env)
    try:
        trio.run(call, daemon, "list_vmcore_sessions")
        pipes_idle = pipe_fds(daemon.proc.pid)
        opened = trio.run(lambda: call(daemon, "open_vmcore_session", vmcore_path=str(fixture.vmcore),
                                       vmlinux_path=str(fixture.vmlinux)))
        assert not opened["_is_error"], opened
        yield Setup(daemon, fixture, opened["session_id"], Path(opened["workdir"]), pipes_idle)
    finally:
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)


def stored_file(setup: Setup, command_id: str) -> Path:
    return setup.workdir / f"cmd-{int(command_id.rsplit(':', 1)[1]):06d}.out"


def no_traceback(payload: dict[str, Any]) -> None:
    assert "Traceback" not in json.dumps(payload)


async def test_a_drgn_output_above_the_cap_comes_back_cut_and_flagged_and_the_session_answers_next(
        setup: Setup) -> None:
    code = "for i in range(30000):\n    print(f'row {i:06d} ' + 'x' * 88)"  # 100-byte lines, 3 MB in all
    cut = await call(setup.daemon, "run_drgn_command", code=code, session_id=setup.session_id)
    assert not cut["_is_error"], cut
    no_traceback(cut)
    assert cut["output_truncated"] and f"{CAP} bytes" in cut["truncated_reason"]
    assert cut["output"].startswith("row 000000 xxx") and cut["total_lines"] == CAP // 100
    assert stored_file(setup, cut["command_id"]).stat().st_size == CAP
    last = await call(setup.daemon, "get_command_output", command_id=cut["command_id"], offset=CAP // 100 - 2,
                      limit=10)
    assert last["output"].splitlines()[-1].startswith("row 009999 ") and not last["has_more"]
    found = await call(setup.daemon, "search_command_output", command_id=cut["command_id"], query=r"^row 0099(98|99)")
    assert [m["line_number"] for m in found["matches"]] == [9998, 9999]
    nxt = await call(setup.daemon, "run_drgn_command", code="prog['init_task'].pid", session_id=setup.session_id)
    assert nxt["output"] == "(pid_t)0"


async def test_a_crash_output_above_the_cap_comes_back_cut_and_flagged_and_the_session_answers_next(
        setup: Setup) -> None:
    cut = await call(setup.daemon, "run_crash_command", command="rd -64 _stext 100000", session_id=setup.session_id)
    assert not cut["_is_error"], cut
    no_traceback(cut)
    assert cut["output_truncated"] and f"output passed {CAP} bytes" in cut["truncated_reason"]
    assert stored_file(setup, cut["command_id"]).stat().st_size == CAP
    last = await call(setup.daemon, "get_command_output", command_id=cut["command_id"],
                      offset=cut["total_lines"] - 1, limit=10)
    assert last["output"].startswith("ffffffff") and not last["has_more"]
    nxt = await call(setup.daemon, "run_crash_command", command="sys", session_id=setup.session_id,
                     force_execute=True)
    assert "sysrq triggered crash" in nxt["output"]


async def test_a_killed_sharkd_is_reaped_at_once_and_the_next_call_restarts_it_idle_or_mid_call(
        setup: Setup) -> None:
    daemon, path = setup.daemon, pcap("adrian_sandbox_n4.pcap")
    await call(daemon, "pcap_frames_by_filter", pcap_path=path, display_filter="pfcp", limit=1)

    def sharkd() -> dict[str, Any]:
        details: dict[str, Any] = next(a["details"] for a in status(daemon)["actors"]
                                       if a["details"].get("path") == path)
        return details

    with trio.fail_after(30):
        while not sharkd()["sharkd_pid"] or sharkd()["loads"] < 1:  # the first answer came from tshark
            await trio.sleep(0.05)
    first = sharkd()["sharkd_pid"]
    os.kill(first, signal.SIGKILL)
    await settled(setup, [first])
    idle = await call(daemon, "pcap_frames_by_filter", pcap_path=path, display_filter="pfcp.msg_type==50")
    assert idle.get("total") == 3, idle  # no BACKEND_UNAVAILABLE first: the call restarts the worker

    second = sharkd()["sharkd_pid"]
    assert second != first
    os.kill(second, signal.SIGSTOP)  # it cannot answer: the next request is surely in flight
    before = sharkd()["sharkd_requests"]
    answer: dict[str, Any] = {}

    async def ask() -> None:
        answer.update(await call(daemon, "pcap_frames_by_filter", pcap_path=path, display_filter="pfcp.msg_type==51"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        with trio.fail_after(30):
            while sharkd()["sharkd_requests"] == before:
                await trio.sleep(0.02)
        os.kill(second, signal.SIGKILL)
    if answer["_is_error"]:  # the request in flight says how its worker ended
        assert answer["code"] == "BACKEND_UNAVAILABLE", answer
        assert "sharkd died" in answer["message"] and "killed by SIGKILL" in answer["message"]
    else:  # or the pass it fell back to ran on a fresh worker (the early page's rows were in flight)
        assert answer["total"] == 3 and sharkd()["sharkd_pid"] not in (first, second), answer
    await settled(setup, [second])
    again = await call(daemon, "pcap_frames_by_filter", pcap_path=path, display_filter="pfcp.msg_type==51")
    assert again.get("total") == 3, again


async def test_a_killed_drgn_worker_is_restarted_by_the_next_call_and_crash_carries_on(setup: Setup) -> None:
    daemon, sid = setup.daemon, setup.session_id
    await call(daemon, "run_drgn_command", code="kept = 41", session_id=sid)
    details = session_details(daemon, sid)
    assert details is not None
    first = details["drgn_pid"]
    os.kill(first, signal.SIGKILL)
    await settled(setup, [first])
    restarted = await call(daemon, "run_drgn_command", code="prog['init_task'].comm", session_id=sid)
    assert not restarted["_is_error"] and "swapper/0" in restarted["output"], restarted
    lost = await call(daemon, "run_drgn_command", code="kept", session_id=sid)
    assert lost["_is_error"] and "NameError" in lost["message"]  # a fresh worker: its variables are gone

    second = (session_details(daemon, sid) or {})["drgn_pid"]
    assert second != first
    answer: dict[str, Any] = {}

    async def ask() -> None:
        answer.update(await call(daemon, "run_drgn_command", session_id=sid,
                                 code="import time\nopen('in-flight', 'w').close()\ntime.sleep(60)"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        with trio.fail_after(30):
            # The marker is in the worker's scratch, seen from the host through the worker's own root.
            while not in_scratch(second, "in-flight"):
                await trio.sleep(0.02)
        os.kill(second, signal.SIGKILL)
    assert answer["_is_error"] and answer["code"] == "BACKEND_UNAVAILABLE", answer
    assert "drgn worker died during the call" in answer["message"] and "killed by SIGKILL" in answer["message"]
    no_traceback(answer)
    assert "sysrq triggered crash" in (await call(daemon, "run_crash_command", command="sys", session_id=sid,
                                                  force_execute=True))["output"]
    again = await call(daemon, "run_drgn_command", code="prog['init_task'].pid", session_id=sid)
    assert again["output"] == "(pid_t)0"
    assert (session_details(daemon, sid) or {})["drgn_restarts"] == 2


async def test_a_killed_crash_leaves_no_zombie_and_no_fd_and_the_next_call_starts_it_again(setup: Setup) -> None:
    daemon = setup.daemon
    opened = await call(daemon, "open_vmcore_session", vmcore_path=str(setup.fixture.vmcore),
                        vmlinux_path=str(setup.fixture.vmlinux), crash_args=["--hex"])
    details = session_details(daemon, opened["session_id"])
    assert details is not None
    ptys_before = pty_fds(daemon.proc.pid)
    os.kill(details["crash_pid"], signal.SIGKILL)
    # The session fails on its own (its drgn worker is stopped with it): no call needed for the reaping.
    await settled(setup, [details["crash_pid"], details["drgn_pid"]])
    assert pty_fds(daemon.proc.pid) == ptys_before - 1
    again = await call(daemon, "run_crash_command", command="sys", session_id=opened["session_id"])
    assert not again["_is_error"] and "SIGKILL" in again["session_restarted"]["reason"], again
    assert pty_fds(daemon.proc.pid) == ptys_before  # the new crash's pty, and nothing more


def pty_fds(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd) == "/dev/ptmx"
        except OSError:
            pass
    return count


def test_nothing_of_the_daemon_outlives_it(setup: Setup) -> None:
    kids = list(children(setup.daemon.proc.pid))
    assert kids  # crash, the drgn worker and sharkd are still running
    setup.daemon.stop()
    deadline = time.monotonic() + 15
    while any(Path(f"/proc/{k}").exists() and Path(f"/proc/{k}/stat").read_text().split(")")[-1].split()[0] != "Z"
              for k in kids):
        assert time.monotonic() < deadline
        time.sleep(0.05)
