"""pcap_stats (actors/pcap/answers/stats.py) on captures no corpus file is: a response whose request was cut out
(editcap), an empty capture; and the refusals' hints. Run in-process on what real sharkd answered
(tests/support/sharkd_stats.py), the paired response times compared with tshark (tests/support/srt_pairs.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, cast

import pytest

from diagd.actors.pcap.answers import stats
from diagd.actors.pcap.engine.session import CaptureSession
from diagd.protocol.errors import DiagdError
from tests.actors.pcap.test_stats_io_boundaries import REQUEST, Strict
from tests.pcaps import PCAPS
from tests.support import srt_pairs
from tests.support.io_captures import build, without_frames
from tests.support.sharkd_stats import record

pytestmark = pytest.mark.skipif(shutil.which("sharkd") is None or shutil.which("tshark") is None,
                                reason="sharkd and tshark (wireshark-common, tshark) are not installed")

# What pairing.py reads for these two (written out here): the frame's times, innermost addresses and
# ports, the outer ICMP error, and each message's type and sequence number.
COMMON = ["frame.time_relative:0", "frame.time_epoch:0", "ip.src:-1", "ip.dst:-1", "ipv6.src:-1", "ipv6.dst:-1",
          "udp.srcport:-1", "udp.dstport:-1", "tcp.srcport:-1", "tcp.dstport:-1", "icmp.type:1", "icmp.code:1",
          "icmpv6.type:1", "icmpv6.code:1"]
SEQUENCED = {"gtpv2": ["gtpv2.message_type:0", "gtpv2.seq:0"], "pfcp": ["pfcp.msg_type:0", "pfcp.seqno:0"]}
# A request deleted, its response kept: a response without request, never a request of its own.
CUT = [("adrian_n4_upf_timeout_n4.pcap", "pfcp", [2], {"PFCP Heartbeat Response": 1}),
       ("magma_inbound_roaming_01.pcapng", "gtpv2", [39], {"Create Session Response": 1})]


def corpus(name: str) -> Path:
    path = PCAPS / name
    if not path.exists():
        pytest.skip(f"real capture {name} not found in {PCAPS}")
    return path


def paired_requests(protocol: str) -> list[tuple[str, dict[str, Any] | None]]:
    params: dict[str, Any] = {f"column{i}": c for i, c in enumerate(COMMON + SEQUENCED[protocol])}
    return [("analyse", None), ("check", {"filter": protocol}), ("frames", {**params, "filter": protocol})]


@pytest.mark.parametrize(("name", "protocol", "cut", "orphans"), CUT)
async def test_a_response_whose_request_was_cut_is_no_request(name: str, protocol: str, cut: list[int],
                                                              orphans: dict[str, int]) -> None:
    path = without_frames(corpus(name), cut)
    ours = await stats.answer(cast(CaptureSession, Strict(record(path, paired_requests(protocol)))), REQUEST,
                              stats.resolve("srt", protocol, "", None))
    theirs = srt_pairs.pairing(path, protocol).answer
    assert {k: v for k, v in ours.items() if k != "method"} == theirs
    assert ours["responses_without_request"] == orphans


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
