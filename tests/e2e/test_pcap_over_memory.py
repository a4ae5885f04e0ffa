"""A capture whose sharkd would not fit `[pcap] max_memory_mb` is not loaded: diagd says so, and the
answers tshark gives while a capture loads keep coming (pcap_info, first pages, two-pass filters),
while a tool that needs sharkd gets the reason instead of a load that would not fit. A real daemon with
a budget below sharkd's own baseline; every answer checked against tshark and capinfos (the oracle)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_pcap import make_env
from tests.e2e.test_pcap_differential import session
from tests.pcaps import PCAPS
from tests.support import pcap_oracle as oracle
from tests.support.procs import children

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]

CAPTURE = PCAPS / "magma_gx_gy_combined_04.pcapng"  # 2.9 MB: sharkd's estimate ~162 MB, over 100
REFUSAL = "would not fit [pcap] max_memory_mb=100"


@pytest.fixture
def small_budget(tmp_path: Path) -> Iterator[DaemonProcess]:
    if not CAPTURE.exists():
        pytest.skip(f"{CAPTURE} is absent")
    env = make_env(tmp_path / "d", f'[daemon]\nallowed_dirs = ["{PCAPS}"]\ncall_timeout_s = 300\n'
                                   "[pcap]\nmax_memory_mb = 100\n")
    daemon = start_daemon(env)
    yield daemon
    daemon.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


def sharkd_children(daemon: DaemonProcess) -> list[str]:
    return [p.comm for p in children(daemon.proc.pid) if p.comm == "sharkd"]


async def test_a_capture_over_the_memory_budget_is_answered_from_tshark(small_budget: DaemonProcess) -> None:
    path = str(CAPTURE)
    async with session(small_budget) as call:
        with trio.fail_after(300):
            while not (info := await call("pcap_info", pcap_path=path))["protocols_ready"]:
                assert any(REFUSAL in w for w in info["warnings"]), info
                await trio.sleep(0.2)
        assert not info["_is_error"] and info["served_by"] == "tshark (sharkd not started: over max_memory_mb)"
        assert any(REFUSAL in w for w in info["warnings"]) and info["provisional"] == ["protocols", "top_conversations"]
        assert "the same call" not in info["note"]  # no sharkd answer will come
        ref = oracle.capinfos(CAPTURE)
        assert info["packet_count"] == int(ref["Number of packets"])
        layers = {*oracle.layers(CAPTURE), "frame"}
        assert set(info["protocols"]) == layers and info["has_protocols"] == {p: p in layers
                                                                               for p in info["has_protocols"]}

        # A first page (single-pass safe filter): the frames tshark -2 -Y keeps, asked twice.
        want = oracle.matching(CAPTURE, "diameter")
        for _ in range(2):
            page = await call("pcap_frames_by_filter", pcap_path=path, display_filter="diameter", limit=5)
            assert not page["_is_error"], page
            assert [r["number"] for r in page["frames"]] == want[:5] and page["total"] <= len(want)
            assert page["served_by"] == "tshark (single pass while sharkd loads)"
        # A filter only two passes answer: one whole tshark pass, exact.
        page = await call("pcap_frames_by_filter", pcap_path=path, display_filter="diameter.answer_in", limit=5)
        assert not page["_is_error"], page
        want = oracle.matching(CAPTURE, "diameter.answer_in")
        assert page["total"] == len(want) and [r["number"] for r in page["frames"]] == want[:5]
        # A tool that needs sharkd says why it cannot have it, at once.
        detail = await call("pcap_frame_detail", pcap_path=path, frame_numbers=[1])
        assert detail["_is_error"] and REFUSAL in detail["message"], detail
        assert sharkd_children(small_budget) == []  # never started
