"""The crash session actor and its pty driver against a scripted fake crash (tests/fixtures/fake_crash.py):
context-keyed caching, delimiting, Ctrl-C on timeouts, and failing the session when crash dies or hangs."""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pexpect
import pytest
import trio

from diagd.actors.crash.actor import CrashSession
from diagd.actors.crash.messages import Hooks, Phase, RunCrash, SessionSpec
from diagd.actors.crash.pty import CrashDriver, MemorySink
from diagd.actors.crash.sessions import SessionRecord
from diagd.actors.crash.settings import CrashSettings, validate_crash_args
from diagd.actors.crash.store import OutputStore
from diagd.actors.sandbox import namespaces
from diagd.daemon.server.supervisor import ActorEntry, Supervisor
from diagd.protocol.errors import DiagdError, ErrorCode

FAKE = Path(__file__).resolve().parents[2] / "fixtures" / "fake_crash.py"
SID = "fake0001-000001"


class Harness:
    def __init__(self, supervisor: Supervisor, ref: ActorEntry, actor: CrashSession,
                 events: list[tuple[str, Any]]) -> None:
        self.supervisor = supervisor
        self.ref = ref
        self.actor = actor
        self.events = events

    async def run(self, command: str, force: bool = False) -> dict[str, Any]:
        with trio.fail_after(20):
            return await self.supervisor.ask(self.ref, RunCrash(command, force))


@pytest.fixture(autouse=True)
def _fake_crash_runs_without_landlock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake crash is a Python script (its interpreter is not the file Landlock lets crash execute).
    Its shebang makes the kernel start the interpreter within the launcher's one execve, the only one
    seccomp lets through: a wrapper that execs Python again would be refused."""
    monkeypatch.setenv("DIAGD_LANDLOCK", "off")


@asynccontextmanager
async def session(tmp_path: Path, idle_timeout_s: float = 600, live: dict[str, Any] | None = None,
                  **overrides: Any) -> AsyncIterator[Harness]:
    """A session on the fake crash; `live`, when given, is what the current settings override (a test
    changes it to stand for `diagd reload`), while the spawn-time settings stay as opened."""
    wrapper = tmp_path / "crash"
    # The sandbox passes crash only its environment allow-list: the fake's switches are written in.
    switches = {k: v for k, v in os.environ.items() if k.startswith("FAKE_CRASH_")}
    wrapper.write_text(f"#!{sys.executable}\nimport os, runpy, sys\nos.environ.update({switches!r})\n"
                       f"sys.argv[0] = {str(FAKE)!r}\nrunpy.run_path({str(FAKE)!r}, run_name='__main__')\n")
    wrapper.chmod(0o755)
    # The fake's interpreter and script: visible inside crash's private /tmp even when the checkout or
    # the venv lives under /tmp (the launcher binds back every policy path under the real /tmp).
    reach = (str(FAKE.parent), sys.prefix, os.path.dirname(os.path.realpath(sys.executable)))
    settings = replace(CrashSettings(crash_binary=str(wrapper), drgn=False, load_timeout_s=10, allowed_dirs=reach),
                       **overrides)
    store = OutputStore(tmp_path / "state")
    workdir = store.create_session(SID, {})
    spec = SessionSpec(SID, "key", tmp_path / "vmcore", tmp_path / "vmlinux", workdir, (), settings)
    events: list[tuple[str, Any]] = []
    current = None if live is None else (lambda: replace(settings, **live))
    hooks = Hooks(on_failed=lambda a, e: events.append(("failed", e)), on_exit=lambda a: events.append(("exit", a)),
                  settings=current)
    async with trio.open_nursery() as nursery:
        supervisor = Supervisor(nursery, idle_timeout_s=600)
        ref = await supervisor.start("crash", "key", lambda: CrashSession(spec, store, hooks, "crash 8.0.2-x",
                                                                         namespaces.Namespaces()),
                                     idle_timeout_s=idle_timeout_s)
        actor = ref.actor
        assert isinstance(actor, CrashSession)
        with trio.fail_after(20):
            await actor.crash_done.wait()
        yield Harness(supervisor, ref, actor, events)
        supervisor.stop_all("test over")


async def test_set_pid_then_bt_never_answers_with_the_previous_tasks_trace(tmp_path: Path) -> None:
    async with session(tmp_path) as s:
        assert s.actor.panic_context is not None and s.actor.panic_context.pid == 1
        first = await s.run("bt")
        assert "sysrq_handle_crash" in first["output"] and not first["cached"]
        again = await s.run("bt")
        assert again["cached"] and again["command_id"] == first["command_id"]
        switched = await s.run("set 0")
        assert not switched["cached"] and switched["context"]["pid"] == 1  # the context it ran in
        other = await s.run("bt")
        assert not other["cached"] and "PID: 0" in other["output"] and "sysrq_handle_crash" not in other["output"]
        assert other["context"]["pid"] == 0
        forced = await s.run("bt", force=True)
        assert not forced["cached"] and "PID: 0" in forced["output"]
        await s.run("set 1")
        back = await s.run("bt")
        assert back["cached"] and back["command_id"] == first["command_id"]
        repeat_set = await s.run("set 1")
        assert not repeat_set["cached"]  # context commands always run


async def test_state_commands_invalidate_the_cache(tmp_path: Path) -> None:
    async with session(tmp_path) as s:
        first = await s.run("sys")
        assert (await s.run("sys"))["cached"]
        await s.run("set radix 16")
        assert not (await s.run("sys"))["cached"]
        assert first["command_id"] == f"{SID}:1"


async def test_output_quoting_the_prompt_is_delimited_by_the_marker(tmp_path: Path) -> None:
    async with session(tmp_path) as s:
        helped = await s.run("help")
        assert "crash> set 1" in helped["output"] and "crash> set -p" in helped["output"]
        assert (await s.run("sys"))["output"].startswith("      KERNEL: vmlinux")


async def test_a_slow_command_gets_ctrl_c_and_the_session_carries_on(tmp_path: Path) -> None:
    async with session(tmp_path, command_timeout_s=0.5) as s:
        with pytest.raises(DiagdError) as err:
            await s.run("sleep 30")
        assert err.value.code == ErrorCode.TIMEOUT and err.value.details["command_id"].startswith(SID)
        assert "PANIC" in (await s.run("set"))["output"]
        assert s.actor.failure is None


async def test_reloaded_limits_apply_to_the_next_call_of_an_open_session(tmp_path: Path) -> None:
    live: dict[str, Any] = {}
    async with session(tmp_path, live=live, command_timeout_s=120) as s:
        assert len((await s.run("lines 50"))["output"].splitlines()) == 20  # output_lines as opened
        live.update(command_timeout_s=0.5, output_lines=3)  # `diagd reload`
        assert (await s.run("lines 50", force=True))["lines_returned"] == 3
        with pytest.raises(DiagdError) as err:
            await s.run("sleep 30")
        assert err.value.code == ErrorCode.TIMEOUT and s.actor.failure is None
        assert s.actor.spec.settings.command_timeout_s == 120  # what crash was spawned with is kept apart
        live.update(allow_shell=False)
        with pytest.raises(DiagdError):
            await s.run("!id")


async def test_runaway_output_is_cut_at_the_cap_flagged_and_the_session_carries_on(tmp_path: Path) -> None:
    async with session(tmp_path, max_output_bytes=5000) as s:
        cut = await s.run("lines 10000000")
        assert cut["output_truncated"] and "output passed 5000 bytes" in cut["truncated_reason"]
        assert cut["output"].startswith("line 0\nline 1\n")
        stored = s.actor.store.output_path(SID, int(cut["command_id"].rsplit(":", 1)[1]))
        assert stored.stat().st_size == 5000
        page = s.actor.store.page(cut["command_id"], cut["total_lines"] - 1, 10)
        assert not page["has_more"] and page["output"].startswith("line ")
        assert "KERNEL" in (await s.run("sys"))["output"]
        assert s.actor.failure is None


class OneRead:
    """A crash pty whose whole answer (output, marker, prompt) comes back in a single read."""

    pid = 0

    def __init__(self, output: bytes) -> None:
        self.output = output
        self.pending: list[bytes] = []

    def send(self, data: bytes) -> None:
        nonce = re.search(rb"ascii ([0-9a-f]+)\n", data)
        assert nonce is not None
        self.pending.append(self.output + b"crash> " + nonce.group(1) + b": x\r\ncrash> ")

    def read_nonblocking(self, size: int, timeout: float) -> bytes:
        if self.pending:
            return self.pending.pop(0)
        raise pexpect.TIMEOUT("nothing more")

    def sendintr(self) -> None:
        raise AssertionError("a command that came back to its prompt needs no Ctrl-C")


def test_an_output_past_the_cap_that_came_in_one_read_with_the_prompt_is_flagged() -> None:
    driver = CrashDriver(cast(pexpect.spawn, OneRead(b"line\r\n" * 50)))
    sink = MemorySink(100)
    out = driver.run("lines 50", timeout_s=5, abort=threading.Event(), sink=sink)
    assert out.truncated and not out.interrupted and out.reason == "output passed 100 bytes"
    assert bytes(sink.data) == b"line\n" * 20


async def test_a_short_output_past_the_cap_is_cut_and_flagged(tmp_path: Path) -> None:
    async with session(tmp_path, max_output_bytes=100) as s:
        cut = await s.run("lines 50")  # ~390 bytes: may arrive with the prompt, no Ctrl-C needed then
        assert cut["output_truncated"] and cut["truncated_reason"].startswith("output passed 100 bytes: cut there")
        stored = s.actor.store.output_path(SID, int(cut["command_id"].rsplit(":", 1)[1]))
        assert stored.stat().st_size == 100


async def test_output_is_streamed_to_its_file_whole_and_pages_from_there(tmp_path: Path) -> None:
    async with session(tmp_path) as s:
        done = await s.run("lines 30000")
        assert done["total_lines"] == 30000 and "output_truncated" not in done
        assert done["output"].splitlines()[:2] == ["line 0", "line 1"]
        stored = s.actor.store.output_path(SID, int(done["command_id"].rsplit(":", 1)[1]))
        assert stored.read_text() == "".join(f"line {i}\n" for i in range(30000))
        page = s.actor.store.page(done["command_id"], 29998, 10)
        assert page["output"] == "line 29998\nline 29999" and not page["has_more"]


async def test_crash_exiting_fails_the_session_with_a_coded_error(tmp_path: Path) -> None:
    async with session(tmp_path) as s:
        with pytest.raises(DiagdError) as err:
            await s.run("die")
        assert err.value.code == ErrorCode.ACTOR_FAILED and "exited with status 1" in err.value.message
        assert [kind for kind, _ in s.events] == ["failed"]


async def test_crash_ignoring_ctrl_c_fails_the_session(tmp_path: Path) -> None:
    async with session(tmp_path, command_timeout_s=0.3, interrupt_grace_s=0.5) as s:
        with pytest.raises(DiagdError) as err:
            await s.run("hang")
        assert err.value.code == ErrorCode.ACTOR_FAILED and "stopped answering" in err.value.message
        pid = s.actor.child.pid if s.actor.child else 0
    assert s.actor.stop_results["crash"] in ("sigterm", "sigkill")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_a_load_failure_reports_what_crash_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CRASH_FAIL", "1")
    async with session(tmp_path) as s:
        error = s.actor.crash_error
        assert error is not None and error.code == ErrorCode.BACKEND_UNAVAILABLE
        assert "do not match" in error.message and "exited with status 1" in error.message


async def test_stopping_quits_crash_and_reports_exit(tmp_path: Path) -> None:
    async with session(tmp_path) as s:
        pid = s.actor.child.pid if s.actor.child else 0
    assert s.actor.stop_results == {"crash": "quit"} and s.events[-1][0] == "exit"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_an_idle_session_expires_and_releases_crash(tmp_path: Path) -> None:
    # 2 s: long enough that a loaded machine (the suite's other worker) cannot let it expire between the
    # session's start and the command (seen at 0.5 s under three workers), short enough to wait for.
    async with session(tmp_path, idle_timeout_s=2.0) as s:
        pid = s.actor.child.pid if s.actor.child else 0
        await s.run("sys")
        with trio.fail_after(15):
            await s.actor.stopped.wait()
        assert s.supervisor.find("crash", "key") is None
        assert [kind for kind, _ in s.events] == ["exit"] and s.actor.failure is None
    assert s.actor.stop_results == {"crash": "quit"}
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_a_stopped_session_never_shows_its_children_ready(tmp_path: Path) -> None:
    async with session(tmp_path) as s:
        rec = SessionRecord(SID, "key", "vmcore", "vmlinux", tmp_path, [], 0.0, state="ready", view=s.actor)
        assert (rec.describe()["crash"], rec.describe()["drgn"]) == ("ready", "unavailable")  # drgn=False here
        rec.state = "closed"  # released: the back end stops the actor right after
        assert (rec.describe()["crash"], rec.describe()["drgn"]) == ("stopping", "stopping")
    assert (s.actor.crash_phase, s.actor.drgn_phase) == (Phase.CLOSED, Phase.CLOSED)
    assert (rec.describe()["crash"], rec.describe()["drgn"]) == ("closed", "closed")
    assert s.actor.statistics()["crash"] == "closed"


async def test_a_failed_crash_stays_failed_after_the_session_stops(tmp_path: Path) -> None:
    async with session(tmp_path) as s:
        with pytest.raises(DiagdError):
            await s.run("die")
    assert (s.actor.crash_phase, s.actor.drgn_phase) == (Phase.FAILED, Phase.CLOSED)


def test_crash_options_are_allow_listed() -> None:
    assert validate_crash_args(["--kaslr=auto", "--cpus", "2", "--hex"]) == ["--kaslr", "auto", "--cpus", "2", "--hex"]
    for bad in (["-i", "cmds"], ["/dev/mem"], ["--kaslr=$(id)"], ["--cpus"], ["-o", "x"]):
        with pytest.raises(DiagdError):
            validate_crash_args(bad)


def test_settings_reject_unknown_keys_and_bad_values() -> None:
    assert CrashSettings.from_raw({"output_lines": 5, "script_dirs": ["/x"]}).script_dirs == ("/x",)
    for raw in ({"nope": 1}, {"output_lines": 0}, {"command_timeout_s": "soon"}):
        with pytest.raises(DiagdError):
            CrashSettings.from_raw(raw)
