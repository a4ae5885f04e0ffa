"""pcap_stats' I/O intervals (actors/pcap/answers/stats.py `_io`) where tshark's io,stat tap decides the bin: frames on
interval boundaries, within the half microsecond the tap rounds relative times to, out of time order (counted
in the tap's current interval), before the first frame (negative relative times), with and without a filter.
The captures are real frames re-timed (tests/support/io_captures.py); stats.py runs in-process on what real
sharkd answered for them (tests/support/sharkd_stats.py) and is compared with `tshark -q -z io,stat`.

Also: every sharkd call any kind of answer makes hands the caller's request on (load progress is reported to
it) and a filtered `frames` names its filter (the worker holding that filter's bitmap answers it)."""

from __future__ import annotations

import shutil
from decimal import ROUND_DOWN, Decimal
from pathlib import Path
from typing import Any, cast

import pytest

from diagd.actors.base import Request
from diagd.actors.pcap.answers import stats
from diagd.actors.pcap.engine.session import CaptureSession
from diagd.actors.pcap.index import filters, query
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.pcaps import PCAPS
from tests.support import stats_oracle as oracle
from tests.support.index_builds import build as build_index
from tests.support.io_captures import build
from tests.support.sharkd_stats import Recorded, record, request_key

pytestmark = pytest.mark.skipif(shutil.which("sharkd") is None or shutil.which("tshark") is None,
                                reason="sharkd and tshark (wireshark-common, tshark) are not installed")

SOURCE = "adrian_sandbox_n2.pcap"  # Ethernet frames of several sizes
MS = 1_000_000  # ns
RECIPES = {
    # on and around boundaries of 100 ms, 250 ms and 1 s; the tap rounds to whole us: +500 ns rounds up
    "boundaries": [0, 100 * MS - 501, 100 * MS - 500, 100 * MS, 200 * MS - 1, 200 * MS, 200 * MS + 499,
                   250 * MS - 500, 350 * MS, 1000 * MS - 500, 1000 * MS, 2500 * MS, 2500 * MS + 1],
    # earlier than the interval the tap is in: counted there, never in an earlier one
    "out-of-order": [0, 300 * MS, 150 * MS, 300 * MS - 1, 450 * MS, 100 * MS, 1200 * MS, 1200 * MS - 1000,
                     50 * MS, 1250 * MS],
    # before the first frame: negative relative times (a half us either way of zero, -1 us, whole seconds)
    "before-first": [0, -600, -1500, -250 * MS, 50 * MS, 100 * MS - 501, 100 * MS - 500, 120 * MS, -1300 * MS,
                     350 * MS, 150 * MS, -2 * 1000 * MS - 499],
}
IO = [(100, ""), (250, ""), (1000, ""), (50, "frame.number >= 3"), (100, "frame.len > 100"),
      (100, "frame.number != 2 && frame.number != 7")]
REQUEST = cast(Request, object())


class Strict(Recorded):
    """Recorded sharkd answers; each call must hand the caller's request on, and a filtered `frames` must name
    its filter as the call's display_filter, after a `check` of it."""

    async def sharkd_call(self, request: object, method: str, params: dict[str, Any] | None = None, *,
                          display_filter: str | None = None) -> Any:
        assert request is REQUEST, (method, params)
        if method == "frames" and not self.in_matching:  # (the stand-in's own `matching` names no filter)
            assert display_filter == (params or {}).get("filter"), (params, display_filter)
        if method == "frames" and (params or {}).get("filter"):  # checked first: an invalid one is refused as such
            assert request_key("check", {"filter": (params or {})["filter"]}) in self.asked, params
        return await super().sharkd_call(request, method, params, display_filter=display_filter)

    async def check_filter(self, request: object, display_filter: str) -> None:
        assert request is REQUEST
        await super().check_filter(request, display_filter)

    in_matching = False

    async def matching(self, request: object, display_filter: str) -> list[int]:
        assert request is REQUEST
        self.in_matching = True
        try:
            return await super().matching(request, display_filter)
        finally:
            self.in_matching = False

    async def analysed(self, request: object) -> dict[str, Any]:
        assert request is REQUEST
        return await super().analysed(request)


def io_requests() -> list[tuple[str, dict[str, Any] | None]]:
    asked: list[tuple[str, dict[str, Any] | None]] = [
        ("frames", {"column0": "frame.time_relative:0", "column1": "frame.len:0"})]
    for _, flt in IO:
        if flt:
            asked += [("check", {"filter": flt}), ("frames", {"column0": "frame.number:0", "filter": flt})]
    return asked


def built(name: str) -> Path:
    source = PCAPS / SOURCE
    if not source.exists():
        pytest.skip(f"real capture {SOURCE} not found in {PCAPS}")
    return build(name, source, RECIPES[name])


@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize(("interval_ms", "display_filter"), IO)
async def test_io_on_boundaries_matches_tshark(name: str, interval_ms: int, display_filter: str) -> None:
    path = built(name)
    capture = Strict(record(path, io_requests()))
    message = stats.resolve("io", None, display_filter, interval_ms)
    ours = await stats.answer(cast(CaptureSession, capture), REQUEST, message)
    theirs, total = oracle.io_every_interval(path, interval_ms, display_filter)
    assert [(r["frames"], r["bytes"]) for r in ours["rows"]] == [(f, b) for _, f, b in theirs], (name, ours["rows"])
    # tshark shortens the interval to the capture's duration when it is longer (one row, starting at 0)
    assert [r["start_s"] for r in ours["rows"]] == [s for s, _, _ in theirs], name
    assert [r["start_s"] for r in ours["rows"]] == [n * interval_ms / 1000 for n in range(len(ours["rows"]))]
    assert [r["interval"] for r in ours["rows"]] == list(range(len(theirs)))
    assert (ours["frames"], ours["bytes"]) == total, name
    assert ours["interval_ms"] == interval_ms
    assert set(ours) == {"method", "interval_ms", "rows", "frames", "bytes"}, ours.keys()


@pytest.mark.parametrize("chunked", [False, True], ids=["one-pass", "chunked"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_io_from_the_index_matches_tshark(name: str, chunked: bool, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The same intervals from the capture's index (query.io_page), read a few frames at a time (the tap's
    current interval carried from block to block), whole and page by page; in one pass and in chunks (a
    frame's time and length are its own: exact either way, and these filters read only per-frame columns)."""
    path = built(name)
    meta = build_index(path, tmp_path, path.stat().st_size // 4 if chunked else 0)
    assert (meta["chunks"] is not None and len(meta["chunks"]) > 1) == chunked, meta["chunks"]
    monkeypatch.setattr(query, "BLOCK", 3)
    for interval_ms, display_filter in IO:
        theirs, total = oracle.io_every_interval(path, interval_ms, display_filter)
        where = filters.to_sql(display_filter)
        assert where is not None
        whole = query.io_page(tmp_path, where, interval_ms, 0, len(theirs) + 5)
        assert [(r["start_s"], r["frames"], r["bytes"]) for r in whole.rows] == theirs, (name, interval_ms)
        assert [r["interval"] for r in whole.rows] == list(range(len(theirs)))
        assert (whole.intervals, whole.frames, whole.bytes) == (len(theirs), *total)
        paged = [row for offset in range(0, len(theirs) + 2, 2) for row in
                 query.io_page(tmp_path, where, interval_ms, offset, 2).rows]
        assert paged == whole.rows, (name, interval_ms, display_filter)


async def test_more_intervals_than_one_answer_holds_is_refused_with_an_interval_that_fits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats, "MAX_INTERVALS", 1000)
    capture = Strict(record(built("boundaries"), io_requests()))  # 2.5 s of frames: 2,501 intervals of 1 ms
    with pytest.raises(DiagdError) as refused:
        await stats.answer(cast(CaptureSession, capture), REQUEST, stats.resolve("io", None, "", 1))
    assert refused.value.code == ErrorCode.OUTPUT_TOO_LARGE and refused.value.details["intervals"] == 2501
    assert refused.value.details["hint"].startswith("interval_ms of at least 3, or pcap_index the capture")
    fits = await stats.answer(cast(CaptureSession, capture), REQUEST, stats.resolve("io", None, "", 3))
    assert len(fits["rows"]) <= 1000


def tap_us(text: str) -> int:
    """tap-iostat.c: rel_ts.secs * 10^6 + (rel_ts.nsecs + 500) / 1000, where an nstime keeps both parts with the
    time's sign and C's integer division truncates toward zero."""
    value = Decimal(text.strip())
    secs = int(value.to_integral_value(rounding=ROUND_DOWN))
    nsecs = int((value - secs) * 10**9)
    rounded = nsecs + 500
    return secs * 10**6 + (abs(rounded) // 1000) * (1 if rounded >= 0 else -1)


@pytest.mark.parametrize("text", ["0.000000000", "0.099999499", "0.099999500", "0.0999995", "0.1", "12",
                                  "1.999999499", "1.999999500", "-0.000000600", "-0.000000500", "-0.000001500",
                                  "-0.000001501", "-0.25", "-1.300000000", "-2.000000499", "-2.000000501",
                                  " 3.5 ", ".000002", "-1.000000000", "-2.000000001", "-1"])
def test_relative_time_to_microseconds_as_the_tap_computes_it(text: str) -> None:
    assert stats._microseconds(text) == tap_us(text)
    assert stats._nanoseconds(text) == int(Decimal(text.strip()) * 10**9)  # whole ns, cut toward zero


# -- every sharkd call hands the request on; filtered frames name their filter

CORPUS = ["magma_gx_gy_combined_03.pcapng", "adrian_n4_upf_timeout_n4.pcap", "heplify_sip_ipv4_tcp.pcap"]
SRT_FILTERS = {"gtpv2": "gtpv2.response_to", "pfcp": "pfcp.response_to", "sip": "sip.Status-Code",
               "http": "http.response"}
# What the paired response times read (actors/pcap/answers/pairing.py; test_stats_pairing.py checks what they make).
PAIRED_COMMON = ("frame.time_relative:0", "frame.time_epoch:0", "ip.src:-1", "ip.dst:-1", "ipv6.src:-1",
                 "ipv6.dst:-1", "udp.srcport:-1", "udp.dstport:-1", "tcp.srcport:-1", "tcp.dstport:-1",
                 "icmp.type:1", "icmp.code:1", "icmpv6.type:1", "icmpv6.code:1")
PAIRED = {"gtpv2": ("gtpv2", ("gtpv2.message_type:0", "gtpv2.seq:0")),
          "pfcp": ("pfcp", ("pfcp.msg_type:0", "pfcp.seqno:0")),
          "sip": ("sip", ("sip.Method:0", "sip.Status-Code:0", "sip.Call-ID:0", "sip.CSeq.seq:0",
                          "sip.CSeq.method:0")),
          "http": ("http.request || http.response", ("http.request.method:0", "http.request.uri:0",
                                                    "http.response.code:0", "tcp.stream:-1"))}


def corpus_requests() -> list[tuple[str, dict[str, Any] | None]]:
    asked: list[tuple[str, dict[str, Any] | None]] = [
        ("analyse", None), ("tap", {"tap0": "expert"}), ("tap", {"tap0": "srt:diameter"}),
        ("tap", {"tap0": "conv:UDP"}), ("tap", {"tap0": "endpt:TCP"}),
        ("frames", {"column0": "frame.time_relative:0", "column1": "frame.len:0"}),
        ("check", {"filter": "udp"}), ("frames", {"column0": "frame.number:0", "filter": "udp"})]
    for protocol, (base, columns) in PAIRED.items():
        for display_filter in ("", SRT_FILTERS[protocol]):
            flt = f"({base}) && ({display_filter})" if display_filter else base
            params: dict[str, Any] = {f"column{i}": c for i, c in enumerate((*PAIRED_COMMON, *columns))}
            asked += [("check", {"filter": flt}), ("frames", {**params, "filter": flt})]
    return asked


@pytest.mark.parametrize("name", CORPUS)
async def test_every_sharkd_call_hands_the_request_on(name: str) -> None:
    path = PCAPS / name
    if not path.exists():
        pytest.skip(f"real capture {name} not found in {PCAPS}")
    answers = record(path, corpus_requests())
    questions = [("expert", None, ""), ("srt", "diameter", ""), ("conversations", "udp", ""),
                 ("endpoints", "tcp", ""), ("io", None, ""), ("io", None, "udp"),
                 *(("srt", p, "") for p in PAIRED), *(("srt", p, f) for p, f in SRT_FILTERS.items())]
    for kind, protocol, display_filter in questions:
        capture = Strict(answers)
        ours = await stats.answer(cast(CaptureSession, capture), REQUEST,
                                  stats.resolve(kind, protocol, display_filter, None))
        assert "rows" in ours and capture.asked, (kind, protocol)
