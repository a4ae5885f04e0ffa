"""pcap_stats (actors/pcap/answers/stats.py) run in-process on what real sharkd answered for real captures
(tests/support/sharkd_stats.py, recorded once and cached), each answer compared field by field with
Wireshark's own `tshark -q -z <tap>` / `tshark -T fields` output (tests/support/stats_oracle.py).
The daemon path is tests/e2e/test_pcap_stats.py; this one is fast enough for the mutation gate."""

from __future__ import annotations

import shutil
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, cast

import pytest

from diagd.actors.base import Request
from diagd.actors.pcap.answers import http2_srt, stats
from diagd.actors.pcap.engine.session import CaptureSession
from diagd.actors.pcap.messages import Stats
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.pcaps import PCAPS, PCAPS_EXTRA
from tests.support import stats_oracle as oracle
from tests.support.sharkd_stats import Recorded, record

pytestmark = pytest.mark.skipif(shutil.which("sharkd") is None or shutil.which("tshark") is None,
                                reason="sharkd and tshark (wireshark-common, tshark) are not installed")

# Small captures carrying what each kind reads: Diameter (srt), SCTP, TCP, UDP; the paired response times
# (GTPv2, PFCP, SIP, HTTP/1.1) are test_stats_pairing.py's, HTTP/2's test_http2_srt_sharkd.py's.
NAMES = [
    "magma_gx_gy_combined_03.pcapng", "magma_inbound_roaming_01.pcapng", "adrian_n4_upf_timeout_n4.pcap",
    "adrian_sandbox_n4.pcap", "adrian_sandbox_n2.pcap", "heplify_sip_ipv4_tcp.pcap",
    "heplify_erspan_sip_ipv4_udp.pcapng", "heplify_sip_tcp_websocket.pcap",
    "tempo_ULRerror.pcap", "tempo_OppoMME-detach.pcap", "tempo_s1ap.pcap",
]
TABLES = {"ip": "IPv4", "tcp": "TCP", "udp": "UDP", "sctp": "SCTP"}
IO = [(1000, ""), (500, "sctp || udp"), (10000, "tcp"), (100, "diameter"), (1000, "frame.number > 100000")]
REQUEST = cast(Request, object())  # stats.py only hands it back to the capture


def path_of(name: str) -> Path:
    for folder in (PCAPS, PCAPS_EXTRA):
        if (folder / name).exists():
            return folder / name
    pytest.skip(f"real capture {name} not found in {PCAPS} or {PCAPS_EXTRA}")


def requests() -> list[tuple[str, dict[str, Any] | None]]:
    """Every sharkd request the answers below make (written out here, not taken from stats.py)."""
    asked: list[tuple[str, dict[str, Any] | None]] = [("analyse", None), ("tap", {"tap0": "expert"}),
                                                      ("tap", {"tap0": "srt:diameter"})]
    asked += [("tap", {"tap0": f"{t}:{table}"}) for table in TABLES.values() for t in ("conv", "endpt")]
    asked.append(("frames", {"column0": "frame.time_relative:0", "column1": "frame.len:0"}))
    for _, flt in IO:
        if flt:
            asked += [("check", {"filter": flt}), ("frames", {"column0": "frame.number:0", "filter": flt})]
    return asked


def capture(name: str) -> Recorded:
    return Recorded(record(path_of(name), requests()))


async def ask(name: str, kind: str, protocol: str | None = None, display_filter: str = "",
              interval_ms: int | None = None) -> dict[str, Any]:
    message = stats.resolve(kind, protocol, display_filter, interval_ms)
    return await stats.answer(cast(CaptureSession, capture(name)), REQUEST, message)


def carries(name: str, protocol: str) -> bool:
    return bool(oracle.tshark(path_of(name), "-Y", protocol, "-T", "fields", "-e", "frame.number").strip())


# -- expert info == tshark -q -z expert

async def test_expert_matches_tshark() -> None:
    empty = 0
    for name in NAMES:
        ours = await ask(name, "expert")
        theirs = oracle.expert(oracle.tshark(path_of(name), "-q", "-z", "expert"))
        assert ours["method"] == "sharkd tap expert"
        got = Counter({(r["severity"], r["group"], r["protocol"], r["summary"]): r["count"] for r in ours["rows"]})
        assert got == theirs, name
        assert len(ours["rows"]) == len(theirs), name  # one row per (severity, group, protocol, summary)
        assert ours["items"] == sum(theirs.values()), name
        severities = Counter[str]()
        protocols: dict[str, Counter[str]] = defaultdict(Counter)
        for (severity, _, protocol, _), count in theirs.items():
            severities[severity] += count
            protocols[protocol][severity] += count
        assert ours["by_severity"] == dict(severities), name
        assert list(ours["by_severity"]) == [s for s in stats.SEVERITIES if s in severities], name
        assert ours["by_protocol"] == {p: dict(c) for p, c in protocols.items()}, name
        assert list(ours["by_protocol"]) == sorted(protocols), name
        # The documented order: severity as tshark prints them, then most frequent, protocol, summary.
        keys = [(stats.SEVERITIES.index(r["severity"]), -r["count"], r["protocol"], r["summary"]) for r in ours["rows"]]
        assert keys == sorted(keys), name
        for row in ours["rows"]:
            assert row["frames"] == sorted(row["frames"]) and len(row["frames"]) == min(row["count"], 5), row
            assert row["first_frame"] == row["frames"][0], row
        if not ours["rows"]:
            empty += 1
            assert ours["reason"] == "Wireshark raised no expert information on this capture"
        else:
            assert "reason" not in ours
    assert empty < len(NAMES)


async def test_expert_frames_match_tshark_fields() -> None:
    """first_frame and the first five frames of each row, from the frames tshark puts each message in."""
    for name in NAMES:
        ours = await ask(name, "expert")
        text = oracle.tshark(path_of(name), "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=\x1f",
                             "-e", "frame.number", "-e", "_ws.expert.message")
        frames: dict[str, list[int]] = defaultdict(list)
        for line in text.splitlines():
            number, messages = line.split("\t")
            for message in messages.split("\x1f") if messages else []:
                frames[message].append(int(number))
        by_summary: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in ours["rows"]:
            by_summary[row["summary"]].append(row)
        for summary, rows in by_summary.items():
            if len(rows) == 1:  # a summary under one severity/group/protocol: its frames are the row's
                assert rows[0]["frames"] == sorted(frames[summary])[:5], (name, summary)
                assert rows[0]["first_frame"] == min(frames[summary]), (name, summary)
                assert rows[0]["count"] == len(frames[summary]), (name, summary)


# -- conversations and endpoints == tshark -q -z conv,P / endpoints,P

@pytest.mark.parametrize("protocol", list(TABLES))
async def test_conversations_match_tshark(protocol: str) -> None:
    seen = 0
    for name in NAMES:
        ours = await ask(name, "conversations", protocol)
        theirs = oracle.conversations(oracle.tshark(path_of(name), "-q", "-z", f"conv,{protocol}"))
        assert ours["method"] == f"sharkd tap conv:{TABLES[protocol]}"
        assert len(ours["rows"]) == len(theirs), name
        for row in ours["rows"]:
            left_f, left_n, left_u, right_f, right_n, right_u, total_f, total_n, total_u, duration = \
                theirs[(row["a"], row["b"], f"{row['rel_start_s']:.9f}")]
            # tshark's "<-" column is B to A, "->" is A to B (A: the conversation's first address).
            assert (row["b_to_a_frames"], row["a_to_b_frames"], row["frames"]) == (left_f, right_f, total_f), row
            assert oracle.same_bytes(row["b_to_a_bytes"], left_n, left_u), (name, row)
            assert oracle.same_bytes(row["a_to_b_bytes"], right_n, right_u), (name, row)
            assert oracle.same_bytes(row["bytes"], total_n, total_u), (name, row)
            assert row["frames"] == row["a_to_b_frames"] + row["b_to_a_frames"], row
            assert row["bytes"] == row["a_to_b_bytes"] + row["b_to_a_bytes"], row
            # tshark prints the duration to 4 decimals from its own doubles: a half-way one rounds either way.
            assert abs(row["duration_s"] - float(duration)) <= 0.00005 + 1e-9, (name, row, duration)
            assert isinstance(row["filter"], str) and row["a"].split(":")[0] in row["filter"], row
            assert set(row) == {"a", "b", "frames", "bytes", "a_to_b_frames", "a_to_b_bytes", "b_to_a_frames",
                                "b_to_a_bytes", "rel_start_s", "duration_s", "filter"}
        order = [(-r["bytes"], -r["frames"]) for r in ours["rows"]]
        assert order == sorted(order), name
        if ours["rows"]:
            seen += 1
            assert "reason" not in ours
        else:
            assert not carries(name, protocol)
            assert ours["reason"] == f"protocol {protocol} is not in this capture", ours
    assert seen >= 3


@pytest.mark.parametrize("protocol", list(TABLES))
async def test_endpoints_match_tshark(protocol: str) -> None:
    seen = 0
    for name in NAMES:
        ours = await ask(name, "endpoints", protocol)
        theirs = oracle.endpoints(oracle.tshark(path_of(name), "-q", "-z", f"endpoints,{protocol}"), protocol)
        assert ours["method"] == f"sharkd tap endpt:{TABLES[protocol]}"
        got = {r["address"]: [r["frames"], r["bytes"], r["tx_frames"], r["tx_bytes"], r["rx_frames"],
                              r["rx_bytes"]] for r in ours["rows"]}
        assert got == theirs, name
        assert len(ours["rows"]) == len(theirs), name
        for row in ours["rows"]:
            assert isinstance(row["filter"], str) and row["address"].split(":")[0] in row["filter"], row
            assert set(row) == {"address", "frames", "bytes", "tx_frames", "tx_bytes", "rx_frames", "rx_bytes",
                                "filter"}
        order = [(-r["bytes"], -r["frames"]) for r in ours["rows"]]
        assert order == sorted(order), name
        if ours["rows"]:
            seen += 1
        else:
            assert ours["reason"] == f"protocol {protocol} is not in this capture", ours
    assert seen >= 3


# -- I/O intervals == tshark -q -z io,stat

@pytest.mark.parametrize(("interval_ms", "display_filter"), IO)
async def test_io_matches_tshark(interval_ms: int, display_filter: str) -> None:
    for name in NAMES:
        ours = await ask(name, "io", display_filter=display_filter, interval_ms=interval_ms)
        seconds = f"{interval_ms / 1000:g}"
        theirs = oracle.io(oracle.tshark(path_of(name), "-q", "-z",
                                         f"io,stat,{seconds}" + (f",{display_filter}" if display_filter else "")))
        assert [(r["start_s"], r["frames"], r["bytes"]) for r in ours["rows"]] == theirs, name
        assert [r["interval"] for r in ours["rows"]] == list(range(len(theirs))), name
        assert ours["interval_ms"] == interval_ms
        assert ours["frames"] == sum(f for _, f, _ in theirs), name
        assert ours["bytes"] == sum(b for _, _, b in theirs), name
        assert ours["method"] == "sharkd frames (frame.time_relative, frame.len) binned as tshark's io,stat"
        if ours["frames"]:
            assert "reason" not in ours
        else:
            assert ours["reason"] == f"no frame matches display_filter {display_filter!r}"


async def test_io_interval_defaults_to_one_second() -> None:
    ours = await ask(NAMES[0], "io")
    theirs = oracle.io(oracle.tshark(path_of(NAMES[0]), "-q", "-z", "io,stat,1"))
    assert ours["interval_ms"] == 1000 and [(r["start_s"], r["frames"], r["bytes"]) for r in ours["rows"]] == theirs


# -- service response times

async def test_diameter_srt_matches_tshark() -> None:
    seen = 0
    for name in NAMES:
        ours = await ask(name, "srt", "diameter")
        theirs = oracle.diameter_srt(oracle.tshark(path_of(name), "-q", "-z", "diameter,srt"))
        assert ours["method"] == ("sharkd tap srt:diameter (Wireshark's SRT: answers paired with requests by "
                                  "hop-by-hop and end-to-end identifier on the connection)")
        got = {r["procedure"]: (r["count"], f"{r['min_s']:.6f}", f"{r['max_s']:.6f}", f"{r['avg_s']:.6f}",
                                f"{r['sum_s']:.6f}") for r in ours["rows"]}
        assert got == theirs, name
        for row in ours["rows"]:
            assert row["avg_s"] == round(row["sum_s"] / row["count"], 9), row
            assert row["table"] == "Diameter Requests", row  # sharkd's name of its one table
        if theirs:
            seen += 1
            assert "reason" not in ours
        elif not carries(name, "diameter"):
            assert ours["reason"] == "protocol diameter is not in this capture"
        else:
            assert ours["reason"] == "diameter is present but carries no request/response pair"
    assert seen >= 3


# -- the question in canonical form, and the tshark arguments an answer names

def test_resolve_canonical_forms_and_refusals() -> None:
    assert stats.resolve("conversations", None, "", None) == Stats("conversations", "ip", "", None)
    assert stats.resolve("endpoints", " IPv4 ", "", 5) == Stats("endpoints", "ip", "", None)
    assert stats.resolve("conversations", "Ethernet", "", None) == Stats("conversations", "eth", "", None)
    assert stats.resolve("srt", " GTPv2", "gtpv2.cause", None) == Stats("srt", "gtpv2", "gtpv2.cause", None)
    assert stats.resolve("expert", "tcp", "", 10) == Stats("expert", None, "", None)
    assert stats.resolve("io", "tcp", "udp", None) == Stats("io", None, "udp", 1000)
    assert stats.resolve("io", None, "", 250) == Stats("io", None, "", 250)
    srt = ["diameter", "gtpv2", "pfcp", "sip", "http", "http2"]
    refusals = [(("srt", "diamter", "", None), "diameter", srt, "no service response time for protocol 'diamter' "
                 "in this Wireshark (4.0.17)"),
                (("conversations", "ipx", "", None), "ip", list(stats.CONV_TABLES),
                 "no conversations table for protocol 'ipx'"),
                (("expret", None, "", None), "expert", ["expert", "srt", "conversations", "endpoints", "io"],
                 "unknown kind 'expret'"),
                (("srt", None, "", None), None, srt, "no service response time for protocol None in this "
                 "Wireshark (4.0.17)")]
    for args, close, supported, message in refusals:
        with pytest.raises(DiagdError) as err:
            stats.resolve(*args)
        assert err.value.code == ErrorCode.INVALID_ARGUMENT
        assert err.value.details["supported"] == supported and err.value.message == message
        if close is not None:
            assert close in next(iter(err.value.details["did_you_mean"].values())), err.value.details
    with pytest.raises(DiagdError) as err:
        stats.resolve("srt", "diamter", "", None)
    assert set(err.value.details["supported"]) == {"diameter", "gtpv2", "pfcp", "sip", "http", "http2"}
    for kind, protocol in [("expert", None), ("conversations", "tcp"), ("endpoints", None), ("srt", "diameter")]:
        with pytest.raises(DiagdError) as err:
            stats.resolve(kind, protocol, "tcp", None)
        assert err.value.code == ErrorCode.INVALID_ARGUMENT
        assert err.value.details == {"hint": "pcap_extract_subcapture with the filter, then pcap_stats on the file "
                                             "it writes"}
        assert err.value.message == f"kind={kind} takes no display_filter: sharkd 4.0 runs its taps over the " \
                                    "whole capture"
    assert stats.resolve("srt", "sip", "sip", None).display_filter == "sip"


def test_tap_command_is_what_the_oracle_runs() -> None:
    cases = {
        Stats("expert", None, "", None): ["-q", "-z", "expert"],
        Stats("conversations", "sctp", "", None): ["-q", "-z", "conv,sctp"],
        Stats("endpoints", "udp", "", None): ["-q", "-z", "endpoints,udp"],
        Stats("io", None, "", 500): ["-q", "-z", "io,stat,0.5"],
        Stats("io", None, "tcp", 10000): ["-q", "-z", "io,stat,10,tcp"],
        Stats("io", None, "", None): ["-q", "-z", "io,stat,1"],
        Stats("srt", "diameter", "", None): ["-q", "-z", "diameter,srt"],
    }
    for message, argv in cases.items():
        assert stats.tap_command(message) == argv, message
    fields = [a for f in http2_srt.FIELDS for a in ("-e", f)]
    assert stats.tap_command(Stats("srt", "http2", "tcp.port == 80", None)) == \
        ["-Y", "http2.type == 1 && (tcp.port == 80)", "-T", "fields", "-E", "occurrence=a", *fields]
    assert stats.tap_command(Stats("srt", "http2", "", None)) == \
        ["-Y", "http2.type == 1", "-T", "fields", "-E", "occurrence=a", *fields]
