"""pcap_stats compared exactly with Wireshark's own `tshark -q -z <tap>` output (and, for the response
times Wireshark 4.0.17 has no tap for, with requests and responses paired from `tshark -T fields` by each
protocol's rules), on every shared capture carrying the protocol, through the real daemon, shim and MCP
client."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_pcap import make_env
from tests.e2e.test_pcap_differential import Call, captures, decode_as, session
from tests.pcaps import PCAPS
from tests.support import pcap_oracle, srt_pairs
from tests.support import stats_oracle as oracle

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]


@pytest.fixture(scope="module")
def stats_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("pcapstats")
    # Every test loops over every corpus capture: each stays loaded (one load, not one per test).
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}"]\ncall_timeout_s = 120\n'
                         "[pcap]\nmax_loaded = 32\n")
    daemon = start_daemon(env)
    yield daemon
    daemon.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


@pytest.fixture(scope="module")
def wsconf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wsconf")


def tshark(wsconf: Path, path: Path, *args: str) -> str:
    """Wireshark's own answer, kept on disk by the capture's bytes, the tshark version, the argv and the
    configuration (tests/support/pcap_oracle.cached_text)."""
    argv = ["tshark", "-r", str(path), "-n", "-2", *[a for r in decode_as(path) for a in ("-d", r)], *args]
    env = {"PATH": "/usr/bin:/bin", "TZ": "UTC", "WIRESHARK_CONFIG_DIR": str(wsconf), "HOME": str(wsconf)}

    def run() -> str:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120, env=env)
        assert done.returncode == 0, (argv, done.stderr[-2000:])
        return done.stdout
    return pcap_oracle.cached_text(path, [*argv, pcap_oracle.config_key(env)], run)


async def all_rows(call: Call, path: Path, **args: Any) -> dict[str, Any]:
    """Every row, paged through as a client would."""
    rows: list[dict[str, Any]] = []
    offset = 0
    while True:
        answer = await call("pcap_stats", pcap_path=str(path), decode_as=decode_as(path), offset=offset, limit=200,
                            **args)
        assert not answer["_is_error"], answer
        rows += answer["rows"]
        if not answer["has_more"]:
            break
        offset += len(answer["rows"])
    assert len(rows) == answer["total"]
    return {**answer, "rows": rows}


def carrying(wsconf: Path, protocol: str) -> list[Path]:
    found = [p for p in captures() if tshark(wsconf, p, "-Y", protocol, "-T", "fields", "-e", "frame.number").strip()]
    assert found, f"no shared capture carries {protocol}"
    return found


# -- expert info == tshark -q -z expert

async def test_expert_counts_match_tshark_on_every_capture(stats_daemon: DaemonProcess, wsconf: Path) -> None:
    async with session(stats_daemon) as call:
        for path in captures():
            ours = await all_rows(call, path, kind="expert")
            theirs = oracle.expert(tshark(wsconf, path, "-q", "-z", "expert"))
            got = Counter({(r["severity"], r["group"], r["protocol"], r["summary"]): r["count"] for r in ours["rows"]})
            assert got == theirs, path.name
            assert sum(ours["by_severity"].values()) == ours["items"] == sum(theirs.values()), path.name
            if not ours["rows"]:
                assert ours["reason"] == "Wireshark raised no expert information on this capture"


# -- conversations and endpoints == tshark -q -z conv,P / endpoints,P

@pytest.mark.parametrize("protocol", ["ip", "tcp", "udp", "sctp"])
async def test_conversations_match_tshark_on_every_capture(stats_daemon: DaemonProcess, wsconf: Path,
                                                           protocol: str) -> None:
    async with session(stats_daemon) as call:
        for path in captures():
            ours = await all_rows(call, path, kind="conversations", protocol=protocol)
            theirs = oracle.conversations(tshark(wsconf, path, "-q", "-z", f"conv,{protocol}"))
            assert len(ours["rows"]) == len(theirs), path.name
            for row in ours["rows"]:
                left_f, left_n, left_u, right_f, right_n, right_u, total_f, total_n, total_u, _ = \
                    theirs[(row["a"], row["b"], f"{row['rel_start_s']:.9f}")]
                # tshark's "<-" column is B to A, "->" is A to B (A: the conversation's first address).
                assert (row["b_to_a_frames"], row["a_to_b_frames"], row["frames"]) == (left_f, right_f, total_f)
                assert oracle.same_bytes(row["b_to_a_bytes"], left_n, left_u), (path.name, row)
                assert oracle.same_bytes(row["a_to_b_bytes"], right_n, right_u), (path.name, row)
                assert oracle.same_bytes(row["bytes"], total_n, total_u), (path.name, row)
            if not ours["rows"]:
                assert ours["reason"].startswith(f"protocol {protocol} is not in this capture"), ours


@pytest.mark.parametrize("protocol", ["ip", "udp", "sctp"])
async def test_endpoints_match_tshark_on_every_capture(stats_daemon: DaemonProcess, wsconf: Path,
                                                       protocol: str) -> None:
    async with session(stats_daemon) as call:
        for path in captures():
            ours = await all_rows(call, path, kind="endpoints", protocol=protocol)
            theirs = oracle.endpoints(tshark(wsconf, path, "-q", "-z", f"endpoints,{protocol}"), protocol)
            got = {r["address"]: [r["frames"], r["bytes"], r["tx_frames"], r["tx_bytes"], r["rx_frames"],
                                  r["rx_bytes"]] for r in ours["rows"]}
            assert got == theirs, path.name


# -- I/O intervals == tshark -q -z io,stat

@pytest.mark.parametrize(("interval_ms", "display_filter"), [(1000, ""), (500, "sctp || udp"), (10000, "tcp")])
async def test_io_intervals_match_tshark_on_every_capture(stats_daemon: DaemonProcess, wsconf: Path,
                                                          interval_ms: int, display_filter: str) -> None:
    async with session(stats_daemon) as call:
        for path in captures():
            ours = await all_rows(call, path, kind="io", interval_ms=interval_ms, display_filter=display_filter)
            seconds = f"{interval_ms / 1000:g}"
            theirs = [(frames, size) for _, frames, size in oracle.io(tshark(
                wsconf, path, "-q", "-z", f"io,stat,{seconds}" + (f",{display_filter}" if display_filter else "")))]
            assert [(r["frames"], r["bytes"]) for r in ours["rows"]] == theirs, path.name
            assert ours["frames"] == sum(f for f, _ in theirs)
            if not ours["frames"]:
                assert ours["reason"] == f"no frame matches display_filter {display_filter!r}"


# -- service response times

async def test_diameter_srt_matches_tshark_diameter_srt(stats_daemon: DaemonProcess, wsconf: Path) -> None:
    async with session(stats_daemon) as call:
        for path in carrying(wsconf, "diameter"):
            ours = await all_rows(call, path, kind="srt", protocol="diameter", include_command=True)
            assert ours["method"].startswith("sharkd tap srt:diameter")
            assert ours["source"]["equivalent_command"][-3:] == ["-q", "-z", "diameter,srt"]
            text = tshark(wsconf, path, "-q", "-z", "diameter,srt")
            theirs = oracle.diameter_srt(text)
            got = {r["procedure"]: (r["count"], f"{r['min_s']:.6f}", f"{r['max_s']:.6f}", f"{r['avg_s']:.6f}",
                                    f"{r['sum_s']:.6f}") for r in ours["rows"]}
            assert got == theirs and got, path.name


@pytest.mark.parametrize("protocol", ["gtpv2", "pfcp", "sip", "http"])
async def test_paired_srt_matches_tshark_fields_on_every_capture(stats_daemon: DaemonProcess, wsconf: Path,
                                                                 protocol: str) -> None:
    """Requests paired with responses by each protocol's own rules: the same pairing made from `tshark -T
    fields` alone (tests/support/srt_pairs.py), exactly, rows and totals; never 'unanswered'."""
    async with session(stats_daemon) as call:
        for path in carrying(wsconf, srt_pairs.PROTOCOLS[protocol][0]):
            ours = await all_rows(call, path, kind="srt", protocol=protocol, include_command=True)
            assert ours["method"].startswith("computed: "), ours["method"]
            assert ours["source"]["equivalent_command"][-2:] == ["-e", srt_pairs.PROTOCOLS[protocol][1][-1]]
            theirs = srt_pairs.pairing(path, protocol).answer
            assert ours["rows"] == theirs["rows"], path.name
            for key, value in theirs.items():
                assert ours[key] == value, (path.name, key)
            assert not any("unanswered" in row for row in ours["rows"])


async def test_unpaired_pfcp_requests_say_why(stats_daemon: DaemonProcess) -> None:
    async with session(stats_daemon) as call:
        ours = await all_rows(call, PCAPS / "adrian_n4_upf_timeout_n4.pcap", kind="srt", protocol="pfcp")
    rows = {r["procedure"]: r for r in ours["rows"]}
    # MANIFEST: 15 Session Establishment Requests, no response: 5 sequence numbers, each sent 3 times.
    assert rows["PFCP Session Establishment"]["not_paired"] == {"no response in the capture": 5}
    assert rows["PFCP Session Establishment"]["retransmissions"] == 10
    assert rows["PFCP Session Establishment"]["count"] == 0
    # Frames 1 and 2 are Heartbeat Requests with one sequence number at the same instant, one each way;
    # responses 3 and 4 answer them (each carries it back the other way).
    assert rows["PFCP Heartbeat"]["count"] == 5 and rows["PFCP Heartbeat"]["not_paired"] == {
        "no response in the capture": 4}


# -- HTTP/2 (SBI) response times, paired here from flat tshark fields: each HEADERS frame's headers are
# cut from the frame's name/value arrays by its http2.header.count, so frames bundled in one TCP segment
# stay apart (independent of the decode-tree walk diagd does).

SEP = "\x1f"  # header values hold commas ("application/json, application/problem+json")
SBI_ID = re.compile(r"^(\d+|[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}|[0-9a-f]{16,}|(imsi|suci|supi|nai|gci|gli|gpsi"
                    r"|msisdn|extid|imei|imeisv|mac)-.+)$", re.I)


def sbi_template(path: str) -> str:
    return "/".join("{id}" if SBI_ID.match(p) else p for p in path.partition("?")[0].split("/"))


def tshark_http2_srt(wsconf: Path, path: Path) -> tuple[dict[str, Any], int, int, int]:
    fields = ("frame.number", "frame.time_relative", "tcp.stream", "tcp.srcport", "http2.type", "http2.streamid",
              "http2.header.count", "http2.header.name", "http2.header.value")
    text = tshark(wsconf, path, "-Y", "http2.type == 1", "-T", "fields", "-E", "occurrence=a", "-E",
                  f"aggregator={SEP}", *[a for f in fields for a in ("-e", f)])
    pending: dict[tuple[str, str], tuple[str, int, str]] = {}
    times: dict[str, list[int]] = defaultdict(list)
    codes: dict[str, Counter[str]] = defaultdict(Counter)
    requests = responses = orphans = 0
    for line in text.splitlines():
        _, rel, tcp, port, types, streams, counts, names, values = line.split("\t")
        whole, _, frac = rel.partition(".")
        at = int(whole) * 10**9 + int(frac.ljust(9, "0"))
        header_names, header_values = names.split(SEP), values.split(SEP)
        h2 = [sid for kind, sid in zip(types.split(SEP), streams.split(SEP), strict=True) if kind == "1"]
        start = 0
        for sid, count in zip(h2, [int(c) for c in counts.split(SEP)], strict=True):
            pseudo = dict(zip(header_names[start:start + count], header_values[start:start + count], strict=True))
            start += count
            key = (tcp.split(SEP)[0], sid)
            if ":method" in pseudo or ":path" in pseudo:
                requests += 1
                pending[key] = (f"{pseudo.get(':method', '?')} {sbi_template(pseudo.get(':path', '?'))}", at, port)
            elif key in pending and pending[key][2] != port:  # the other end answers, :status decoded or not
                responses += 1
                name, t0, _ = pending.pop(key)
                times[name].append(at - t0)
                codes[name][pseudo.get(":status", "?")] += 1
            elif ":status" in pseudo:
                responses += 1
                orphans += 1
    unanswered = Counter(name for name, _, _ in pending.values())
    rows = {name: (len(times[name]), min(times[name], default=None), max(times[name], default=None),
                   sum(times[name]), unanswered[name], dict(codes[name])) for name in set(times) | set(unanswered)}
    return rows, requests, responses, orphans


async def test_http2_srt_matches_tshark_fields_on_every_sbi_capture(stats_daemon: DaemonProcess,
                                                                    wsconf: Path) -> None:
    async with session(stats_daemon) as call:
        sbi = carrying(wsconf, "http2")
        assert {p.name for p in sbi} == {"adrian_sandbox_sbi.pcap", "adrian_n4_upf_timeout_sbi.pcap",
                                         "adrian_sbi_nssf_reject_sbi.pcap"}
        for path in sbi:
            ours = await all_rows(call, path, kind="srt", protocol="http2")
            assert ours["method"].startswith("computed: HEADERS with :method/:path paired with the next HEADERS")
            theirs, requests, responses, orphans = tshark_http2_srt(wsconf, path)
            ns = lambda s: None if s is None else round(s * 1e9)  # noqa: E731  seconds (exact ns / 1e9) -> ns
            got = {r["procedure"]: (r["count"], ns(r.get("min_s")), ns(r.get("max_s")), ns(r.get("sum_s", 0.0)),
                                    sum(r["not_paired"].values()), r["statuses"]) for r in ours["rows"]}
            assert got == theirs and got, path.name
            assert (ours["requests"], ours["responses"], ours["responses_without_request"]) == \
                (requests, responses, orphans), path.name
            for row in ours["rows"]:
                if row["count"]:
                    assert row["avg_s"] == round(row["sum_s"] / row["count"], 9)


# -- refusals and empty answers say why

async def test_unsupported_and_empty_answers_say_why(stats_daemon: DaemonProcess) -> None:
    n2 = str(PCAPS / "adrian_registration_reject.pcap")
    async with session(stats_daemon) as call:
        bad = await call("pcap_stats", pcap_path=n2, kind="srt", protocol="diamter")
        assert bad["_is_error"] and bad["code"] == "INVALID_ARGUMENT"
        assert "diameter" in bad["details"]["did_you_mean"]["diamter"]
        assert set(bad["details"]["supported"]) == {"diameter", "gtpv2", "pfcp", "sip", "http", "http2"}
        conv = await call("pcap_stats", pcap_path=n2, kind="conversations", protocol="ipx")
        assert conv["_is_error"] and "sctp" in conv["details"]["supported"]
        filtered = await call("pcap_stats", pcap_path=n2, kind="expert", display_filter="ngap")
        assert filtered["_is_error"] and "pcap_extract_subcapture" in filtered["details"]["hint"]
        absent = await call("pcap_stats", pcap_path=n2, kind="srt", protocol="pfcp")
        assert absent["rows"] == [] and absent["reason"] == "protocol pfcp is not in this capture"
        nothing = await call("pcap_stats", pcap_path=n2, kind="io", display_filter="diameter")
        assert nothing["reason"] == "no frame matches display_filter 'diameter'"
        invalid = await call("pcap_stats", pcap_path=n2, kind="io", display_filter="ngap ==")
        assert invalid["_is_error"] and invalid["code"] == "INVALID_FILTER"
