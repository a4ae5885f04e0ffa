"""kill -9 of each kind of child the daemon runs, in the middle of a call: sharkd during a filter pass,
bpftrace during a run, the drgn worker during a long exec, crash during a command.

For each: the call in flight ends with a coded error (not a hang, not INTERNAL_ERROR), the next call
works (the worker is restarted transparently), and afterwards the daemon has no zombie children
and no more file descriptors than before the kill. A stopped child (SIGSTOP before the call) makes
"in the middle of a call" certain rather than a race: the call waits on it, then it is killed.

One daemon of its own serves this file, so its descriptors and children are only these tests'.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DIAGD, REPO, DaemonProcess, Env, start_daemon, wait_for_path
from tests.fault.conftest import BIG_PCAP, fault_env, needs_crash, needs_sharkd, open_session
from tests.fault.helpers import ControlClient, assert_coded_error, wait_for
from tests.fixtures.vmcore import VmcoreFixture, build
from tests.pcaps import PCAPS, pcap
from tests.support.bpftrace_harness import ensure_tracefs, needs_bpftrace
from tests.support.procs import alive, children, fd_count, fd_targets, zombies

pytestmark = [pytest.mark.e2e, pytest.mark.fault]


@dataclass
class KillDaemon:
    daemon: DaemonProcess
    root: Path

    @property
    def pid(self) -> int:
        return self.daemon.proc.pid

    def control(self, client: str = "kill", timeout: float = 120) -> ControlClient:
        return ControlClient(self.daemon.control_socket, client=client, timeout=timeout)

    def actor(self, kind: str, match: Callable[[dict[str, Any]], bool] = lambda d: True) -> dict[str, Any] | None:
        with self.control(client="watch", timeout=15) as c:
            actors = c.status()["actors"]
        found = [a for a in actors if a["kind"] == kind and match(a["details"])]
        return found[0] if found else None


@pytest.fixture(scope="module")
def kd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KillDaemon]:
    root = tmp_path_factory.mktemp("kills")
    allowed = [str(PCAPS), str(root)]
    if shutil.which("crash"):
        allowed.append(str(build().dir))
    # One sharkd per capture: these tests kill the worker a call runs on (a second worker, which a
    # busy capture gets by default, would answer instead: tests/e2e/test_pcap_workers.py). No warm
    # tshark: these tests count the daemon's children and fds before and after a kill, and standbys
    # start on their own schedule (1 s after each use); their own reaping and replacement after a kill
    # is tested in tests/actors/pcap/test_standby.py. No standby launcher for bpftrace either, for the
    # same reason (its kill: test_a_standby_launcher_killed_while_it_waits_is_reaped_and_replaced).
    env = fault_env(root, f"[daemon]\nallowed_dirs = {json.dumps(allowed)}\n[pcap]\nworkers_per_capture = 1\n"
                          "warm_tshark = false\n[bpftrace]\nwarm_launcher = false\n", "kill")
    daemon = start_daemon(env)
    try:
        yield KillDaemon(daemon, root)
    finally:
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)


class InFlight:
    """One call running on its own connection in a thread; `answer()` waits for it (bounded)."""

    def __init__(self, kd: KillDaemon, tool: str, args: dict[str, Any]) -> None:
        self.tool = tool
        self.result: list[tuple[bool, dict[str, Any]] | BaseException] = []

        def run() -> None:
            try:
                with kd.control(client="victim", timeout=120) as c:
                    self.result.append(c.call(tool, args))
            except BaseException as exc:  # reported by the test, not lost in the thread
                self.result.append(exc)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def answer(self) -> tuple[bool, dict[str, Any]]:
        self.thread.join(timeout=130)
        assert not self.thread.is_alive(), f"{self.tool} hung after its child was killed"
        answer = self.result[0]
        assert not isinstance(answer, BaseException), f"{self.tool} got no answer: {answer!r}"
        return answer


def wait_busy(kd: KillDaemon, kind: str, match: Callable[[dict[str, Any]], bool] = lambda d: True) -> None:
    def busy() -> bool:
        actor = kd.actor(kind, match)
        return actor is not None and actor["state"] == "busy"

    wait_for(busy, 30, f"no busy {kind} actor appeared")


def wait_running(kd: KillDaemon, tool: str) -> None:
    """Until the daemon lists a call of `tool` as running (diagd_calls)."""
    def running() -> bool:
        with kd.control() as c:
            listed = c.ok("diagd_calls", {"tool": tool})
        return any(call["outcome"] == "running" for call in listed["calls"])

    wait_for(running, 30, f"no {tool} call running")


def assert_coded_failure_or_result(answer: tuple[bool, dict[str, Any]], what: str) -> None:
    """The call in flight may fail (with a code), or a transparent retry may answer it: both are fine;
    a hang, INTERNAL_ERROR or a traceback are not."""
    is_error, payload = answer
    if is_error:
        assert_coded_error(payload, context=what)


def assert_clean_after(kd: KillDaemon, baseline_fds: int, before: list[str], kids_before: int) -> None:
    wait_for(lambda: not zombies(kd.pid), 10, lambda: f"zombie children of the daemon: {zombies(kd.pid)}")
    wait_for(lambda: len(children(kd.pid)) <= kids_before, 10,
             lambda: f"the daemon has {children(kd.pid)}, {kids_before} children before the kill")
    wait_for(lambda: fd_count(kd.pid) <= baseline_fds, 10,
             lambda: f"the daemon holds {fd_count(kd.pid)} fds, {baseline_fds} before the kill; new: "
                     f"{sorted(set(fd_targets(kd.pid)) - set(before))}")


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), 10, f"pid {pid} survived SIGKILL")


# ---------------------------------------------------------------------------------------------


@needs_sharkd
def test_sharkd_killed_during_a_filter_pass(kd: KillDaemon) -> None:
    path = pcap(BIG_PCAP)
    with kd.control() as c:
        c.ok("pcap_frames_by_filter", {"pcap_path": path, "display_filter": "diameter", "limit": 1})

    def loaded() -> bool:  # a fresh capture's first page may come from tshark while sharkd still loads
        actor = kd.actor("pcap", lambda d: d.get("path") == path)
        return actor is not None and [w["state"] for w in actor["details"]["workers"]] == ["idle"]

    wait_for(loaded, 60, "the capture's sharkd did not finish loading")
    actor = kd.actor("pcap", lambda d: d.get("path") == path)
    assert actor is not None and actor["details"]["sharkd_pid"]
    sharkd = actor["details"]["sharkd_pid"]
    baseline, before, kids = fd_count(kd.pid), fd_targets(kd.pid), len(children(kd.pid))

    os.kill(sharkd, signal.SIGSTOP)
    call = InFlight(kd, "pcap_frames_by_filter", {"pcap_path": path, "limit": 5,
                                                  "display_filter": "diameter.cmd.code == 272 && frame.len > 100"})
    wait_busy(kd, "pcap", lambda d: d.get("path") == path)
    kill(sharkd)
    assert_coded_failure_or_result(call.answer(), "the filter pass whose sharkd was killed")

    with kd.control() as c:
        again = c.call("pcap_frames_by_filter", {"pcap_path": path, "display_filter": "diameter", "limit": 3})
    assert not again[0], f"the next call did not get a fresh sharkd: {again[1]}"
    assert len(again[1]["frames"]) == 3
    assert_clean_after(kd, baseline, before, kids)


@needs_bpftrace
def test_bpftrace_killed_during_a_run(kd: KillDaemon) -> None:
    ensure_tracefs()
    baseline, before, kids = fd_count(kd.pid), fd_targets(kd.pid), len(children(kd.pid))
    with kd.control() as c:
        run = c.ok("exec_program", {"program": 'interval:ms:50 { printf("tick\\n"); }', "timeout": 30})
        first = c.ok("get_result", {"execution_id": run["execution_id"], "wait_s": 10})
        assert first["lines_returned"] >= 1, first
    call = InFlight(kd, "get_result", {"execution_id": run["execution_id"], "wait_s": 60, "until": "done"})
    wait_running(kd, "get_result")  # the wait has begun: the kill lands under it, not before it
    kill(run["pid"])
    is_error, payload = call.answer()
    if is_error:
        assert_coded_error(payload, context="the run whose bpftrace was killed")
    else:
        assert payload["status"] == "failed" and payload.get("signal") == "SIGKILL", payload

    with kd.control() as c:
        again = c.ok("exec_program", {"program": 'BEGIN { printf("ok\\n"); exit(); }'})
        done = c.ok("get_result", {"execution_id": again["execution_id"], "wait_s": 30, "until": "done"})
    assert done["status"] == "completed" and done["output"][0] == "ok", done
    assert_clean_after(kd, baseline, before, kids)


@pytest.fixture(scope="module")
def fixture() -> VmcoreFixture:
    return build()


def live_session(kd: KillDaemon, fixture: VmcoreFixture) -> tuple[str, dict[str, Any]]:
    """The session of this file (opened, or joined when it is live), and its actor's details."""
    session_id = open_session(kd.daemon, fixture, client="kill")["session_id"]
    actor = kd.actor("crash", lambda d: d.get("session_id") == session_id)
    assert actor is not None and actor["details"]["crash"] == "ready" and actor["details"]["drgn"] == "ready", actor
    return session_id, actor["details"]


@needs_crash
def test_the_drgn_worker_killed_during_a_long_exec(kd: KillDaemon, fixture: VmcoreFixture) -> None:
    session_id, details = live_session(kd, fixture)
    baseline, before, kids = fd_count(kd.pid), fd_targets(kd.pid), len(children(kd.pid))

    call = InFlight(kd, "run_drgn_command", {"code": "import time\ntime.sleep(90)", "session_id": session_id})
    wait_busy(kd, "crash", lambda d: d.get("session_id") == session_id)
    kill(details["drgn_pid"])
    assert_coded_failure_or_result(call.answer(), "the drgn exec whose worker was killed")

    with kd.control() as c:
        again = c.call("run_drgn_command", {"code": "prog['init_task'].comm", "session_id": session_id})
    assert not again[0], f"the next drgn call did not get a fresh worker: {again[1]}"
    assert again[1]["output"] == '(char [16])"swapper/0"'
    assert_clean_after(kd, baseline, before, kids)


@needs_crash
def test_crash_killed_during_a_command(kd: KillDaemon, fixture: VmcoreFixture) -> None:
    session_id, details = live_session(kd, fixture)
    baseline, before, kids = fd_count(kd.pid), fd_targets(kd.pid), len(children(kd.pid))

    os.kill(details["crash_pid"], signal.SIGSTOP)
    call = InFlight(kd, "run_crash_command", {"command": "foreach bt", "session_id": session_id,
                                              "force_execute": True})
    wait_busy(kd, "crash", lambda d: d.get("session_id") == session_id)
    kill(details["crash_pid"])
    assert_coded_failure_or_result(call.answer(), "the crash command whose crash was killed")

    with kd.control() as c:
        again = c.call("run_crash_command", {"command": "sys", "session_id": session_id, "force_execute": True})
    assert not again[0], f"the next crash call did not get a fresh crash: {again[1]}"
    assert "PANIC" in again[1]["output"]
    assert_clean_after(kd, baseline, before, kids)


def test_no_child_of_the_daemon_is_left_a_zombie_after_the_kills(kd: KillDaemon) -> None:
    wait_for(lambda: not zombies(kd.pid), 10, lambda: f"zombie children of the daemon: {zombies(kd.pid)}")


@needs_sharkd
def test_a_warm_tshark_killed_while_it_waits_is_reaped_and_replaced(tmp_path: Path) -> None:
    env = fault_env(tmp_path / "warm", f"[daemon]\nallowed_dirs = {json.dumps([str(PCAPS)])}\n", "warm")
    daemon = start_daemon(env)
    kd = KillDaemon(daemon, tmp_path)
    try:
        with kd.control() as c:  # a capture opened: its first page's warm tshark is started
            c.ok("pcap_frames_by_filter", {"pcap_path": pcap("adrian_registration_reject.pcap"),
                                           "display_filter": "ngap", "limit": 1})

        def waiting(not_pid: int = 0) -> int | None:  # the first page's warm tshark (a text search's waits too)
            actor = kd.actor("tshark-standby", lambda d: bool(d["waiting"] and d["workers"] and "tabs" in d["argv"]))
            pid = actor["details"]["workers"][0]["pid"] if actor else None
            return pid if pid and pid != not_pid else None

        def all_waiting() -> bool:  # every warm tshark the capture started (its children are the baseline)
            with kd.control(client="watch", timeout=15) as c:
                standbys = [a for a in c.status()["actors"] if a["kind"] == "tshark-standby"]
            return bool(standbys) and all(a["details"]["waiting"] and a["details"]["workers"] for a in standbys)

        wait_for(lambda: waiting() is not None and all_waiting() and not zombies(kd.pid), 30, "no warm tshark waited")
        victim = waiting()
        assert victim is not None
        baseline, before, kids = fd_count(kd.pid), fd_targets(kd.pid), len(children(kd.pid))
        kill(victim)
        wait_for(lambda: waiting(victim) is not None, 30, "the killed warm tshark was not replaced")
        assert not alive(victim)
        assert_clean_after(kd, baseline, before, kids)  # its replacement holds what it held, no more
        with kd.control() as c:  # and pages still come
            again = c.ok("pcap_frames_by_filter", {"pcap_path": pcap("adrian_auth_failure.pcap"),
                                                   "display_filter": "ngap", "limit": 2})
        assert len(again["frames"]) == 2
    finally:
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)


def start_under_session_reaper(env: Env) -> subprocess.Popen[bytes]:
    """`diagd serve` as CI starts it: below a subreaper in the test runner's own session
    (tests/support/session_reaper.py); the daemon's pid comes from its status."""
    logfile = open(env.root / "daemon.log", "wb")  # noqa: SIM115 - closed with the process
    reaper = subprocess.Popen([sys.executable, "-m", "tests.support.session_reaper", DIAGD, "serve"],
                              env=env.vars, cwd=REPO, stdout=logfile, stderr=subprocess.STDOUT)
    wait_for_path(env.runtime / "control.sock", reaper)
    return reaper


@needs_sharkd
@pytest.mark.parametrize("starter", ["test runner", "subreaper in the runner's session"])
def test_a_stopped_sharkd_does_not_outlive_a_killed_daemon(tmp_path: Path, starter: str) -> None:
    """A background pass's sharkd is stopped while calls run (passes.py: YIELD_MAX_S); killed then, the
    daemon cannot resume it, and a stopped sharkd reads no end of its stdin. The kernel ends it: its
    group is orphaned with a stopped member (_subprocess.open_process(stoppable=True)). Orphaned only if
    whoever adopts it is outside the daemon's session, so the daemon leads one of its own
    (launch.lead_a_session); started below a subreaper of the starter's session, as CI's harness is,
    it failed here before that."""
    env = fault_env(tmp_path / "stopped", f"[daemon]\nallowed_dirs = {json.dumps([str(PCAPS)])}\n"
                                          "[pcap]\nwarm_tshark = false\n", "stop")
    runner: subprocess.Popen[bytes] = (start_daemon(env).proc if starter == "test runner"
                                       else start_under_session_reaper(env))
    control = env.runtime / "control.sock"
    try:
        path = pcap("adrian_registration_reject.pcap")
        with ControlClient(control, client="stop") as c:
            c.ok("pcap_frames_by_filter", {"pcap_path": path, "display_filter": "", "limit": 1})

        def status() -> dict[str, Any]:
            with ControlClient(control, client="watch", timeout=15) as c:
                return c.status()

        def sharkd() -> int | None:
            found = [a for a in status()["actors"] if a["kind"] == "pcap" and a["details"].get("path") == path]
            return found[0]["details"]["sharkd_pid"] if found else None

        wait_for(lambda: sharkd() is not None, 60, "no sharkd loaded the capture")
        pid, daemon_pid = sharkd(), status()["daemon"]["pid"]
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        os.kill(daemon_pid, signal.SIGKILL)
        wait_for(lambda: not alive(daemon_pid), 10, "the daemon outlived SIGKILL")
        wait_for(lambda: not alive(pid), 10, f"the stopped sharkd {pid} outlived the killed daemon")
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.wait(timeout=20)
        shutil.rmtree(env.runtime, ignore_errors=True)


@needs_bpftrace
def test_a_standby_launcher_killed_while_it_waits_is_reaped_and_replaced(tmp_path: Path) -> None:
    ensure_tracefs()
    env = fault_env(tmp_path / "warm", "", "bwarm")
    daemon = start_daemon(env)
    kd = KillDaemon(daemon, tmp_path)
    try:
        with kd.control() as c:  # the first confined run starts the standby launcher
            first = c.ok("exec_program", {"program": 'BEGIN { printf("cold\\n"); exit(); }'})
            c.ok("get_result", {"execution_id": first["execution_id"], "wait_s": 30, "until": "done"})

        def waiting(not_pid: int = 0) -> int | None:
            actor = kd.actor("sandbox-standby", lambda d: bool(d["waiting"] and d["workers"]))
            pid = actor["details"]["workers"][0]["pid"] if actor else None
            return pid if pid and pid != not_pid else None

        wait_for(lambda: waiting() is not None and not zombies(kd.pid), 30, "no standby launcher waited")
        victim = waiting()
        assert victim is not None
        baseline, before, kids = fd_count(kd.pid), fd_targets(kd.pid), len(children(kd.pid))
        kill(victim)
        wait_for(lambda: waiting(victim) is not None, 30, "the killed standby launcher was not replaced")
        assert not alive(victim)
        assert_clean_after(kd, baseline, before, kids)  # its replacement holds what it held, no more
        replacement = waiting()
        with kd.control() as c:  # and runs still come, on the replacement
            again = c.ok("exec_program", {"program": 'BEGIN { printf("warm\\n"); exit(); }'})
            done = c.ok("get_result", {"execution_id": again["execution_id"], "wait_s": 30, "until": "done"})
        assert again["pid"] == replacement and done["status"] == "completed" and done["output"][0] == "warm", done
    finally:
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)
