"""pcap_stats (actors/pcap/stats.py) on captures no corpus file is: a response whose request was cut out
(editcap), an empty capture; and the refusals' hints. Run in-process on what real sharkd answered
(tests/support/sharkd_stats.py), compared with tshark (tests/support/stats_oracle.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, cast

import pytest

from diagd.actors.pcap import stats
from diagd.actors.pcap.session import CaptureSession
from diagd.protocol.errors import DiagdError
from tests.actors.pcap.test_stats_io_boundaries import REQUEST, Strict
from tests.pcaps import PCAPS
from tests.support import stats_oracle as oracle
from tests.support.io_captures import build, without_frames
from tests.support.sharkd_stats import record

pytestmark = pytest.mark.skipif(shutil.which("sharkd") is None or shutil.which("tshark") is None,
                                reason="sharkd and tshark (wireshark-common, tshark) are not installed")

LINKED_COLUMNS = {"gtpv2": ("gtpv2.message_type", "gtpv2.response_to", "gtpv2.response_time"),
                  "pfcp": ("pfcp.msg_type", "pfcp.response_to", "pfcp.response_time")}
# A request deleted, its response kept: Wireshark links that response to nothing (no response_to).
CUT = [("adrian_n4_upf_timeout_n4.pcap", "pfcp", [2]), ("magma_inbound_roaming_01.pcapng", "gtpv2", [39])]


def corpus(name: str) -> Path:
    path = PCAPS / name
    if not path.exists():
        pytest.skip(f"real capture {name} not found in {PCAPS}")
    return path


def linked_requests(protocol: str) -> list[tuple[str, dict[str, Any] | None]]:
    params: dict[str, Any] = {f"column{i}": f"{c}:0" for i, c in
                              enumerate(("frame.number", *LINKED_COLUMNS[protocol]))}
    return [("analyse", None), ("check", {"filter": protocol}), ("frames", {**params, "filter": protocol})]


@pytest.mark.parametrize(("name", "protocol", "cut"), CUT)
async def test_a_response_whose_request_was_cut_is_no_request(name: str, protocol: str, cut: list[int]) -> None:
    path = without_frames(corpus(name), cut)
    ours = await stats.answer(cast(CaptureSession, Strict(record(path, linked_requests(protocol)))), REQUEST,
                              stats.resolve("srt", protocol, "", None))
    lines = oracle.linked_fields(path, protocol)
    unlinked = [line for line in lines.splitlines()
                if line.split("\t")[4].split(",")[0].strip().endswith(" Response") and not line.split("\t")[2]]
    assert unlinked, "the cut left no response without its request"
    theirs = oracle.linked_srt(lines, protocol)
    expected = {}
    for procedure in set(theirs.times) | set(theirs.unanswered):
        values = theirs.times.get(procedure, [])
        row: dict[str, Any] = {"procedure": procedure, "count": len(values)}
        if values:
            row.update(min_s=round(min(values), 9), max_s=round(max(values), 9),
                       avg_s=round(sum(values) / len(values), 9), sum_s=round(sum(values), 9))
        row["unanswered"] = theirs.unanswered[procedure]
        expected[procedure] = row
    assert {r["procedure"]: r for r in ours["rows"]} == expected
    assert (ours["requests"], ours["responses"]) == (theirs.requests, theirs.responses)


async def test_an_empty_capture_has_no_interval() -> None:
    path = build("empty", corpus("adrian_sandbox_n2.pcap"), [])
    asked: list[tuple[str, dict[str, Any] | None]] = [
        ("analyse", None), ("frames", {"column0": "frame.time_relative:0", "column1": "frame.len:0"}),
        ("check", {"filter": "udp"}), ("frames", {"column0": "frame.number:0", "filter": "udp"})]
    answers = record(path, asked)
    assert answers['["analyse", {}]']["frames"] == 0
    ours = await stats.answer(cast(CaptureSession, Strict(answers)), REQUEST, stats.resolve("io", None, "", None))
    assert ours == {"method": "sharkd frames (frame.time_relative, frame.len) binned as tshark's io,stat",
                    "interval_ms": 1000, "rows": [], "frames": 0, "bytes": 0, "reason": "the capture holds no frames"}
    ours = await stats.answer(cast(CaptureSession, Strict(answers)), REQUEST, stats.resolve("io", None, "udp", 100))
    assert ours["rows"] == [] and ours["reason"] == "no frame matches display_filter 'udp'"


def test_refusals_suggest_what_was_meant() -> None:
    """'h2' is HTTP/2's usual short name: it is suggested; no protocol at all suggests nothing (keyed by what
    was given)."""
    with pytest.raises(DiagdError) as err:
        stats.resolve("srt", "h2", "", None)
    assert err.value.details["did_you_mean"] == {"h2": ["http2"]}
    with pytest.raises(DiagdError) as err:
        stats.resolve("srt", None, "", None)
    assert err.value.details["did_you_mean"] == {"": []}
