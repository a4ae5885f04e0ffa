"""Response times from an index (answers/index_srt.py) at its bounds: a cut tshark cannot read within its
memory bound or its time bound, and more frames than are held for pairing, each a coded error (the first
two leave the answer to the loaded capture); never an answer from part of the messages; the capture's end
they are measured to, the latest arrival of any frame, kept by the build. Their equality
with the pairing of `tshark -T fields` over the whole file, on every corpus capture, is
tests/e2e/test_pcap_index.py's."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from diagd.actors.pcap.answers import index_srt
from diagd.actors.pcap.index import query, workspace
from diagd.actors.pcap.shark.tshark import base_argv
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.pcaps import PCAPS
from tests.support import pcap_oracle as oracle
from tests.support.index_builds import build

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")

CAPTURE = PCAPS / "adrian_n4_upf_timeout_n4.pcap"  # 15 PFCP Session Establishment Requests, no response


async def answer(tmp_path: Path) -> None:
    if not CAPTURE.exists():
        pytest.skip(f"{CAPTURE.name} is not in the corpus")
    meta = build(CAPTURE, tmp_path / "index", 0)
    await index_srt.srt(CAPTURE, tmp_path / "index", meta, base_argv(CAPTURE, [], []), "pfcp", "")


async def test_a_cut_past_the_memory_bound_is_left_to_the_loaded_capture(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace, "CUT_MAX_AS", 32 * 2**20)  # less than tshark needs to start
    with pytest.raises(DiagdError) as unanswered:
        await answer(tmp_path)
    assert unanswered.value.code == ErrorCode.NOT_FOUND and unanswered.value.details["index_unanswered"]
    assert "cannot pair pfcp messages" in unanswered.value.message


async def test_more_frames_than_are_held_for_pairing_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_srt, "MAX_FRAMES", 5)
    with pytest.raises(DiagdError) as refused:
        await answer(tmp_path)
    assert refused.value.code == ErrorCode.OUTPUT_TOO_LARGE and refused.value.details["limit"] == 5
    assert "index_unanswered" not in refused.value.details


async def test_a_cut_read_past_its_time_bound_is_left_to_the_loaded_capture(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tshark looping over a crafted packet must not hold the daemon-wide cut limiter for good."""
    monkeypatch.setattr(workspace, "CUT_BASE_S", 0.0)
    monkeypatch.setattr(workspace, "CUT_FRAMES_PER_S", 10**9)  # a few nanoseconds: no tshark starts in that
    with pytest.raises(DiagdError) as unanswered:
        await answer(tmp_path)
    assert unanswered.value.code == ErrorCode.NOT_FOUND and unanswered.value.details["index_unanswered"]
    assert "took longer than" in unanswered.value.message


def test_the_latest_arrival_is_kept_by_the_build_and_read_from_the_frames_of_an_index_without_it(
        tmp_path: Path) -> None:
    """Frames out of time order: a corpus capture whose first frame is moved an hour later (editcap, then
    mergecap -a keeping the order), so the latest arrival is frame 1's, not the last frame's."""
    source = PCAPS / "adrian_registration_reject.pcap"
    if not source.exists():
        pytest.skip(f"{source.name} is not in the corpus")
    shifted = tmp_path / "late_first.pcap"
    subprocess.run(["editcap", "-r", str(source), str(tmp_path / "first.pcap"), "1"], check=True, capture_output=True)
    subprocess.run(["editcap", "-t", "3600", str(tmp_path / "first.pcap"), str(tmp_path / "late.pcap")], check=True,
                   capture_output=True)
    subprocess.run(["editcap", str(source), str(tmp_path / "rest.pcap"), "1"], check=True, capture_output=True)
    subprocess.run(["mergecap", "-a", "-w", str(shifted), str(tmp_path / "late.pcap"), str(tmp_path / "rest.pcap")],
                   check=True, capture_output=True)
    epochs = [float(t) for t in oracle.tshark(shifted, "-T", "fields", "-e", "frame.time_epoch").split()]
    assert max(epochs) > epochs[-1]
    meta = build(shifted, tmp_path / "index", 0)
    assert meta["summary"]["latest_epoch"] == max(epochs)
    assert query.latest_epoch(tmp_path / "index", meta) == max(epochs)
    assert query.latest_epoch(tmp_path / "index", {}) == max(epochs)  # an index built before it was kept
