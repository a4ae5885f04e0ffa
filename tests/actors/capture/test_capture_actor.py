"""The capture actor (actor.py) with its real back end and tools, on a scripted dumpcap
(tests/support/fake_dumpcap.py) under trio's MockClock: start -> status -> stop with packets, drops, files
and statistics blocks; dumpcap's own stop conditions; a slow start past start_timeout_s; an early exit
with dumpcap's error as a coded error; ring rotation; the stop escalation (SIGINT, then SIGKILL after
stop_grace_s; at daemon shutdown SHUTDOWN_STEPS) at exact Trio times; linger_s after the end; and every
dumpcap reaped. The end-to-end tests against real dumpcap as root stay (tests/e2e/test_capture*.py).

The blocking file calls the actor makes through trio.to_thread (stat, save) run inline here: while a
thread works MockClock would jump to the next timer, and what a status shows would depend on the race.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import struct
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
import trio.testing

from diagd.actors._subprocess import open_process
from diagd.actors.capture.actor import FLUSH_INTERVAL_S, KIND, SHUTDOWN_STEPS, CaptureActor
from diagd.actors.capture.backend import CaptureBackend
from diagd.actors.capture.record import CaptureStore
from diagd.actors.capture.tools import tools
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.support.fake_dumpcap import Exit, FakeDumpcap, FakeDumpcaps, Script, command
from tests.support.fake_runtime import FakeRuntime, fake_runtime

T = TypeVar("T")
START = {"interfaces": ["veth0"], "filter": "udp"}


@pytest.fixture(autouse=True)
def inline_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    async def run_sync(fn: Callable[..., T], *args: Any, **_: Any) -> T:
        await trio.lowlevel.checkpoint()
        return fn(*args)

    monkeypatch.setattr(trio.to_thread, "run_sync", run_sync)


class Harness:
    def __init__(self, rt: FakeRuntime, backend: CaptureBackend, dumpcaps: FakeDumpcaps) -> None:
        self.rt, self.backend, self.dumpcaps = rt, backend, dumpcaps

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        return await self.rt.call(tool, arguments)

    async def start(self, **arguments: Any) -> dict[str, Any]:
        return await self.call("start_capture", **{**START, **arguments})

    @property
    def dumpcap(self) -> FakeDumpcap:
        """The one capturing dumpcap started."""
        (proc,) = self.dumpcaps.captures
        return proc

    def actor(self, capture_id: str) -> CaptureActor | None:
        ref = self.rt.find(KIND, capture_id)
        actor = None if ref is None else ref.actor
        assert actor is None or isinstance(actor, CaptureActor)
        return actor


@asynccontextmanager
async def captures(tmp_path: Path, script: Script, **table: Any) -> AsyncIterator[Harness]:
    """The capture group in a fake runtime, its dumpcaps the scripted ones. `path` is any executable: as
    root the sandbox's command line resolves it (the fake reads the arguments after it)."""
    settings = {"allowed_interfaces": ["veth*"], "allow_unconfined": True, "path": sys.executable, **table}
    async with trio.open_nursery() as processes:  # outlives the runtime: its shutdown signals them
        dumpcaps = FakeDumpcaps(script, processes)
        async with fake_runtime(tmp_path, "capture", settings) as rt:
            backend = CaptureBackend(rt, spawn=dumpcaps.spawn)
            tools.register(rt, backend)
            rt.on_stop_request(KIND, backend.may_stop)
            yield Harness(rt, backend, dumpcaps)
        # The runtime is gone: no dumpcap runs on, and the exit of every one was collected.
        assert dumpcaps.unreaped() == []
        processes.cancel_scope.cancel()


def blocks(path: str) -> list[int]:
    """The pcapng block types of a file, checking that each block's two lengths agree."""
    data, found, at = Path(path).read_bytes(), [], 0
    assert data[8:12] == b"\x4d\x3c\x2b\x1a"  # a little-endian section header
    while at < len(data):
        block_type, length = struct.unpack("<II", data[at:at + 8])
        assert struct.unpack("<I", data[at + length - 4:at + length])[0] == length
        found.append(block_type)
        at += length
    assert at == len(data)
    return found


SHB, IDB, EPB, ISB = 0x0A0D0D0A, 1, 6, 5


async def test_start_status_stop_counts_packets_drops_files_and_statistics_blocks(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    script = Script(interfaces=("veth0", "veth1"), start_s=0.5, batch=10, drops={"veth0": 2, "veth1": 5})
    async with captures(tmp_path, script) as h:
        started = await h.start(interfaces=["veth0", "veth1"])
        assert trio.current_time() == 0.5  # start_capture answers once dumpcap opened its first file
        cap_id, path = started["capture_id"], f"{started['dir']}/{started['capture_id']}.pcapng"
        assert started["status"] == "running" and started["files"] == [path] and started["packets"] == 0
        argv = h.dumpcap.run.args
        assert (argv.write, argv.interfaces, argv.filters) == (path, ["veth0", "veth1"],
                                                                {"veth0": "udp", "veth1": "udp"})
        assert argv.ring_kb is None and argv.autostop_kb is not None  # one file, bounded by the disk budget

        await trio.sleep_until(3.7)  # batches at 1.5, 2.5, 3.5
        status = await h.call("capture_status", capture_id=cap_id)
        assert (status["status"], status["packets"], status["files"]) == ("running", 30, [path])
        assert status["bytes_written"] == os.path.getsize(path) > 30 * 100
        assert status["drops"] == {"kernel": None, "interface": None, "by_interface": None,
                                   "interface_statistics": None}  # known once dumpcap stops

        stopped = await h.call("stop_capture", capture_id=cap_id)
        assert trio.current_time() == 3.7  # dumpcap closed at once on SIGINT
        assert h.dumpcap.signals == [(3.7, "SIGINT")] and h.dumpcap.returncode == 0
        assert (stopped["status"], stopped["stop_reason"], stopped["stopped_by"], stopped["error"]) == \
            ("stopped", "requested", "mcp:1", None)
        assert stopped["packets"] == 30 and stopped["bytes_written"] == os.path.getsize(path)
        assert stopped["drops"] == {
            "kernel": 7, "interface": 7, "by_interface": {"veth0": 2, "veth1": 5},
            "interface_statistics": {"veth0": {"received": 17, "interface_drops": 2},
                                     "veth1": {"received": 20, "interface_drops": 5}}}
        assert blocks(path) == [SHB, IDB, IDB, *[EPB] * 30, ISB, ISB]
        record = h.backend.store.load(cap_id)
        assert record is not None and record.status == "stopped"


async def test_a_slow_start_within_start_timeout_s_is_waited_for(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with captures(tmp_path, Script(start_s=9.9)) as h:
        started = await h.start()
        assert trio.current_time() == pytest.approx(9.9) and started["status"] == "running"
        assert h.dumpcap.signals == []


@pytest.mark.parametrize("ignore", [(), ("SIGINT",)])
async def test_no_first_file_within_start_timeout_s_is_a_timeout_and_dumpcap_is_stopped(
        tmp_path: Path, autojump_clock: trio.testing.MockClock, ignore: tuple[str, ...]) -> None:
    async with captures(tmp_path, Script(start_s=30, ignore=ignore), start_timeout_s=4, stop_grace_s=2) as h:
        with pytest.raises(DiagdError) as timed_out:
            await h.start()
        assert timed_out.value.code is ErrorCode.TIMEOUT
        assert timed_out.value.message == "dumpcap opened no capture file within 4 s"
        assert timed_out.value.details["setting"] == "[capture] start_timeout_s"
        # SIGINT at the timeout; one that ignores it is killed stop_grace_s later, and only then the answer
        expected = [(4, "SIGINT")] if not ignore else [(4, "SIGINT"), (6, "SIGKILL")]
        assert h.dumpcap.signals == expected and trio.current_time() == expected[-1][0]
        assert h.dumpcap.reaped and h.dumpcap.run.created == []
        assert h.rt.actors(KIND) == [] and h.backend.live == {}
        assert CaptureStore(h.backend.store.root).all() == []  # its record is not kept


@pytest.mark.parametrize(("exit", "code", "message"), [
    (Exit(error='There is no device named "veth0".\n(No such device exists)'), ErrorCode.NOT_FOUND,
     'dumpcap: There is no device named "veth0".\n(No such device exists)'),
    (Exit(error="You don't have permission to capture on that device",
          secondary="(socket: Operation not permitted)"), ErrorCode.PERMISSION_DENIED,
     "dumpcap: You don't have permission to capture on that device (socket: Operation not permitted)"),
    (Exit(bad_filter="illegal port number 99999 > 65535"), ErrorCode.INVALID_FILTER,
     "the capture filter was refused: illegal port number 99999 > 65535"),
    (Exit(status=2, error='The capture session could not be initiated on capture device "veth0" '
                          "(Network is down)."),
     ErrorCode.BACKEND_UNAVAILABLE, "dumpcap could not start the capture (exited with status 2): The capture "
     'session could not be initiated on capture device "veth0" (Network is down).'),
    (Exit(status=1, text="dumpcap: Invalid -b argument: bogus\n"), ErrorCode.BACKEND_UNAVAILABLE,
     "dumpcap could not start the capture (exited with status 1): dumpcap: Invalid -b argument: bogus"),
    (Exit(status=-signal.SIGSEGV), ErrorCode.BACKEND_UNAVAILABLE,
     "dumpcap could not start the capture (killed by SIGSEGV): killed by SIGSEGV"),
], ids=["no-device", "permission", "bad-filter", "other-error", "plain-text", "crash"])
async def test_an_early_exit_is_dumpcaps_error_as_a_coded_error(
        tmp_path: Path, autojump_clock: trio.testing.MockClock, exit: Exit, code: ErrorCode, message: str) -> None:
    async with captures(tmp_path, Script(start_s=5, exit=dataclasses.replace(exit, at_s=1.5))) as h:
        with pytest.raises(DiagdError) as failed:
            await h.start()
        assert (failed.value.code, failed.value.message) == (code, message)
        assert trio.current_time() == 1.5  # at its exit, not at start_timeout_s
        assert h.dumpcap.signals == [] and h.dumpcap.reaped
        assert h.rt.actors(KIND) == [] and CaptureStore(h.backend.store.root).all() == []


async def test_dumpcap_failing_mid_capture_ends_it_as_failed_with_its_error(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    lost = "The network adapter on which the capture was being done is no longer running; the capture has stopped."
    async with captures(tmp_path, Script(exit=Exit(at_s=2.5, status=2, error=lost))) as h:
        cap_id = (await h.start())["capture_id"]
        ended = await h.call("capture_status", capture_id=cap_id, wait_s=60)
        assert trio.current_time() == 2.5
        assert (ended["status"], ended["stop_reason"], ended["packets"]) == ("failed", "failed", 20)
        assert ended["error"] == f"dumpcap exited with status 2: {lost}"
        assert ended["drops"]["interface_statistics"] is None  # no clean close: no statistics blocks


@pytest.mark.parametrize(("arguments", "reason", "packets", "at"), [
    ({"duration_s": 5}, "duration", 50, 5.0),  # -a duration:5 (the batch due then is written first)
    ({"packets": 25}, "packets", 25, 3.0),  # -c 25: the 25th packet is in the third batch
])
async def test_dumpcaps_own_stop_conditions_name_the_reason(
        tmp_path: Path, autojump_clock: trio.testing.MockClock, arguments: dict[str, Any], reason: str,
        packets: int, at: float) -> None:
    async with captures(tmp_path, Script()) as h:
        cap_id = (await h.start(**arguments))["capture_id"]
        ended = await h.call("capture_status", capture_id=cap_id, wait_s=60)
        assert trio.current_time() == at
        assert (ended["status"], ended["stop_reason"], ended["packets"]) == ("stopped", reason, packets)
        assert h.dumpcap.signals == [] and h.dumpcap.returncode == 0
        assert ended["drops"]["interface_statistics"] == {"veth0": {"received": packets, "interface_drops": 0}}


async def test_the_byte_limit_is_the_actors_own_checked_every_flush_interval(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    # A ring (dumpcap has no byte bound then): files of 132 + 7 x 132 bytes. After the batch at 3.2 (20
    # packets) the files hold 2 x 1056 + 924 = 3036 >= 3000 bytes; the actor sees it at its next
    # measurement (every FLUSH_INTERVAL_S from the start: 3.5) and stops dumpcap then.
    assert FLUSH_INTERVAL_S == 0.5
    async with captures(tmp_path, Script(batch=5, batch_s=0.8)) as h:
        cap_id = (await h.start(ring_files=10, file_size_kb=1, bytes=3000))["capture_id"]
        ended = await h.call("capture_status", capture_id=cap_id, wait_s=60)
        assert h.dumpcap.signals == [(3.5, "SIGINT")] and trio.current_time() == 3.5
        assert (ended["status"], ended["stop_reason"], ended["packets"], ended["bytes_written"]) == \
            ("stopped", "bytes", 20, 3036)


async def test_a_ring_lists_its_newest_files_and_the_oldest_are_dropped(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    # 100-byte frames: 132-byte blocks after a 132-byte head: a file of 1 kB holds 7 packets. The names'
    # times are the fake's clock (fake_dumpcap.EPOCH, 2026-01-01T00:00:00Z, at its start).
    async with captures(tmp_path, Script(batch=5), stop_grace_s=2) as h:
        started = await h.start(ring_files=3, file_size_kb=1)
        cap_id, created = started["capture_id"], h.dumpcap.run.created
        assert h.dumpcap.run.args.ring_kb == 1 and h.dumpcap.run.args.ring_files == 3
        stem = f"{started['dir']}/{cap_id}_"
        assert started["files"] == [f"{stem}00001_20260101000000.pcapng"]

        await trio.sleep_until(8.7)  # 40 packets (5 a second) in 6 files of 7: the ring keeps the last 3
        status = await h.call("capture_status", capture_id=cap_id)
        assert [Path(p).name for p in created] == [f"{cap_id}_{n:05d}_20260101{t}.pcapng" for n, t in
                                                   [(1, "000000"), (2, "000002"), (3, "000003"),
                                                    (4, "000005"), (5, "000006"), (6, "000007")]]
        assert status["files"] == created[-3:] and status["current_file"] == created[-1]
        assert status["files_written"] == 6 and status["packets"] == 40
        assert [os.path.exists(p) for p in created] == [False] * 3 + [True] * 3
        assert status["bytes_on_disk"] == sum(os.path.getsize(p) for p in created[-3:])
        assert [blocks(p).count(EPB) for p in created[-3:]] == [7, 7, 5]

        stopped = await h.call("stop_capture", capture_id=cap_id)
        assert stopped["files"] == created[-3:] and stopped["packets"] == 40
        # dumpcap 4.0 writes no statistics blocks in a ring's files: the drops come from its D message only
        assert stopped["drops"]["by_interface"] == {"veth0": 0}
        assert stopped["drops"]["interface_statistics"] is None


async def test_stop_escalates_from_sigint_to_sigkill_after_stop_grace_s(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with captures(tmp_path, Script(ignore=("SIGINT",)), stop_grace_s=2.5) as h:
        cap_id = (await h.start())["capture_id"]
        actor = h.actor(cap_id)
        assert actor is not None
        await trio.sleep_until(4.2)
        stopped = await h.call("stop_capture", capture_id=cap_id)
        assert trio.current_time() == 6.7
        assert h.dumpcap.signals == [(4.2, "SIGINT"), (6.7, "SIGKILL")] and h.dumpcap.returncode == -9
        assert actor.stop_step == "sigkill"
        # it went on capturing until killed
        assert (stopped["status"], stopped["stop_reason"], stopped["packets"]) == ("stopped", "requested", 60)
        assert stopped["error"] == "dumpcap did not exit after SIGINT and was killed: its last file has no statistics"
        assert stopped["drops"] == {"kernel": None, "interface": None, "by_interface": None,
                                    "interface_statistics": None}


async def test_a_slow_close_within_stop_grace_s_is_a_clean_stop(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with captures(tmp_path, Script(close_s=1.25, drops={"veth0": 4}), stop_grace_s=2) as h:
        cap_id = (await h.start())["capture_id"]
        actor = h.actor(cap_id)
        stopped = await h.call("stop_capture", capture_id=cap_id)
        assert trio.current_time() == 1.25 and h.dumpcap.signals == [(0, "SIGINT")]
        assert actor is not None and actor.stop_step == "sigint"
        assert stopped["error"] is None and stopped["drops"]["kernel"] == 4


async def test_daemon_shutdown_stops_a_running_capture_by_the_shutdown_steps(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with captures(tmp_path, Script(ignore=("SIGINT", "SIGTERM")), stop_grace_s=30) as h:
        cap_id = (await h.start())["capture_id"]
        await trio.sleep_until(2.5)
        store, dumpcaps = h.backend.store, h.dumpcaps
    # Not stop_grace_s: the daemon's own steps (SIGINT, SIGKILL 3 s later), whatever the config says.
    assert [s.name for s in SHUTDOWN_STEPS] == ["sigint", "sigkill"] and SHUTDOWN_STEPS[0].wait_s == 3
    (proc,) = dumpcaps.captures
    assert proc.signals == [(2.5, "SIGINT"), (5.5, "SIGKILL")] and proc.reaped
    record = store.load(cap_id)
    assert record is not None and (record.status, record.stop_reason, record.packets) == ("stopped", "shutdown", 50)


async def test_a_finished_capture_lingers_linger_s_then_its_actor_retires(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with captures(tmp_path, Script(), linger_s=30) as h:
        cap_id = (await h.start(duration_s=3))["capture_id"]
        ended = await h.call("capture_status", capture_id=cap_id, wait_s=60)
        assert trio.current_time() == 3 and ended["stop_reason"] == "duration"
        await trio.sleep_until(32.999)
        assert h.actor(cap_id) is not None and h.backend.running(cap_id) is not None  # still answering
        await trio.sleep_until(33.001)
        assert h.actor(cap_id) is None and h.backend.running(cap_id) is None
        stored = await h.call("capture_status", capture_id=cap_id)  # from its record on disk now
        assert {k: stored[k] for k in ("status", "stop_reason", "packets", "files", "drops")} == \
            {k: ended[k] for k in ("status", "stop_reason", "packets", "files", "drops")}
        assert h.dumpcap.reaped


async def test_a_real_process_that_ignores_sigint_is_killed_and_reaped(tmp_path: Path) -> None:
    """The same script as a real program on the real clock (open_process, the kernel's signals): after
    SIGINT is ignored for stop_grace_s SIGKILL ends it, and it is reaped at once (no zombie left)."""
    script = Script(batch_s=0.05, batch=2, ignore=("SIGINT",), drops={"veth0": 1})
    launched: list[trio.Process] = []

    async def spawn(argv: Sequence[str], *, env: dict[str, str] | None = None) -> trio.Process:
        line, environment = command(script, argv)
        proc = await open_process(line, env=environment)
        launched.append(proc)
        return proc

    settings = {"allowed_interfaces": ["veth*"], "allow_unconfined": True, "path": sys.executable,
                "stop_grace_s": 0.5}
    async with fake_runtime(tmp_path, "capture", settings) as rt:
        backend = CaptureBackend(rt, spawn=spawn)
        tools.register(rt, backend)
        started = await rt.call("start_capture", dict(START))
        await trio.sleep(0.3)
        before = trio.current_time()
        stopped = await rt.call("stop_capture", {"capture_id": started["capture_id"]})
        assert 0.5 <= trio.current_time() - before < 3
        proc = launched[-1]
        assert proc.returncode == -signal.SIGKILL
        assert not Path(f"/proc/{proc.pid}").exists()  # reaped: no <defunct> entry left
        assert stopped["status"] == "stopped" and stopped["packets"] > 0
        assert stopped["error"] == "dumpcap did not exit after SIGINT and was killed: its last file has no statistics"
        assert blocks(stopped["files"][0])[:2] == [SHB, IDB]
    assert all(p.returncode is not None for p in launched)  # the `-d` checks too
