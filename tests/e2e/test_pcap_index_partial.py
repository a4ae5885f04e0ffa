"""A capture's index answering while it is still built (actors/pcap/index/partial.py), through the real
daemon, its real builder and tshark.

The builder is held still between steps (SIGSTOP/SIGCONT: real rows, read only so far; its tshark then
waits on the full pipe), so the test sees the build at a point it chooses: with some files of the frames
table closed and the rest unread. A page within the frames indexed so far comes from the building
index, marked as such (a lower-bound total; in a chunked build every row `provisional` on the seam
columns), each row tshark's own two-pass row of the whole file (tests/support/pcap_oracle.py); a filter
the index translates counts its matches among them, and so does a timeline of fields it holds; a page
past them goes to the loaded capture. Once the build ends, the ready index gives the same rows.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from diagd.actors.pcap.index.query import SEAM_COLUMNS
from tests.conftest import start_daemon
from tests.e2e.test_pcap import make_env
from tests.e2e.test_pcap_differential import Call, session
from tests.e2e.test_pcap_index import TRANSPORT_FIELDS, builders, tshark_timeline
from tests.e2e.test_pcap_oracle import row_of
from tests.pcaps import PCAPS
from tests.support import pcap_oracle as oracle

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed"),
]

SEGMENT = 2000  # frames per file of the frames table: the first closes long before the build ends
STEP_S = 0.05  # the builder runs this long between looks
SETTLE_S = 0.2  # for the daemon to read what a stopped builder printed before it stopped
BUILDING = "index (being built)"


def builder_of(capture: Path) -> int | None:
    """The capture's index builder (not its tshark: a chunked build starts one per chunk), if running."""
    for pid in builders(str(capture)):
        try:
            argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"index/build.py") for a in argv):
            return pid
    return None


async def held_with_frames_indexed(call: Call, capture: Path) -> tuple[int, int]:
    """Start the capture's build and hold its builder still as soon as it has closed a file of its
    frames table: (the builder's pid, the frames indexed so far). Stopped, it cannot end, nor say more
    than it has (what it said before is read within SETTLE_S), so what the daemon says then stays true."""
    begun = await call("pcap_index", pcap_path=str(capture))
    assert begun["state"] == "building", begun
    with trio.fail_after(60):
        while (pid := builder_of(capture)) is None:
            await trio.sleep(0.005)
    os.kill(pid, signal.SIGSTOP)
    with trio.fail_after(120):
        while True:
            await trio.sleep(SETTLE_S)
            status = await call("pcap_index", pcap_path=str(capture))
            assert status["state"] == "building", status  # never ends while its builder is stopped
            if (indexed := status.get("pages_from_frames")) is not None:
                assert f"pages within its first {indexed} frames" in status["note"], status
                return pid, indexed
            os.kill(pid, signal.SIGCONT)
            await trio.sleep(STEP_S)
            os.kill(pid, signal.SIGSTOP)


@pytest.mark.parametrize("chunk_mb", [None, 8], ids=["one pass", "chunked"])
async def test_pages_within_the_frames_indexed_so_far_come_from_the_building_index(
        tmp_path: Path, bigger: Path, chunk_mb: int | None) -> None:
    chunked = f"index_chunk_mb = {chunk_mb}\n" if chunk_mb else ""
    env = make_env(tmp_path / "d", f'[daemon]\nallowed_dirs = ["{bigger.parent}", "{PCAPS}"]\ncall_timeout_s = 300\n'
                                   f"[pcap]\nindex_segment_frames = {SEGMENT}\n{chunked}")
    table = oracle.columns(bigger)
    daemon = start_daemon(env)
    pid = None
    try:
        async with session(daemon) as call:
            await call("pcap_info", pcap_path=str(PCAPS / "adrian_registration_reject.pcap"))  # the catalogue, read
            pid, indexed = await held_with_frames_indexed(call, bigger)
            assert SEGMENT <= indexed < len(table) and indexed % SEGMENT == 0, indexed

            # The last page within the frames indexed so far: from the building index, rows tshark's.
            last = await call("pcap_frames_by_filter", pcap_path=str(bigger), display_filter="", limit=50,
                              offset=indexed - 50)
            assert not last["_is_error"] and last["served_by"] == BUILDING, last
            assert last["total_exact"] is False and last["total"] == last["total_at_least"] == indexed, last
            assert last["has_more"] is True and f"the first {indexed} frames" in last["note"], last
            assert [f["number"] for f in last["frames"]] == list(range(indexed - 49, indexed + 1))
            for frame in last["frames"]:
                assert without_provisional(frame) == row_of(table[frame["number"]]), frame
                assert frame.get("provisional") == (SEAM_COLUMNS if chunk_mb else None), frame
            assert last["exact"] is (chunk_mb is None), last

            # A filter the index translates: its matches among the frames indexed so far.
            wanted = [n for n in oracle.matching(bigger, "diameter") if n <= indexed]
            some = await call("pcap_frames_by_filter", pcap_path=str(bigger), display_filter="diameter", limit=5,
                              offset=len(wanted) - 5)
            assert some["served_by"] == BUILDING and some["total"] == len(wanted), some
            assert [f["number"] for f in some["frames"]] == wanted[-5:], some

            # A timeline of fields the index holds: its rows among the frames indexed so far, tshark's.
            rows = [r for r in tshark_timeline(bigger, TRANSPORT_FIELDS) if r["frame.number"] <= indexed]
            timeline = await call("pcap_timeline", pcap_path=str(bigger), fields=TRANSPORT_FIELDS, limit=20,
                                  offset=len(rows) - 20)
            assert timeline["served_by"] == BUILDING and timeline["total_at_least"] == len(rows), timeline
            assert [without_provisional(r) for r in timeline["rows"]] == rows[-20:], timeline
            seam_fields = sorted(TRANSPORT_FIELDS)  # none is a frame's own (time, length, offset)
            assert all(r.get("provisional") == (seam_fields if chunk_mb else None) for r in timeline["rows"])

            # Past them (the frames beyond are not read yet): the loaded capture answers, exactly.
            past = await call("pcap_frames_by_filter", pcap_path=str(bigger), display_filter="", limit=10,
                              offset=indexed)
            assert not past["_is_error"] and past["served_by"] != BUILDING and past["total_exact"], past
            assert [without_provisional(f) for f in past["frames"]] == [
                row_of(table[n]) for n in range(indexed + 1, indexed + 11)]

            os.kill(pid, signal.SIGCONT)
            pid = None
            built = await call("pcap_index", pcap_path=str(bigger), wait_s=240)
            assert built["state"] == "ready", built
            again = await call("pcap_frames_by_filter", pcap_path=str(bigger), display_filter="", limit=50,
                               offset=indexed - 50)
            assert again["served_by"] == "index" and again["total"] == len(table), again
            for before, now in zip(last["frames"], again["frames"], strict=True):
                if "provisional" not in now:  # a seam frame's row may have changed: said so before
                    assert without_provisional(before) == now, (before, now)
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)


def without_provisional(frame: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in frame.items() if k != "provisional"}
