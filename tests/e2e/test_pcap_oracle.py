"""The packet-level pcap answers compared field by field with tests/support/pcap_oracle.py (tshark,
capinfos and `tshark -G` run here, never diagd's code), on every capture of both corpora, through
one real daemon, shim and MCP client: pcap_frames_by_filter, pcap_packet_list, pcap_frame_detail,
pcap_info, pcap_list_fields and pcap_fields_search."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_pcap import make_env
from tests.e2e.test_pcap_differential import Call, session
from tests.pcaps import PCAPS, PCAPS_EXTRA, corpus
from tests.support import pcap_oracle as oracle

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]

FILTERS_PER_CAPTURE = 6
PAGE = 5000


def captures() -> list[Path]:
    found = corpus()
    if not found:
        pytest.skip(f"no real captures in {PCAPS} or {PCAPS_EXTRA} (set DIAGD_TEST_PCAPS to the folder of "
                    "shared/pcaps)")
    return found


def spread(items: list[Any], most: int) -> list[Any]:
    """At most `most` items, evenly spaced, always the first and the last: a deterministic sample."""
    if len(items) <= most:
        return list(items)
    return [items[round(i * (len(items) - 1) / (most - 1))] for i in range(most)]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("pcaporacle")
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}", "{PCAPS_EXTRA}", "{root}"]\ncall_timeout_s = 300\n'
                         "[pcap]\nmax_loaded = 2\nmax_exports = 100\n")
    started = start_daemon(env)
    yield started
    started.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


async def ask(call: Call, tool: str, path: Path, **args: Any) -> dict[str, Any]:
    answer = await call(tool, pcap_path=str(path), decode_as=oracle.decode_as(path), **args)
    assert not answer["_is_error"], (path.name, tool, args, answer)
    return answer


# -- pcap_frames_by_filter: frame sets and rows == -Y filter / _ws.col.*


def row_of(cells: list[str]) -> dict[str, Any]:
    """A frames_by_filter row as tshark's columns give it; Info without the blanks tshark leaves at
    its ends (diagd strips them: "INIT " is "INIT")."""
    number, time, src, dst, protocol, length, info = cells
    return {"number": int(number), "time_relative": float(time), "src": src, "dst": dst, "protocol": protocol,
            "length": int(length), "info": info.strip()}


async def check_frames_by_filter(call: Call, path: Path) -> int:
    """Every page of each sampled filter: the frame set and every row; returns the filters checked."""
    table = oracle.columns(path)
    filters = spread(oracle.layers(path), FILTERS_PER_CAPTURE)
    for flt in filters:
        expected = oracle.matching(path, flt)
        got: list[dict[str, Any]] = []
        while True:
            answer = await ask(call, "pcap_frames_by_filter", path, display_filter=flt, limit=PAGE, offset=len(got))
            if not answer["total_exact"]:  # a fresh capture's provisional first page: the exact one follows
                continue
            assert answer["total"] == len(expected), (path.name, flt)
            got += answer["frames"]
            if not answer["has_more"]:
                break
        assert [f["number"] for f in got] == expected, (path.name, flt)
        for frame in got:
            assert frame == row_of(table[frame["number"]]), (path.name, flt)
    return len(filters)


# -- pcap_packet_list: the TSV == -T fields -e _ws.col.<title>


async def check_packet_list(call: Call, path: Path) -> None:
    table = oracle.columns(path)
    flt = oracle.layers(path)[-1]
    for display_filter, numbers in (("", sorted(table)), (flt, oracle.matching(path, flt))):
        answer = await ask(call, "pcap_packet_list", path, display_filter=display_filter, preview_rows=3)
        lines = Path(answer["output_path"]).read_text(encoding="utf-8").split("\n")
        assert lines[0].split("\t") == list(oracle.COLUMN_TITLES) == answer["columns"]
        assert lines[-1] == "" and answer["rows_written"] == len(numbers) == len(lines) - 2, path.name
        expected = [[cell.strip() for cell in table[n]] for n in numbers]
        assert [line.split("\t") for line in lines[1:-1]] == expected, (path.name, display_filter)
        assert answer["preview_rows"] == [dict(zip(oracle.COLUMN_TITLES, r, strict=True)) for r in expected[:3]]


# -- pcap_frame_detail: the tree == tshark -V


# A request's "[Response In: N]" (PFCP, GTPv2, ...) depends on which frames a pass has dissected, in
# tshark itself: on adrian_n4_upf_timeout_n4.pcap frame 1 says "Response In: 3" in `tshark -2 -V`, nothing
# in `tshark -2 -V -Y "frame.number in {1,4}"`, and sharkd says 4 or nothing by when the tree was made.
# So these link lines are compared nowhere here (the frames' other lines are, every one of them).
_LINK = re.compile(r"\s*\[(Response|Request) In: \d+\]")


def unlinked(text: str) -> str:
    return "\n".join(line for line in text.split("\n") if not _LINK.fullmatch(line))


async def check_frame_detail(call: Call, path: Path) -> None:
    numbers = oracle.matching(path, "")
    sample = sorted({numbers[0], numbers[len(numbers) // 2], numbers[-1]})
    for frames, verbosity in ((sample, "summary"), ([numbers[len(numbers) // 2]], "full")):
        expected = oracle.detail(path, frames, hex_dump=verbosity == "full")
        answer = await ask(call, "pcap_frame_detail", path, frame_numbers=frames, verbosity=verbosity,
                           max_bytes=2 * 1024 * 1024)
        assert not answer["truncated"]
        assert [f["frame_number"] for f in answer["frames"]] == frames == sorted(expected)
        for frame in answer["frames"]:
            assert unlinked(frame["text"]) == unlinked(expected[frame["frame_number"]]), (path.name,
                                                                                         frame["frame_number"])


# -- pcap_info: count/time span == capinfos, protocols == frame.protocols, conversations == -z conv


def expected_conversations(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every SCTP, TCP, UDP and IPv4 conversation tshark lists, in pcap_info's order (that protocol
    order, then most frames first)."""
    rows = [(proto, row) for proto, tap in (("SCTP", "sctp"), ("TCP", "tcp"), ("UDP", "udp"), ("IPv4", "ip"))
            for row in oracle.conversations(path, tap)]
    return sorted(rows, key=lambda pr: (("SCTP", "TCP", "UDP", "IPv4").index(pr[0]), -pr[1]["frames"]))


async def check_info(call: Call, path: Path) -> None:
    await ask(call, "pcap_stats", path, kind="expert")  # a tap: returns once sharkd has loaded it
    info = await ask(call, "pcap_info", path)
    assert info["served_by"] == "sharkd", path.name
    ref = oracle.capinfos(path)
    assert info["packet_count"] == int(ref["Number of packets"]), path.name
    assert info["time_start"] == ref["Start time"].replace(" ", "T") + "Z", path.name
    assert info["time_end"] == ref["End time"].replace(" ", "T") + "Z", path.name
    assert info["duration_s_text"] == ref["Capture duration (seconds)"], path.name
    assert info["sha256"] == ref["SHA256"] and info["file_type"] == ref["File type"], path.name
    assert info["file_encapsulation"] == ref["File encapsulation"], path.name
    # Every layer of frame.protocols and nothing else, but for what sharkd's `analyse` differs
    # in: it adds "frame" (every frame), and "pkcs-1" (X.509 inside HTTP/TLS) comes and goes
    # (listed by sharkd on 5greplay_oai.pcap where `tshark -2 -Y pkcs-1` matches nothing; a
    # layer of tshark -2 on oaifed_cotsue_core.pcap that sharkd lists on one load, not another).
    protocols = set(info["protocols"])
    assert protocols - {"pkcs-1"} == {*oracle.layers(path), "frame"} - {"pkcs-1"}, path.name
    assert {p: p in oracle.layers(path) for p in info["has_protocols"]} == info["has_protocols"], path.name
    expected = expected_conversations(path)
    top = info["top_conversations"]
    assert len(top) == min(10, len(expected)), path.name
    # Ties in frame count may come in either order: each listed one is tshark's, and the
    # counts are the top ten's.
    assert [c["frames"] for c in top] == [row["frames"] for _, row in expected[:10]], path.name
    for conv in top:
        same = [row for proto, row in expected if proto == conv["proto"] and {row["a"], row["b"]} ==
                {conv["a"], conv["b"]} and row["frames"] == conv["frames"]]
        assert any(oracle.same_size(conv["bytes"], row["bytes"]) for row in same), (path.name, conv)


# -- pcap_list_fields / pcap_fields_search == tshark -G fields, filtered here

LIST_QUERIES: list[dict[str, Any]] = [
    {"query": "cause", "include_protocols": ["ngap", "nas-5gs"]},
    {"query": "TEID"},
    {"query": "TEID", "case_sensitive": True},
    {"query": r"^pfcp\.(seid|cause)", "is_regex": True},
    {"query": r"response.?in$", "is_regex": True, "include_protocols": ["pfcp", "gtpv2", "diameter"]},
    {"query": "5gmm", "include_protocols": ["nas-5gs"]},
    {"query": "", "include_protocols": ["sctp"]},
    {"query": "no such field anywhere"},
]
SEARCH_QUERIES: list[dict[str, Any]] = [
    {"prefix": "ngap.", "keyword": "cause"},
    {"prefix": "nas_5gs.mm.", "keyword": ""},
    {"prefix": "pfcp.", "keyword": "SEID"},
    {"prefix": "sctp.assoc"},
    {"prefix": "http2.headers.", "keyword": "Path"},
    {"prefix": "zzz.nothing."},
]


def listed(query: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """pcap_list_fields' matches: name or description holds the query (a regex with is_regex;
    case-insensitive unless case_sensitive), of the protocols asked for, in catalogue order."""
    text = query["query"] if query.get("is_regex") else re.escape(query["query"])
    pattern = re.compile(text, 0 if query.get("case_sensitive") else re.IGNORECASE)
    protocols = set(query.get("include_protocols", []))
    return [row for row in oracle.field_catalogue()
            if (not protocols or row[3] in protocols) and (pattern.search(row[0]) or pattern.search(row[1]))]


def searched(query: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """pcap_fields_search's matches: the name starts with the prefix, and name or description holds
    the keyword in any case, in catalogue order."""
    keyword = query.get("keyword", "").lower()
    return [row for row in oracle.field_catalogue() if row[0].startswith(query["prefix"])
            and (keyword in row[0].lower() or keyword in row[1].lower())]


async def test_field_lists_equal_tshark_glossary(daemon: DaemonProcess) -> None:
    async with session(daemon) as call:
        for query in LIST_QUERIES:
            answer = await call("pcap_list_fields", limit=2000, **query)
            expected = listed(query)
            assert answer["total"] == len(expected) and answer["truncated"] == (len(expected) > 2000), query
            assert [(f["name"], f["description"], f["type"], f["protocol"]) for f in answer["fields"]] == \
                expected[:2000], query
        for query in SEARCH_QUERIES:
            answer = await call("pcap_fields_search", limit=2000, **query)
            expected = searched(query)
            assert answer["total"] == len(expected) and answer["truncated"] == (len(expected) > 2000), query
            assert [(f["name"], f["description"], f["type"]) for f in answer["fields"]] == \
                [row[:3] for row in expected[:2000]], query
    assert all(listed(q) for q in LIST_QUERIES[:-1]) and all(searched(q) for q in SEARCH_QUERIES[:-1])


# -- pcap_stats endpoints (TCP was compared nowhere; the others only on the first corpus)


async def check_endpoints(call: Call, path: Path) -> int:
    rows = 0
    for protocol in ("tcp", "ip", "udp", "sctp"):
        answer = await ask(call, "pcap_stats", path, kind="endpoints", protocol=protocol, limit=5000)
        assert not answer["has_more"], (path.name, protocol)
        got = {r["address"]: [r["frames"], r["bytes"], r["tx_frames"], r["tx_bytes"], r["rx_frames"],
                              r["rx_bytes"]] for r in answer["rows"]}
        assert got == oracle.endpoints(path, protocol), (path.name, protocol)
        rows += len(got)
    return rows


# -- every capture once: loaded once, every packet-level answer compared


@pytest.mark.parametrize("path", corpus() or [PCAPS / "(no corpus)"], ids=lambda p: p.name)
async def test_every_packet_answer_equals_the_tools_on_this_capture(daemon: DaemonProcess, path: Path) -> None:
    """One capture at a time (loaded once, not once per answer): frames by filter, the packet list,
    frame detail, pcap_info and the endpoints of TCP, IP, UDP and SCTP, each against tshark/capinfos."""
    if not path.exists():
        captures()  # skips, saying where the corpus was looked for
    async with session(daemon) as call:
        filters = await check_frames_by_filter(call, path)
        await check_packet_list(call, path)
        await check_frame_detail(call, path)
        await check_info(call, path)
        await check_endpoints(call, path)
    assert filters >= min(FILTERS_PER_CAPTURE, len(oracle.layers(path)))
