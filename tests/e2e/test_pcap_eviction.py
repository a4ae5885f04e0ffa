"""Eviction never cancels work in progress (issue 28), on real sharkd and real captures: with
`[pcap] max_loaded = 1`, a long filter pass on capture A and a call on capture B at the same time.
A's call completes; B's call is answered (after A's, A then evicted) or refused with BUSY and
retry_after_s, never CANCELLED. The fast unit tests of the rule are in tests/actors/pcap/test_pool_fake.py."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import DaemonProcess
from tests.e2e.test_pcap_differential import session
from tests.e2e.test_pcap_workers import capture_details, daemon_with, framenum_filter
from tests.pcaps import PCAPS

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]
OTHER = PCAPS / "adrian_sandbox_n2.pcap"


@pytest.fixture(scope="module")
def one_loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    daemon = daemon_with(tmp_path_factory, "evict", "max_loaded = 1\nworkers_per_capture = 1")
    yield daemon
    daemon.stop()
    shutil.rmtree(daemon.env.runtime, ignore_errors=True)


async def test_a_capture_in_use_is_not_evicted_for_another(one_loaded: DaemonProcess, bigger: Path) -> None:
    results: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    async with session(one_loaded) as call:
        # Loaded first (a frame tree needs the worker; pcap_info answers while it loads).
        assert not (await call("pcap_frame_detail", pcap_path=str(bigger), frame_numbers=[1]))["_is_error"]

        async def long_pass() -> None:
            results["A"] = await call("pcap_frames_by_filter", pcap_path=str(bigger),
                                      display_filter=framenum_filter(7))
            order.append("A")

        async def other_capture() -> None:
            with trio.fail_after(60):  # B is asked once A's pass is running on its worker
                while not any(w["doing"] == "filter pass" for w in (await capture_details(call, bigger))["workers"]):
                    await trio.sleep(0.01)
            results["B"] = await call("pcap_info", pcap_path=str(OTHER))
            order.append("B")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_pass)
            nursery.start_soon(other_capture)

        a, b = results["A"], results["B"]
        assert not a["_is_error"] and a["total_exact"], a  # A's call completed, not cancelled by B's
        if b["_is_error"]:
            assert b["code"] == "BUSY", b
            assert b["details"]["retry_after_s"] >= 1, b
            assert "all 1 loaded captures are busy; max_loaded=1" in b["message"], b
        else:
            assert order == ["A", "B"]  # B waited for A's call, then A (idle) made room
            config = await call("pcap_config_get")
            assert [c["details"]["path"] for c in config["loaded_captures"]] == [str(OTHER)]
