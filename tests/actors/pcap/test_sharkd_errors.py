"""sharkd's JSON-RPC errors on a scripted sharkd (tests/support/fake_sharkd.py) under trio's MockClock:
every code of sharkd_session.c is a coded DiagdError naming the request's input and sharkd's message,
the worker that answered it serves the next call (no reload), and a refused filter while the capture
loads is the caller's INVALID_FILTER, not a crash. The real sharkd: tests/e2e/test_pcap_filter_fuzz.py."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from diagd.actors.base import Request
from diagd.actors.pcap.engine.capture import CaptureSpec
from diagd.actors.pcap.engine.passes import CaptureWorkers, Cores
from diagd.actors.pcap.engine.pool import WorkerPool
from diagd.actors.pcap.engine.session import CaptureSession
from diagd.actors.pcap.shark.facts import Wireshark
from diagd.actors.pcap.shark.sharkd import SHARKD_ERRORS, SharkdError
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.support.fake_sharkd import Script

SPEC = CaptureSpec(path=Path("/captures/fake.pcap"), identity="1:2:3:4", decode_as=(), preferences=(), size=10**6)

# A request of the method that answers each code in sharkd_session.c, with the input it carries.
REQUESTS: dict[int, tuple[str, dict[str, Any]]] = {
    -32600: ("frame", {"frame": 0}), -32601: ("bogus", {}), -32603: ("analyse", {}),
    -2001: ("analyse", {}),  # load's code; the pool maps a failed load itself (test below)
    **{c: ("setcomment", {"frame": 9, "comment": "x"}) for c in (-3001, -3002, -3003)},
    **{c: ("setconf", {"name": "tcp.x", "value": "1"}) for c in range(-4005, -4000)},
    -5001: ("check", {"filter": "tcp.port in {1 2}"}), -5002: ("check", {"field": "nosuch.field"}),
    -6001: ("iograph", {"graph0": "sum:nosuch", "filter0": "ip"}), -7001: ("intervals", {"filter": "(ip"}),
    **{c: ("frame", {"frame": 99999}) for c in (-8001, -8002, -8003)},
    -9001: ("dumpconf", {"pref": "nosuch.pref"}), -9002: ("dumpconf", {"pref": "nosuch"}),
    -10001: ("download", {"token": "rtp:x"}), -10002: ("download", {"token": "rtp:1_2_3_4_5"}),
    **{c: ("tap", {"tap0": "nosuch:tap"}) for c in range(-11013, -11000)},
    -12001: ("follow", {"follow": "NOPE", "filter": "tcp.stream eq 0"}),
    -12002: ("follow", {"follow": "TCP", "filter": "tcp.stream eq 0 bad"}),
    -13001: ("frames", {"column0": "frame.number:x"}), -13002: ("frames", {"filter": "tcp.port in {1 2}"}),
}


@asynccontextmanager
async def capture(script: Script) -> AsyncIterator[CaptureWorkers]:
    async with trio.open_nursery() as nursery:
        pool = WorkerPool(nursery, SPEC, Path("/nonexistent"), max_workers=1, headroom=lambda: None,
                          launch=script.launch, cores=1)
        workers = CaptureWorkers(nursery, pool, ["tshark", "-r", str(SPEC.path)], cores=Cores(1),
                                 early_numbers=script.early_numbers)
        workers.start()
        yield workers
        await workers.close()
        nursery.cancel_scope.cancel()


def test_the_table_holds_every_code_of_sharkd_session_c() -> None:
    assert set(REQUESTS) == set(SHARKD_ERRORS)
    assert {code for code, (coded, _) in SHARKD_ERRORS.items() if coded is ErrorCode.INVALID_FILTER} == \
        {-5001, -7001, -11013, -12002, -13002}


@pytest.mark.parametrize("code", sorted(SHARKD_ERRORS))
async def test_each_sharkd_error_is_coded_and_the_worker_serves_the_next_call(
        code: int, autojump_clock: trio.testing.MockClock) -> None:
    method, params = REQUESTS[code]
    script = Script(frames=10, errors={method: (code, f"sharkd says no ({code})")})
    async with capture(script) as workers:
        with pytest.raises(DiagdError) as info:
            await workers.call(method, params, display_filter=None, deadline=math.inf)
        error = info.value
        assert error.code is SHARKD_ERRORS[code][0]
        assert f"sharkd says no ({code})" in error.message and method in error.message
        assert error.details["sharkd_code"] == code and error.details["sharkd_method"] == method
        for name, value in params.items():  # the input sharkd refused is named
            assert error.details["display_filter" if name == "filter" else name] == str(value)
            assert repr(str(value)) in error.message
        assert error.to_wire()["code"] == str(SHARKD_ERRORS[code][0])
        # The same worker answers the next call: sharkd is not restarted, the capture not reloaded.
        status = await workers.call("status", None, display_filter=None, deadline=math.inf)
        assert status == {"frames": 10}
        assert len(script.launched) == 1 and script.launched[0].alive
        assert [line.split()[1] for line in script.log].count("load") == 1


async def test_an_unknown_code_is_invalid_argument_naming_it(autojump_clock: trio.testing.MockClock) -> None:
    error = SharkdError(-99999, "new in a later sharkd", "frames", {"filter": "ip"})
    assert error.code is ErrorCode.INVALID_ARGUMENT and error.details["sharkd_code"] == -99999
    assert error.details["display_filter"] == "ip" and "new in a later sharkd" in error.message


async def test_a_capture_sharkd_cannot_open_is_invalid_argument(autojump_clock: trio.testing.MockClock) -> None:
    async with capture(Script(fail_load=True)) as workers:
        with pytest.raises(DiagdError) as info:
            await workers.call("status", None, display_filter=None, deadline=math.inf)
        assert info.value.code is ErrorCode.INVALID_ARGUMENT and "no capture" in info.value.message


@asynccontextmanager
async def session(script: Script, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[CaptureSession]:
    async def no_catalogue() -> None:  # no decode-as rules: the session needs no field catalogue
        return None

    wireshark = Wireshark()
    monkeypatch.setattr(wireshark, "catalogue", no_catalogue)
    async with trio.open_nursery() as nursery:
        capture_session = CaptureSession(SPEC, max_workers=1, cores=Cores(1), launch=script.launch,
                                         early_numbers=script.early_numbers, wireshark=wireshark)
        await capture_session.start(nursery)
        yield capture_session
        await capture_session.close()
        nursery.cancel_scope.cancel()


async def test_a_filter_refused_while_the_capture_loads_is_invalid_filter_not_a_group(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = "tcp.port in {7777 8282 8889}"
    script = Script(frames=10, load_s=5, invalid={bad}, matches={"tcp": [2, 4]})
    async with session(script, monkeypatch) as capture_session:
        assert capture_session.workers is not None and capture_session.workers.loading
        for attempt in (capture_session.check_filter, capture_session.matching):
            with pytest.raises(DiagdError) as info:  # a bare DiagdError: no ExceptionGroup around it
                await attempt(Request(None), bad)
            assert type(info.value) is DiagdError and info.value.code is ErrorCode.INVALID_FILTER
            assert info.value.details["display_filter"] == bad
        assert await capture_session.matching(Request(None), "tcp") == [2, 4]
        assert len(script.launched) == 1


async def test_a_frames_refusal_after_a_passing_check_is_invalid_filter(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """sharkd's `check` and `frames` compile a filter apart: `frames` may refuse (-13002) what `check`
    passed. The caller gets INVALID_FILTER naming the filter, and the worker goes on serving."""
    flt = "tcp.port in {7777 8282}"
    script = Script(frames=10, errors={"frames": (-13002, "Filter expression invalid")})
    async with session(script, monkeypatch) as capture_session:
        with pytest.raises(DiagdError) as info:
            await capture_session.matching(Request(None), flt)
        assert info.value.code is ErrorCode.INVALID_FILTER and info.value.details["display_filter"] == flt
        assert "Filter expression invalid" in info.value.message
        del script.errors["frames"]
        assert await capture_session.matching(Request(None), "") == list(range(1, 11))
        assert len(script.launched) == 1
