"""A capture's persistent index (pcap_index, actors/pcap/index/) against tshark, on every corpus capture.

Built through the real daemon (its build a real tshark pass in a child process); then every page of
the whole capture comes from it (`served_by: index`) and each row must equal tshark's own columns
(tests/support/pcap_oracle.py, two-pass, never importing diagd), the frame count capinfos', the
protocols tshark's frame.protocols in order of first appearance, the first and last arrival
tshark's frame.time_epoch. The Parquet file is read with DuckDB directly, as any user would, and a
second daemon on the same state directory finds the index instead of building it again.
"""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from diagd.actors.pcap.index.build import PARTIAL
from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_pcap import make_env
from tests.e2e.test_pcap_differential import session
from tests.e2e.test_pcap_oracle import row_of
from tests.pcaps import PCAPS, PCAPS_EXTRA, corpus
from tests.support import pcap_oracle as oracle
from tests.support import sharkd_stats, srt_pairs, stats_oracle
from tests.support.procs import alive

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed"),
]

PAGE = 500
FLAKY = {"pkcs-1"}  # sharkd's analyse lists it on some loads (test_pcap_info_loading.py); tshark -2 never


def captures() -> list[Path]:
    found = corpus()
    if not found:
        pytest.skip(f"no real captures in {PCAPS}")
    return found


def corpus_daemon(tmp_path_factory: pytest.TempPathFactory, name: str, config: str = "") -> Iterator[DaemonProcess]:
    """A daemon allowed the corpus, with `config` added to its own (a module fixture's body)."""
    root = tmp_path_factory.mktemp(name)
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}", "{PCAPS_EXTRA}"]\ncall_timeout_s = 300\n' + config)
    daemon = start_daemon(env)
    yield daemon
    daemon.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


@pytest.fixture(scope="module")
def index_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    # Files of 500 frames: every bigger capture's frames table is many files, every answer read across them.
    yield from corpus_daemon(tmp_path_factory, "indexd", "[pcap]\nindex_segment_frames = 500\n")


def epochs(path: Path) -> list[str]:
    return oracle.tshark_kept(path, "-T", "fields", "-e", "frame.time_epoch").split()


def decode_args(path: Path) -> dict[str, Any]:
    rules = oracle.decode_as(path)
    return {"decode_as": rules} if rules else {}


@pytest.mark.parametrize("path", captures(), ids=lambda p: p.name)
async def test_every_page_of_the_index_is_tsharks(index_daemon: DaemonProcess, path: Path) -> None:
    async with session(index_daemon) as call:
        built = await call("pcap_index", pcap_path=str(path), wait_s=240, **decode_args(path))
        assert not built["_is_error"] and built["state"] == "ready", built
        summary = built["summary"]
        table = oracle.columns(path)
        assert summary["frames"] == len(table) == int(oracle.capinfos(path)["Number of packets"]), path.name
        layers = ["frame", *oracle.layers(path)]
        assert [p for p in summary["protocols"] if p not in FLAKY] == [p for p in layers if p not in FLAKY]
        times = epochs(path)
        assert (summary["first_epoch"], summary["last_epoch"]) == (times[0], times[-1])
        got: list[dict[str, Any]] = []
        while True:
            page = await call("pcap_frames_by_filter", pcap_path=str(path), display_filter="", limit=PAGE,
                              offset=len(got), **decode_args(path))
            assert not page["_is_error"] and page["served_by"] == "index", page
            assert page["total"] == len(table) and page["total_exact"] is True
            got += page["frames"]
            if not page["has_more"]:
                break
    assert [f["number"] for f in got] == sorted(table)
    for frame in got:
        assert frame == row_of(table[frame["number"]]), path.name


TABLES = {"ip": "IPv4", "ipv6": "IPv6", "udp": "UDP", "tcp": "TCP", "sctp": "SCTP"}


def _end(addr: str, port: Any) -> str:
    return f"{addr}:{port}" if port not in (None, "") else addr


def sharkd_tables(path: Path) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Wireshark's own conversation and endpoint taps, asked of a real sharkd by the test (not through
    diagd), in pcap_stats' row shape, ordered as it orders them (bytes, then frames; ties as listed).
    Without the capture's decode-as rules: they name HTTP/2 ports, which change no ip/udp/tcp/sctp layer."""
    asked = [("tap", {"tap0": f"{kind}:{table}"}) for table in TABLES.values() for kind in ("conv", "endpt")]
    answers = sharkd_stats.record(path, asked)
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for layer, table in TABLES.items():
        convs = answers[sharkd_stats.request_key("tap", {"tap0": f"conv:{table}"})]["taps"][0].get("convs", [])
        hosts = answers[sharkd_stats.request_key("tap", {"tap0": f"endpt:{table}"})]["taps"][0].get("hosts", [])
        found[("conversations", layer)] = sorted((
            {"a": _end(c["saddr"], c.get("sport")), "b": _end(c["daddr"], c.get("dport")),
             "frames": c["txf"] + c["rxf"], "bytes": c["txb"] + c["rxb"], "a_to_b_frames": c["txf"],
             "a_to_b_bytes": c["txb"], "b_to_a_frames": c["rxf"], "b_to_a_bytes": c["rxb"],
             "rel_start_s": c["start"], "duration_s": round(c["stop"] - c["start"], 9), "filter": c["filter"]}
            for c in convs), key=lambda r: (-r["bytes"], -r["frames"]))
        found[("endpoints", layer)] = sorted((
            {"address": _end(h["host"], h.get("port")), "frames": h["txf"] + h["rxf"], "bytes": h["txb"] + h["rxb"],
             "tx_frames": h["txf"], "tx_bytes": h["txb"], "rx_frames": h["rxf"], "rx_bytes": h["rxb"],
             "filter": h["filter"]} for h in hosts), key=lambda r: (-r["bytes"], -r["frames"]))
    return found


@pytest.mark.parametrize("path", captures(), ids=lambda p: p.name)
async def test_conversations_and_endpoints_from_the_index_are_wiresharks(index_daemon: DaemonProcess,
                                                                         path: Path) -> None:
    """Every row of every ip/ipv6/udp/tcp/sctp conversation and endpoint table, from the index, equals
    sharkd's own tap exactly (bytes, times to the nanosecond, filters) and tshark -z's text."""
    theirs = sharkd_tables(path)
    async with session(index_daemon) as call:
        built = await call("pcap_index", pcap_path=str(path), wait_s=240, **decode_args(path))
        assert built["state"] == "ready", built
        for (kind, layer), expected in theirs.items():
            answer = await call("pcap_stats", pcap_path=str(path), kind=kind, protocol=layer, limit=5000,
                                **decode_args(path))
            # A protocol some frame of which cannot be read as the tap counts it goes to sharkd (said).
            deferred = layer in built.get("tables_from_sharkd", {})
            assert not answer["_is_error"] and answer["method"].startswith("index:") != deferred, answer
            assert answer["total"] == len(expected) and answer["rows"] == expected, (path.name, kind, layer)
            if not expected:
                assert answer["reason"] == f"protocol {layer} is not in this capture", answer
            # Paged where the rows are kept: pages of a third (and one past the end) are the table.
            step, pages = max(1, len(expected) // 3), []
            for offset in range(0, len(expected) + step, step):
                page = await call("pcap_stats", pcap_path=str(path), kind=kind, protocol=layer, offset=offset,
                                  limit=step, **decode_args(path))
                assert page["total"] == len(expected) and page["has_more"] == (offset + step < len(expected))
                pages += page["rows"]
            assert pages == expected, (path.name, kind, layer)
            if expected and not deferred:
                assert page["reason"] == f"offset {offset} is past the last of {len(expected)} rows", page
            if kind == "endpoints":
                assert {r["address"]: [r["frames"], r["bytes"], r["tx_frames"], r["tx_bytes"], r["rx_frames"],
                                       r["rx_bytes"]] for r in answer["rows"]} == oracle.endpoints(path, layer)
            else:
                # tshark prints its own order and sizes of 10 kB and more in whole kB.
                printed = {(r["a"], r["b"], r["rel_start"]): r for r in oracle.conversations(path, layer)}
                assert len(printed) == len(answer["rows"]), path.name
                for row in answer["rows"]:
                    text = printed[(row["a"], row["b"], f"{row['rel_start_s']:.9f}")]
                    assert (row["frames"], row["a_to_b_frames"], row["b_to_a_frames"]) == (
                        text["frames"], text["a_to_b_frames"], text["b_to_a_frames"]), (path.name, row)
                    assert oracle.same_size(row["bytes"], text["bytes"]), (path.name, row)


IO = [(1000, ""), (10000, "udp || sctp")]  # every frame; a filter the index translates


@pytest.mark.parametrize("path", captures(), ids=lambda p: p.name)
async def test_io_intervals_from_the_index_are_tsharks(index_daemon: DaemonProcess, path: Path) -> None:
    """Every interval of `tshark -z io,stat`, from the index, whole and page by page."""
    async with session(index_daemon) as call:
        built = await call("pcap_index", pcap_path=str(path), wait_s=240, **decode_args(path))
        assert built["state"] == "ready", built
        for interval_ms, display_filter in IO:
            theirs, total = stats_oracle.io_every_interval(path, interval_ms, display_filter)
            asked = {"pcap_path": str(path), "kind": "io", "interval_ms": interval_ms,
                     "display_filter": display_filter, **decode_args(path)}
            answer = await call("pcap_stats", **asked, limit=len(theirs) + 1)
            assert not answer["_is_error"] and answer["method"].startswith("index:"), answer
            assert [(r["start_s"], r["frames"], r["bytes"]) for r in answer["rows"]] == theirs, path.name
            assert (answer["total"], answer["frames"], answer["bytes"]) == (len(theirs), *total), path.name
            assert "reason" not in answer if total[0] else answer["reason"].startswith("no frame matches"), answer
            step, pages = max(1, len(theirs) // 3), []
            for offset in range(0, len(theirs) + step, step):
                page = await call("pcap_stats", **asked, offset=offset, limit=step)
                assert page["total"] == len(theirs) and page["has_more"] == (offset + step < len(theirs)), page
                pages += page["rows"]
            assert pages == answer["rows"], path.name


# The protocols whose response times the index gives (answers/index_srt.py), by the layers carrying them.
SRT_LAYERS = {"gtpv2": {"gtpv2"}, "pfcp": {"pfcp"}, "sip": {"sip"}, "http": {"http", "ssdp"}}
SRT_FILTERS = ("frame.len > 200", "udp && ip.ttl < 64")  # filters whose names mean the same in a cut


SRT_CAPTURES = [p for p in captures() if set().union(*SRT_LAYERS.values()) & set(oracle.layers(p))]


@pytest.mark.parametrize("path", SRT_CAPTURES, ids=lambda p: p.name)
async def test_response_times_from_the_index_are_the_pairing_of_tshark_fields(index_daemon: DaemonProcess,
                                                                              path: Path) -> None:
    """GTPv2-C, PFCP, SIP and HTTP/1.1 requests paired with their responses from the messages tshark reads
    over the frames the index cuts from the file: the pairing made from `tshark -T fields` over the whole
    file alone (tests/support/srt_pairs.py, never importing diagd), rows and totals, whole and page by
    page, and of the frames filters keep; a protocol the capture lacks says so."""
    async with session(index_daemon) as call:
        built = await call("pcap_index", pcap_path=str(path), wait_s=240, **decode_args(path))
        assert built["state"] == "ready", built
        for protocol, layers in SRT_LAYERS.items():
            asked = {"pcap_path": str(path), "kind": "srt", "protocol": protocol, **decode_args(path)}
            answer = await call("pcap_stats", **asked, limit=500)
            assert not answer["_is_error"] and "cut from the file by its index" in answer["method"], answer
            if not layers & set(oracle.layers(path)):
                assert answer["rows"] == [] and answer["reason"] == f"protocol {protocol} is not in this capture"
                continue
            theirs = srt_pairs.pairing(path, protocol).answer
            assert answer["rows"] == theirs["rows"], (path.name, protocol)
            for key, value in theirs.items():
                assert answer[key] == value, (path.name, protocol, key)
            pages = [row for offset in range(0, len(theirs["rows"]), 2)
                     for row in (await call("pcap_stats", **asked, offset=offset, limit=2))["rows"]]
            assert pages == theirs["rows"], (path.name, protocol)
            for flt in SRT_FILTERS:  # applied over the cut: the same pairing of the frames tshark's filter keeps
                answer = await call("pcap_stats", **asked, display_filter=flt, limit=500)
                assert not answer["_is_error"] and "cut from the file by its index" in answer["method"], answer
                theirs = srt_pairs.pairing(path, protocol, flt).answer
                assert answer["rows"] == theirs["rows"], (path.name, protocol, flt)
                assert all(answer[key] == value for key, value in theirs.items()), (path.name, protocol, flt)
                if not theirs["rows"]:
                    assert answer["reason"] == f"no frame matches display_filter {flt!r}", answer
            if path == SRT_CAPTURES[0]:  # a filter naming Wireshark's numbering: the loaded capture pairs
                loaded = await call("pcap_stats", **asked, display_filter="frame.number > 3 || udp.stream >= 0",
                                    limit=500)
                assert not loaded["_is_error"] and "cut from the file" not in loaded["method"], loaded


INDEXED_FIELDS = ["_ws.col.No.", "_ws.col.Source", "_ws.col.Destination", "_ws.col.Protocol", "_ws.col.Length",
                  "_ws.col.Info", "frame.time_epoch", "frame.cap_len", "frame.protocols", "ip.src", "ip.dst",
                  "ipv6.src", "ipv6.dst", "tcp.stream", "udp.stream", "tcp.srcport", "tcp.dstport", "udp.srcport",
                  "udp.dstport", "sctp.srcport", "sctp.dstport"]
TRANSPORT_FIELDS = ["ip.src", "udp.srcport", "udp.dstport", "udp.stream", "sctp.srcport", "_ws.col.Info"]


def tshark_timeline(path: Path, fields: list[str]) -> list[dict[str, Any]]:
    """tshark -T fields itself (two-pass, every occurrence), read as pcap_timeline shows a row: a column's
    text whole, a field's occurrences a list when there are several, an empty cell null."""
    present = " || ".join(f for f in fields if not f.startswith("_ws.col."))
    text = oracle.tshark_kept(path, *(["-Y", present] if present else []), "-T", "fields", "-E", "occurrence=a",
                         "-E", "aggregator=\x1f", "-e", "frame.number", *[a for f in fields for a in ("-e", f)])
    rows = []
    for line in text.split("\n"):
        if not line:
            continue
        cells = line.split("\t")
        row: dict[str, Any] = {"frame.number": int(cells[0])}
        for field, cell in zip(fields, cells[1:], strict=True):
            values = [cell] if field.startswith("_ws.col.") else cell.split("\x1f")
            row[field] = None if cell == "" else values[0] if len(values) == 1 else values
        rows.append(row)
    return rows


def by_value(value: Any) -> tuple[int, int, str]:
    """How a sorted timeline orders a field: numbers by value, text (addresses) by text, absent last;
    a field of several occurrences by its first; ties in frame order (a stable sort)."""
    if value is None:
        return (2, 0, "")
    first = value[0] if isinstance(value, list) else value
    return (0, int(first), "") if first.isdigit() else (1, 0, first)


@pytest.mark.parametrize("path", captures(), ids=lambda p: p.name)
async def test_timelines_of_indexed_fields_from_the_index_are_tsharks(index_daemon: DaemonProcess,
                                                                      path: Path) -> None:
    """pcap_timeline of the fields the index holds, with their own filter (frames holding any of them):
    every row from the index equals tshark -T fields' own, on every capture; sorted too."""
    async with session(index_daemon) as call:
        built = await call("pcap_index", pcap_path=str(path), wait_s=240, **decode_args(path))
        assert built["state"] == "ready", built
        for fields, sort_by in ((INDEXED_FIELDS, None), (TRANSPORT_FIELDS, None), (TRANSPORT_FIELDS, "udp.srcport"),
                                (TRANSPORT_FIELDS, "ip.src")):
            expected = tshark_timeline(path, fields)
            if sort_by is not None:
                expected.sort(key=lambda r: by_value(r[sort_by]))
            got: list[dict[str, Any]] = []
            while True:
                page = await call("pcap_timeline", pcap_path=str(path), fields=fields, limit=2000, offset=len(got),
                                  **({"sort_by": sort_by} if sort_by else {}), **decode_args(path))
                if sort_by == "ip.src" and len(expected) > 20000:  # sorted in Python: the sharkd path's limit
                    assert page["code"] == "OUTPUT_TOO_LARGE" and page["details"]["total"] == len(expected), page
                    got = expected
                    break
                assert not page["_is_error"] and page["served_by"] == "index", page
                assert page["total"] == len(expected), (path.name, fields)
                got += page["rows"]
                if not page["has_more"]:
                    break
            assert got == expected, (path.name, fields, sort_by)


# Filters the index answers (filters.py), each checked against tshark -Y on every capture: protocols,
# fields of one and of many occurrences, ==/!= (any / all), ranges, sets, negation, absent fields.
INDEX_FILTERS = ["udp", "!tcp", "sctp && ngap", "nas-5gs", "pfcp || gtpv2", "ipv6", "icmp", "frame",
                 "udp.port == 2152", "udp.port != 2152", "!(udp.port == 2152)", "tcp.port == 80 || tcp.port == 7777",
                 "ip.addr == 10.53.0.12", "ip.src != 10.53.0.12", "ip.dst == 192.168.70.130 && tcp",
                 "tcp.stream in {1, 2, 3}", "udp.stream >= 2", "frame.len > 200", "frame.number <= 10",
                 "sctp.port == 38412", "not udp and not tcp", "ip.src", "udp.port in {53, 2152}",
                 "ip.addr eq 12.1.1.2", "tcp.srcport ne 80", "tcp.dstport > 1024"]
# Filters it does not translate but matches with tshark over the frames cut from the file that carry a
# layer every match carries, named in the filter (index/narrowing.py), per layer: each run on every
# capture carrying it.
NARROWED_FILTERS = {
    "dns": ['dns && dns.qry.name contains "a"', "dns && dns.flags.response == 1 && dns.flags.rcode == 0"],
    "sip": ['sip && sip.Method == "INVITE"', "sip && (sip.Status-Code >= 200 || sdp)"],
    "diameter": ["diameter && diameter.cmd.code == 272", "diameter && diameter.flags.request == 0"],
    "ngap": ["ngap && ngap.procedureCode == 15", "ngap && ngap.RAN_UE_NGAP_ID > 1 && sctp.chunk_type == 0"],
    "nas-5gs": ["nas-5gs && (nas_5gs.mm.message_type == 0x41 || nas_5gs.sm.message_type == 0xc1)"],
    "pfcp": ["pfcp && pfcp.msg_type == 50", "pfcp && pfcp.cause"],
    "gtpv2": ["gtpv2 && gtpv2.message_type == 32", "gtpv2 && gtpv2.cause"],
    "s1ap": ["s1ap && s1ap.procedureCode == 12"], "icmp": ["icmp && icmp.type == 3"],
    "tcp": ["tcp && tcp.flags.syn == 1 && tcp.flags.ack == 0", "tcp && tcp.analysis.retransmission"],
    "ip": ["ip && ip.addr == 10.0.0.0/8 && ip.ttl < 64"],
}
# And some it leaves to sharkd: a protocol whose layer name is not always its item, strings on every frame,
# Wireshark's own numbering, negations, functions that hold on frames without the field, a field alone
# (its protocol's fields sit in other protocols' frames too: DNS's under mDNS).
SHARKD_FILTERS = ["http", "tcp.stream in {1 2 3}", "frame contains \"a\"", "!dns.qry.name", "count(dns.a) == 0",
                  "dns.response_in", "not sip.Method == \"INVITE\"", "dns.qry.name contains \"a\"", "gtp"]


@pytest.mark.parametrize("path", captures(), ids=lambda p: p.name)
async def test_filters_the_index_answers_match_tsharks_and_the_rest_go_to_sharkd(index_daemon: DaemonProcess,
                                                                                  path: Path) -> None:
    table = oracle.columns(path)
    async with session(index_daemon) as call:
        built = await call("pcap_index", pcap_path=str(path), wait_s=240, **decode_args(path))
        assert built["state"] == "ready", built
        for flt in INDEX_FILTERS:
            wanted = oracle.matching(path, flt)
            page = await call("pcap_frames_by_filter", pcap_path=str(path), display_filter=flt, limit=5000,
                              **decode_args(path))
            assert not page["_is_error"] and page["served_by"] == "index", (flt, page)
            assert page["total"] == len(wanted) and [f["number"] for f in page["frames"]] == wanted[:5000], flt
            for frame in page["frames"]:
                assert frame == row_of(table[frame["number"]]), (path.name, flt)
            if not wanted:
                assert page["hint"], page
        timeline = await call("pcap_timeline", pcap_path=str(path), fields=["udp.srcport", "_ws.col.Info"],
                              display_filter="udp.port != 2152 && !icmp", limit=5000, **decode_args(path))
        wanted = oracle.matching(path, "udp.port != 2152 && !icmp")
        assert timeline["served_by"] == "index" and timeline["total"] == len(wanted), timeline
        assert [r["frame.number"] for r in timeline["rows"]] == wanted[:5000]
        for flt in SHARKD_FILTERS:
            page = await call("pcap_frames_by_filter", pcap_path=str(path), display_filter=flt, limit=5,
                              **decode_args(path))
            assert page.get("served_by") != "index", (flt, page)


@pytest.mark.parametrize("path", captures(), ids=lambda p: p.name)
async def test_filters_the_index_narrows_match_tsharks_over_the_whole_file(index_daemon: DaemonProcess,
                                                                          path: Path) -> None:
    """Each filter of every layer the capture carries (and one of a layer it lacks), matched by tshark over
    the frames the index cuts from the file, gives exactly `tshark -Y` over the whole file, page by page,
    each row the index's (tshark's own columns), saying how it was matched."""
    table = oracle.columns(path)
    carried = set(oracle.layers(path))
    chosen = [flt for layer, flts in NARROWED_FILTERS.items() if layer in carried for flt in flts]
    chosen.append(next(flts[0] for layer, flts in NARROWED_FILTERS.items() if layer not in carried))
    async with session(index_daemon) as call:
        built = await call("pcap_index", pcap_path=str(path), wait_s=240, **decode_args(path))
        assert built["state"] == "ready", built
        for flt in chosen:
            wanted = oracle.matching(path, flt)
            step, got = max(1, len(wanted) // 2 + 1), []
            for offset in range(0, len(wanted) + 1, step):
                page = await call("pcap_frames_by_filter", pcap_path=str(path), display_filter=flt, limit=step,
                                  offset=offset, **decode_args(path))
                assert not page["_is_error"] and page["served_by"] == "index", (flt, page)
                assert page["total"] == len(wanted) and page["total_exact"] is True, (path.name, flt)
                assert "matched by tshark -Y over " in page["note"], page
                got += page["frames"]
            assert [f["number"] for f in got] == wanted, (path.name, flt)
            for frame in got:
                assert frame == row_of(table[frame["number"]]), (path.name, flt)


async def test_the_index_is_parquet_any_reader_reads_and_survives_a_restart(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    path = PCAPS / "magma_gx_gy_combined_04.pcapng"
    if not path.exists():
        pytest.skip(f"{path.name} is not in the corpus")
    env = make_env(tmp_path / "d", f'[daemon]\nallowed_dirs = ["{PCAPS}", "{PCAPS_EXTRA}"]\ncall_timeout_s = 300\n')
    first = start_daemon(env)
    try:
        async with session(first) as call:
            built = await call("pcap_index", pcap_path=str(path), wait_s=240)
    finally:
        first.stop()
    assert built["state"] == "ready" and "note" not in built, built
    frames = env.state / "pcap" / "index" / built["index"] / "frames"  # a Parquet dataset: a folder of files
    assert list(frames.glob("*.parquet")), sorted(p.name for p in (env.state / "pcap").rglob("*"))
    table = oracle.columns(path)
    count, last_info = duckdb.connect().execute(
        f"SELECT count(*), max_by(info, number) FROM read_parquet('{frames}/*.parquet')").fetchone()
    assert count == len(table) and last_info == table[len(table)][6]
    second = start_daemon(env)
    try:
        # Before any call, no actor holds it: `diagd status` lists the index on disk all the same.
        listed = json.loads(second.env.run("status", "--json").stdout)["backends"]["pcap"]["indexes"]
        text = second.env.run("status").stdout
        async with session(second) as call:
            # A page first: the restarted daemon finds the index on disk itself (no pcap_index call).
            page = await call("pcap_frames_by_filter", pcap_path=str(path), display_filter="", limit=3,
                              offset=len(table) - 3)
            again = await call("pcap_index", pcap_path=str(path))
    finally:
        second.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)
    assert again["state"] == "ready" and "built before" in again["note"], again
    assert again["index"] == built["index"]
    assert [(i["capture"], i["frames"], i["in_use"]) for i in listed] == [(str(path), len(table), False)], listed
    assert listed[0]["disk_bytes"] >= built["index_bytes"] and listed[0]["index"].startswith(built["index"][:12])
    assert "pcap indexes (1):" in text and str(path) in text, text
    assert page["served_by"] == "index" and [f["number"] for f in page["frames"]] == sorted(table)[-3:]


async def test_a_daemon_killed_mid_build_leaves_no_builder_tshark_or_half_index(tmp_path: Path, bigger: Path) -> None:
    """The builder and its tshark run in a session of their own; killed with the daemon, its next
    progress line finds no reader (BrokenPipeError), so it kills tshark and removes its partial output.
    (A build that ends in that moment leaves a whole index: never a half-written one.)"""
    env = make_env(tmp_path / "d", f'[daemon]\nallowed_dirs = ["{bigger.parent}", "{PCAPS}"]\ncall_timeout_s = 300\n')
    daemon = start_daemon(env)
    try:
        async with session(daemon) as call:
            await call("pcap_info", pcap_path=str(PCAPS / "adrian_registration_reject.pcap"))  # the catalogue, read
            begun = await call("pcap_index", pcap_path=str(bigger))
            assert begun["state"] == "building", begun
            with trio.fail_after(60):
                while len(building := builders(str(bigger))) < 2:  # the builder and its tshark
                    await trio.sleep(0.02)
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait()
        with trio.fail_after(30):
            while any(alive(pid) for pid in building):
                await trio.sleep(0.1)
        assert not list((env.state / "pcap" / "index").glob(f"*{PARTIAL}*")), "a half-written index was left"
    finally:
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)


def builders(capture: str) -> list[int]:
    """The index builder of `capture` and the tshark under it (their pids), if running."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if capture.encode() in argv and any(a.endswith(b"index/build.py") or a == b"tshark" for a in argv):
            found.append(int(proc.name))
    return found


async def test_one_build_at_a_time_the_next_says_queued_then_is_built(tmp_path: Path, bigger: Path) -> None:
    """Each build is a tshark whose memory grows with its capture: one at a time daemon-wide."""
    small = PCAPS / "magma_gx_gy_combined_04.pcapng"
    env = make_env(tmp_path / "d", f'[daemon]\nallowed_dirs = ["{bigger.parent}", "{PCAPS}"]\ncall_timeout_s = 300\n')
    daemon = start_daemon(env)
    try:
        async with session(daemon) as call:
            await call("pcap_info", pcap_path=str(small))  # the catalogue, read: the next calls are quick
            first = await call("pcap_index", pcap_path=str(bigger))
            second = await call("pcap_index", pcap_path=str(small))
            assert first["state"] == "building" and second["state"] == "queued", (first, second)
            assert "one at a time" in second["note"]
            done = await call("pcap_index", pcap_path=str(small), wait_s=240)
            assert done["state"] == "ready" and done["summary"]["frames"] == len(oracle.columns(small))
    finally:
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)


async def test_diagd_index_export_writes_the_index_beside_the_capture_never_over_a_file(tmp_path: Path) -> None:
    """`diagd index export`: the running daemon builds the index, the command copies it into a new
    folder beside the capture; any engine reads it there (DuckDB); a second export is refused."""
    duckdb = pytest.importorskip("duckdb")
    source = PCAPS / "adrian_sandbox_n4.pcap"
    if not source.exists():
        pytest.skip(f"{source.name} is not in the corpus")
    folder = tmp_path / "captures"
    folder.mkdir()
    capture = folder / source.name
    shutil.copyfile(source, capture)
    env = make_env(tmp_path / "d", f'[daemon]\nallowed_dirs = ["{folder}"]\ncall_timeout_s = 300\n')
    daemon = start_daemon(env)
    try:
        done = env.run("index", "export", str(capture), "--json", timeout=300)
        again = env.run("index", "export", str(capture), timeout=60)
        elsewhere = env.run("index", "export", str(capture), "--to", str(tmp_path / "out"), timeout=60)
    finally:
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    target = folder / (capture.name + ".diagd-index")
    assert said["folder"] == str(target) and said["frames"] == len(oracle.columns(source))
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()) == sorted(said["files"])
    frames = duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{target}/frames/*.parquet')").fetchone()
    assert frames == (said["frames"],)
    assert again.returncode == 2 and "exists" in again.stderr, again
    assert elsewhere.returncode == 0 and (tmp_path / "out" / "meta.json").is_file(), elsewhere.stderr
