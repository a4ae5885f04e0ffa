"""The sharkd worker's lifecycle with the real sharkd: reaped the moment it dies, pipes closed then,
a killed worker never taken for alive, and a request in flight told how the worker died."""

from __future__ import annotations

import gc
import os
import shutil
import signal
from pathlib import Path

import pytest
import trio

from diagd.actors.pcap.shark.sharkd import Sharkd
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.pcaps import pcap
from tests.support.procs import children, fd_names

pytestmark = pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed")


def _fds() -> set[str]:
    return fd_names(os.getpid())


def _children() -> dict[int, str]:
    """This process's children and their states (a zombie is 'Z')."""
    return {p.pid: p.state for p in children(os.getpid())}


async def test_a_killed_idle_sharkd_is_reaped_at_once_and_its_pipes_closed(tmp_path: Path) -> None:
    capture = pcap("adrian_registration_reject.pcap")
    gc.collect()  # an earlier test's garbage (a pipe, a socket) closes now, not midway through this count
    before = _fds()
    async with trio.open_nursery() as nursery:
        worker = await Sharkd.start(nursery, tmp_path)
        with trio.fail_after(30):
            frames, _ = await worker.load(capture)
            assert frames > 0 and worker.alive
            os.kill(worker.proc.pid, signal.SIGKILL)
            assert not worker.alive  # dying already counts: the next call must not write into it
            await worker.exited.wait()
        assert worker.proc.pid not in _children()  # reaped without anyone asking
        assert _fds() == before
        with pytest.raises(DiagdError) as err:
            await worker.call("status")
        assert err.value.code == ErrorCode.BACKEND_UNAVAILABLE and "killed by SIGKILL" in err.value.message


async def test_a_request_in_flight_when_sharkd_dies_gets_backend_unavailable_naming_the_signal(
        tmp_path: Path) -> None:
    capture = pcap("adrian_registration_reject.pcap")
    async with trio.open_nursery() as nursery:
        worker = await Sharkd.start(nursery, tmp_path)
        with trio.fail_after(30):
            await worker.load(capture)
            os.kill(worker.proc.pid, signal.SIGSTOP)  # it cannot answer: the request is surely in flight
            failure: list[DiagdError] = []

            async def ask() -> None:
                try:
                    await worker.call("frames", {"filter": "ngap"})
                except DiagdError as exc:
                    failure.append(exc)

            nursery.start_soon(ask)
            while worker.requests < 3:  # load + status + frames written
                await trio.sleep(0.01)
            os.kill(worker.proc.pid, signal.SIGKILL)
            await worker.exited.wait()
            while not failure:
                await trio.sleep(0.01)
        assert failure[0].code == ErrorCode.BACKEND_UNAVAILABLE
        assert "died during 'frames'" in failure[0].message and "killed by SIGKILL" in failure[0].message
        assert worker.proc.pid not in _children()


async def test_closing_a_worker_reaps_it_and_releases_its_fds(tmp_path: Path) -> None:
    before = _fds()
    async with trio.open_nursery() as nursery:
        worker = await Sharkd.start(nursery, tmp_path)
        with trio.fail_after(30):
            await worker.call("status")
            assert await worker.close() in ("sigterm", "exited")
        assert _fds() == before and worker.proc.pid not in _children()
        nursery.cancel_scope.cancel()
