"""HTTP/2 (5G SBI) service response times (actors/pcap/answers/http2_srt.py, through stats.answer) run in-process on
what real sharkd answered for the corpus SBI captures with their MANIFEST decode-as rules
(tests/support/http2_sbi.py, recorded once and cached), compared with the same pairing computed from
`tshark -T fields` alone (HEADERS frames cut by http2.header.count, paired by tcp.stream + http2.streamid
with the next HEADERS from the other TCP port). The daemon path is tests/e2e/test_pcap_stats.py."""

from __future__ import annotations

import functools
import shutil
from dataclasses import replace
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import pytest

from diagd.actors.base import Request
from diagd.actors.pcap.answers import http2_srt, stats
from diagd.actors.pcap.engine.session import CaptureSession
from tests.pcaps import PCAPS, PCAPS_EXTRA
from tests.support import http2_sbi
from tests.support.sharkd_stats import Recorded, request_key

pytestmark = pytest.mark.skipif(shutil.which("sharkd") is None or shutil.which("tshark") is None,
                                reason="sharkd and tshark (wireshark-common, tshark) are not installed")

# The corpus captures carrying HTTP/2 HEADERS with their MANIFEST decode-as rule (7777, 8000) or none (8080,
# found from the connection preface): the unanswered requests, the HEADERS whose :method (request) or
# :status (response) HPACK lost, several HTTP/2 frames per TCP segment are all in these. Not
# adrian_n4_upf_timeout_sbi.pcap (nothing the others lack, and the biggest: the e2e test compares it).
SBI = ["adrian_sandbox_sbi.pcap", "adrian_sbi_nssf_reject_sbi.pcap",
       "ngtester_chain_free5gc_pathswitch_then_release_amf_ngap_nas_sbi.pcap",
       "ngtester_chain_oai_initue_then_release_amf_ngap_nas_sbi.pcap",
       "ngtester_initue_open5gs_amf_ngap_nas_sbi.pcap", "ngtester_open5gs_T04_ng_reset_amf_ngap_nas_sbi.pcap",
       "oaifed_steering_control_plane.pcap"]
# All frames; responses only (every one without its request); POST requests only (all unanswered); nothing.
FILTERS = ["", "http2.headers.status", 'http2.headers.method == "POST"', "frame.number > 100000"]
NO_HTTP2 = "adrian_sandbox_n2.pcap"  # NGAP only: the answer names the SBI hint
HINT = "(the capture's SBI hint)"
METHOD = ("computed: HEADERS with :method/:path paired with the next HEADERS from the other end on the same "
          "tcp.stream and http2.streamid (status '?': HPACK state lost), from sharkd's decode tree of each frame "
          "(Wireshark 4.0.17 has no HTTP/2 SRT tap); ids in paths as {id}")
REQUEST = cast(Request, object())


def path_of(name: str) -> Path:
    for folder in (PCAPS, PCAPS_EXTRA):
        if (folder / name).exists():
            return folder / name
    pytest.skip(f"real capture {name} not found in {PCAPS} or {PCAPS_EXTRA}")


class Sbi(Recorded):
    """Recorded sharkd answers; each call must hand the caller's request on (progress is reported to it),
    and a filtered `frames` must name its filter (the worker holding that filter's bitmap answers it)."""

    async def sharkd_call(self, request: object, method: str, params: dict[str, Any] | None = None, *,
                          display_filter: str | None = None) -> Any:
        assert request is REQUEST, (method, params)
        if method == "frames":
            assert display_filter == (params or {}).get("filter"), (params, display_filter)
        if method == "frame":  # the trees as recorded, not copied: http2_srt.py only reads them
            self.asked.append(request_key(method, params))
            return self.answers[request_key(method, params)]
        return await super().sharkd_call(request, method, params, display_filter=display_filter)

    async def sbi_hint(self) -> str:
        return HINT


@functools.cache
def recorded(name: str, decode_as: tuple[str, ...] | None) -> dict[str, Any]:
    return http2_sbi.record(path_of(name), FILTERS, None if decode_as is None else list(decode_as))


def capture(name: str, decode_as: list[str] | None = None) -> Sbi:
    return Sbi(recorded(name, None if decode_as is None else tuple(decode_as)))


async def ask(name: str, display_filter: str = "", decode_as: list[str] | None = None) -> dict[str, Any]:
    message = stats.resolve("srt", "http2", display_filter, None)
    return await stats.answer(cast(CaptureSession, capture(name, decode_as)), REQUEST, message)


def not_paired(row: dict[str, Any], display_filter: str = "") -> int:
    """How many of the row's requests are not paired; each says why (never 'unanswered')."""
    why = "no response among the frames display_filter keeps" if display_filter else "no response in the capture"
    assert "unanswered" not in row and set(row["not_paired"]) <= {why}, row
    return sum(row["not_paired"].values())


@pytest.mark.parametrize("display_filter", FILTERS)
async def test_http2_srt_matches_tshark_fields_pairing(display_filter: str) -> None:
    seen = {"rows": 0, "unanswered": 0, "no status": 0, "no method": 0, "orphans": 0, "fractional mean": 0}
    for name in SBI:
        sbi = capture(name)
        ours = await stats.answer(cast(CaptureSession, sbi), REQUEST, stats.resolve("srt", "http2", display_filter,
                                                                                    None))
        theirs = http2_sbi.tshark_srt(path_of(name), display_filter)
        # the filter checked first (an invalid one is refused as such), then the HEADERS frames, then their trees
        flt = http2_sbi.filter_for(display_filter)
        assert sbi.asked[:2] == [request_key("check", {"filter": flt}),
                                 request_key("frames", http2_sbi.frames_params(display_filter))], sbi.asked[:2]
        assert set(ours) == {"method", "rows", "requests", "responses", "responses_without_request",
                             *(["reason"] if not ours["rows"] else [])}, ours.keys()
        assert ours["method"] == METHOD
        got = {r["procedure"]: (r["count"], r.get("min_s"), r.get("max_s"), r.get("sum_s"),
                                not_paired(r, display_filter), r["statuses"]) for r in ours["rows"]}
        # seconds are the exact whole-ns times as floats (ns / 10**9 is the float nearest to them)
        expected = {p: (count, None if low is None else low / 10**9, None if high is None else high / 10**9,
                        total / 10**9 if count else None, unanswered, statuses)
                    for p, (count, low, high, total, unanswered, statuses) in theirs.rows.items()}
        assert got == expected, (name, display_filter)
        assert [r["procedure"] for r in ours["rows"]] == sorted(theirs.rows), name
        assert (ours["requests"], ours["responses"], ours["responses_without_request"]) == \
            (theirs.requests, theirs.responses, theirs.orphans), (name, display_filter)
        for row in ours["rows"]:
            count, _, _, total, unanswered, statuses = theirs.rows[row["procedure"]]
            assert list(row["statuses"]) == sorted(statuses), row
            if count:
                assert set(row) == {"procedure", "count", "min_s", "max_s", "avg_s", "sum_s", "not_paired",
                                    "statuses"}, row
                # the mean to the nearest whole ns (a mean exactly half-way may go either way)
                mean_ns = Fraction(total, count)
                if mean_ns - int(mean_ns) == Fraction(1, 2):
                    assert row["avg_s"] in (int(mean_ns) / 10**9, (int(mean_ns) + 1) / 10**9), row
                else:
                    assert row["avg_s"] == round(mean_ns) / 10**9, row
                seen["fractional mean"] += abs(mean_ns - round(mean_ns)) > Fraction(1, 10)
            else:
                assert set(row) == {"procedure", "count", "not_paired", "statuses"}, row
            seen["unanswered"] += unanswered
            seen["no status"] += statuses.get("?", 0)
            seen["no method"] += row["procedure"].startswith("? ")
            seen["rows"] += 1
        seen["orphans"] += ours["responses_without_request"]
        if ours["rows"]:
            assert "reason" not in ours
        elif display_filter == "frame.number > 100000":
            assert ours["reason"] == f"no frame matches display_filter {display_filter!r}"
    if display_filter == "":  # the corpus has each case the pairing must handle, and no orphan unfiltered
        assert all(v for k, v in seen.items() if k != "orphans") and not seen["orphans"], seen
    elif display_filter == "http2.headers.status":  # responses only: none has its request
        assert seen["orphans"] and not seen["rows"], seen
    elif display_filter.startswith("http2.headers.method"):  # requests only: all unanswered
        assert seen["rows"] and seen["unanswered"] >= seen["rows"] and not seen["orphans"], seen


async def test_headers_frames_are_tsharks_headers_frames() -> None:
    """Each frame's HEADERS frames read from sharkd's decode tree: stream ids and :method/:path/:status as
    tshark's header arrays give them, in order."""
    for name in SBI:
        theirs = http2_sbi.tshark_srt(path_of(name)).frames
        trees = {int(key.split('"frame": ')[1].split(",")[0]): value["tree"]
                 for key, value in recorded(name, None).items() if key.startswith('["frame"')}
        assert set(trees) >= set(theirs), name
        for number, expected in theirs.items():
            got = [(m.stream, m.pseudo) for m in http2_srt.headers_frames(trees[number])]
            assert got == expected, (name, number)


async def test_headers_frames_nested_deeper_are_found_in_order() -> None:
    """sharkd puts the HTTP/2 layers last at the top of a frame's tree; one inside another layer (a tunnel),
    with layers after it, is found as well, in tree order."""
    name = "oaifed_steering_control_plane.pcap"  # several HTTP/2 layers in some frames
    theirs = http2_sbi.tshark_srt(path_of(name)).frames
    answers = recorded(name, None)
    for number, expected in theirs.items():
        tree = answers[request_key("frame", {"frame": number, "proto": True})]["tree"]
        layers = [n for n in tree if n.get("f") == "http2"]
        others = [n for n in tree if n.get("f") != "http2"]
        wrapped = [*others[:2], {"l": "tunnel", "f": "tunnel", "n": [*others[2:], *layers]},
                   {"l": "after", "f": "data", "n": [{"l": "x", "f": "data.data == 00"}]}]
        got = [(m.stream, m.pseudo) for m in http2_srt.headers_frames(wrapped)]
        assert got == expected, (name, number)


def _without(nodes: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [{**n, "n": _without(n["n"], prefix)} if "n" in n else n for n in nodes
            if not str(n.get("f", "")).startswith(prefix)]


def _has(nodes: list[dict[str, Any]], prefix: str) -> bool:
    return any(str(n.get("f", "")).startswith(prefix) or _has(n.get("n", []), prefix) for n in nodes)


async def test_a_request_whose_path_hpack_lost_is_named_by_its_method() -> None:
    """HPACK state lost for :path but not :method (a connection opened before the capture): still a request,
    its path `?`. Made from real trees by taking the :path item out of every HEADERS frame with a :method
    (the tshark side: the same HEADERS frames less :path, paired as documented)."""
    for name in ("ngtester_initue_open5gs_amf_ngap_nas_sbi.pcap", "oaifed_steering_control_plane.pcap"):
        answers = dict(recorded(name, None))
        for key, value in list(answers.items()):
            if key.startswith('["frame"'):
                tree = [{**layer, "n": [{**frame_, "n": _without(frame_["n"], "http2.headers.path ==")}
                                        if _has(frame_.get("n", []), "http2.headers.method ==") else frame_
                                        for frame_ in layer.get("n", [])]} if layer.get("f") == "http2" else layer
                        for layer in value["tree"]]
                answers[key] = {**value, "tree": tree}
        ours = await stats.answer(cast(CaptureSession, Sbi(answers)), REQUEST, stats.resolve("srt", "http2", "", None))
        headers = [replace(h, pseudo={k: v for k, v in h.pseudo.items() if k != "path" or "method" not in h.pseudo})
                   for h in http2_sbi.tshark_headers(path_of(name))]
        theirs = http2_sbi.pair(headers)
        assert any(p.endswith(" ?") for p in theirs.rows), name
        got = {r["procedure"]: (r["count"], not_paired(r), r["statuses"]) for r in ours["rows"]}
        assert got == {p: (c, u, st) for p, (c, _, _, _, u, st) in theirs.rows.items()}, name
        assert (ours["requests"], ours["responses"]) == (theirs.requests, theirs.responses), name


async def test_answers_without_http2_say_why() -> None:
    ours = await ask(NO_HTTP2)
    assert ours["rows"] == [] and ours["reason"] == f"protocol http2 is not in this capture; {HINT}"
    assert (ours["requests"], ours["responses"], ours["responses_without_request"]) == (0, 0, 0)
    # SBI on tcp/7777 without its decode-as rule: no HTTP/2 for tshark either
    ours = await ask("adrian_sandbox_sbi.pcap", decode_as=[])
    assert ours["rows"] == [] and ours["reason"] == f"protocol http2 is not in this capture; {HINT}"


@pytest.mark.parametrize("text", ["0.000266000", "12", "3.5", " 7.25\n", ".5", "0", "-0.5", "-1.000000001",
                                  "-2", "1.1234567891", "-0.0000000019", "1783702306.917345000"])
def test_nanoseconds_truncate_toward_zero(text: str) -> None:
    """A relative time (seconds) in whole ns: the decimal value times 10^9, cut toward zero."""
    assert http2_srt.nanoseconds(text) == int(Decimal(text.strip()) * 10**9)
