"""No decode-as rule hides traffic: port rules to HTTP/2 checked per conversation, against tshark itself.

The corpus has no HTTP/1.1 SBI on TCP 7777 (pcaps-extra MANIFEST.md), so it is built from real frames:
5greplay_oai.pcap (OAI core, HTTP/1.1 SBI on port 80) with every TCP port 80 rewritten to 7777
(tests/support/pcapedit.py), and that merged with adrian_sandbox_sbi.pcap (Open5GS, HTTP/2 on 7777
without and with the preface) for a port that carries both. Every expectation is an independent
tshark run: per tcp.stream, the `http` and `http2` frames without any rule and with
`-d tcp.port==7777,http2`. Through the real daemon and shim.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_ngap_summaries import HANG_GUARD_S, call
from tests.e2e.test_pcap import make_env
from tests.pcaps import PCAPS, PCAPS_EXTRA, pcap
from tests.support import pcap_oracle as oracle
from tests.support.pcapedit import remap_tcp_ports

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]
PORT_RULE = "tcp.port==7777,http2"
RULE = re.compile(r"tcp\.port==(\d+),(\w+)")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("h1on7777")
    data = bytearray(Path(pcap("5greplay_oai.pcap")).read_bytes())
    assert remap_tcp_ports(data, {80: 7777}) > 0
    oai = root / "oai_http1_7777.pcap"
    oai.write_bytes(bytes(data))
    mixed = root / "mixed_7777.pcap"
    subprocess.run(["mergecap", "-F", "pcap", "-w", str(mixed), str(oai), pcap("adrian_sandbox_sbi.pcap")],
                   check=True, capture_output=True)
    return {"oai": oai, "mixed": mixed, "root": root}


@pytest.fixture(scope="module")
def daemon(built: dict[str, Path]) -> Iterator[DaemonProcess]:
    root = built["root"]
    env = make_env(root / "d", f'[daemon]\nallowed_dirs = ["{PCAPS}", "{PCAPS_EXTRA}", "{root}"]\n')
    started = start_daemon(env)
    yield started
    started.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


def per_stream(path: Path, display_filter: str, rules: tuple[str, ...] | list[str] = ()) -> Counter[int]:
    """Frames matching `display_filter` per tcp.stream, by tshark with exactly these rules."""
    argv = ["tshark", "-r", str(path), "-n", *(a for r in rules for a in ("-d", r)), "-Y", display_filter,
            "-T", "fields", "-E", "occurrence=l", "-e", "tcp.stream"]
    def run() -> str:  # kept on disk (tests/support/pcap_oracle.cached_text): asked again per rule set and test
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    out = oracle.cached_text(path, [*argv, oracle.config_key()], run)
    return Counter(int(x) for x in out.split())


def expected(path: Path) -> tuple[dict[str, Counter[int]], set[int]]:
    """What decoding HTTP/2 only where it is found gives, per stream (independent of diagd): HTTP/1.1
    streams keep their `http` frames; a stream with no `http` frame that the port rule turns into
    HTTP/2 frames carrying a header block or data (HEADERS 1, DATA 0) is HTTP/2."""
    plain_http, plain_h2 = per_stream(path, "http"), per_stream(path, "http2")
    ruled_h2 = per_stream(path, "http2", [PORT_RULE])
    h2_streams = set(per_stream(path, "http2.type in {0, 1} && !_ws.malformed", [PORT_RULE])) - set(plain_http)
    want_h2 = Counter({s: ruled_h2[s] if s in h2_streams else plain_h2[s] for s in set(ruled_h2) | set(plain_h2)})
    return {"http": plain_http, "http2": +want_h2}, h2_streams


def hides(path: Path, rules: list[str]) -> list[str]:
    """What these rules take away from tshark's decoding, per stream (empty: nothing)."""
    lost = []
    for proto in ("http", "http2", "json"):
        before, after = per_stream(path, proto), per_stream(path, proto, rules)
        lost += [f"{proto} in tcp.stream {s}: {n} -> {after[s]}" for s, n in before.items() if after[s] < n]
    return lost


CASES = ["oai", "mixed", "adrian_sandbox_sbi.pcap", "ngtester_initue_open5gs_amf_ngap_nas_sbi.pcap",
         "5greplay_oai.pcap"]


def capture(built: dict[str, Path], case: str) -> Path:
    if case in built:
        return built[case]
    for folder in (PCAPS, PCAPS_EXTRA):
        if (folder / case).exists():
            return folder / case
    pytest.skip(f"{case} is not in the corpus")


@pytest.mark.parametrize("case", CASES)
async def test_the_profile_decodes_http2_only_where_tshark_finds_it(daemon: DaemonProcess, built: dict[str, Path],
                                                                   case: str) -> None:
    path = capture(built, case)
    with trio.fail_after(HANG_GUARD_S):  # a busy machine: the protocols may come on a later call
        while not (info := await call(daemon, "pcap_info", pcap_path=str(path), profile="5gc-lab",
                                      include_command=True))["protocols_ready"]:
            await trio.sleep(0.2)
    applied = info["source"]["decode_as"]
    want, h2_streams = expected(path)
    # The rules diagd applied, run by tshark itself: every stream as decoding HTTP/2 only where found gives.
    assert per_stream(path, "http", applied) == want["http"]
    assert per_stream(path, "http2", applied) == want["http2"]
    assert hides(path, applied) == []
    assert ("http2" in info["protocols"]) == bool(want["http2"])
    assert ("http" in info["protocols"]) == bool(want["http"])
    on_port = set(per_stream(path, "tcp.port == 7777 && tcp.len > 0"))
    checked = info["source"]["decode_as_checked"]
    assert [c["rule"] for c in checked] == [PORT_RULE]
    h2_on_port = h2_streams & on_port
    if h2_on_port == on_port:  # every conversation on 7777 is HTTP/2 (or 7777 carries nothing)
        assert applied == [PORT_RULE] and checked[0]["verdict"] == "applied"
    elif not h2_on_port:
        assert applied == [] and checked[0]["verdict"] == "not applied"
        assert {x["tcp.stream"] for x in checked[0]["left_alone"]} <= on_port
    else:
        assert checked[0]["verdict"] == "applied per conversation"
        assert applied and all((m := RULE.fullmatch(r)) and int(m.group(1)) != 7777 for r in applied)
    # The equivalent command is what was applied: the same rules, in tshark's own words.
    line = info["source"]["equivalent_command_line"]
    assert [m.group(0) for m in RULE.finditer(line)] == applied


async def info_with_sbi_ports(daemon: DaemonProcess, **args: Any) -> dict[str, Any]:
    """pcap_info until it carries sbi_ports and the protocols: a first call may answer before the passes
    that read them are done, and then says so (the contract: call again)."""
    with trio.fail_after(HANG_GUARD_S):
        while True:
            info = await call(daemon, "pcap_info", **args)
            if "sbi_ports" in info and info["protocols_ready"]:
                return info
            assert "sbi_ports" in info or any(w.startswith("sbi_ports left out") for w in info["warnings"]), info
            await trio.sleep(0.2)


async def test_pcap_info_says_what_each_sbi_port_carries(daemon: DaemonProcess, built: dict[str, Path]) -> None:
    oai, mixed = built["oai"], built["mixed"]
    sbi = pcap("adrian_sandbox_sbi.pcap")
    on_port = len(set(per_stream(Path(sbi), "tcp.port == 7777 && tcp.len > 0")))

    def row(info: dict[str, Any], port: int) -> dict[str, Any]:
        return next(r for r in info["sbi_ports"] if r["port"] == port)

    got = row(await info_with_sbi_ports(daemon, pcap_path=sbi, profile="5gc-lab"), 7777)
    assert got["summary"] == f"HTTP/2 on tcp/7777 needs decode-as: applied ({on_port} conversations)"
    assert (got["carries"], got["decode_as"], got["conversations"]) == (["HTTP/2"], "applied", on_port)
    got = row(await info_with_sbi_ports(daemon, pcap_path=sbi), 7777)
    assert got["summary"] == f"HTTP/2 on tcp/7777 needs decode-as: not applied (decode_as={PORT_RULE})"
    assert hides(Path(sbi), [PORT_RULE]) == []

    h1_streams = set(per_stream(oai, "http && tcp.port == 7777"))
    info = await info_with_sbi_ports(daemon, pcap_path=str(oai), profile="5gc-lab")
    got = row(info, 7777)
    assert got["summary"].startswith("HTTP/1.1 on tcp/7777: no decode-as needed")
    assert (got["carries"], got["decode_as"], got["conversations"]) == (["HTTP/1.1"], "not applied", len(h1_streams))
    assert info["has_protocols"]["http"] and "http" in info["protocols"]

    info = await info_with_sbi_ports(daemon, pcap_path=str(mixed), profile="5gc-lab")
    got = row(info, 7777)
    _, h2_streams = expected(mixed)
    assert got["summary"] == (f"HTTP/2 on tcp/7777 needs decode-as: applied per conversation to {len(h2_streams)} of "
                              f"{len(h2_streams) + len(set(per_stream(mixed, 'http && tcp.port == 7777')))} "
                              f"conversations (HTTP/1.1 in {len(set(per_stream(mixed, 'http && tcp.port == 7777')))} "
                              "left alone)")


async def test_empty_answers_name_no_rule_that_hides_traffic(daemon: DaemonProcess, built: dict[str, Path]) -> None:
    oai, mixed = built["oai"], built["mixed"]
    # tshark itself: the port rule would hide every HTTP/1.1 SBI message of the OAI core.
    assert hides(oai, [PORT_RULE])
    hints = []
    for args in ({"profile": "5gc-lab"}, {}):
        for flt in ("http2", 'http2.headers.path contains "nsmf"'):
            got = await call(daemon, "pcap_frames_by_filter", pcap_path=str(oai), display_filter=flt, **args)
            assert got["total"] == 0
            hints.append(got["hint"])
    stats = await call(daemon, "pcap_stats", pcap_path=str(oai), kind="srt", protocol="http2", profile="5gc-lab")
    hints.append(stats["reason"])
    for hint in hints:
        assert not RULE.search(hint), hint
        assert "HTTP/1.1 is on" in hint and "tcp/7777" in hint, hint
    # On the mixed port, without a rule: the hint names the per-conversation rules, which show HTTP/2
    # and hide nothing (tshark with exactly those rules).
    got = await call(daemon, "pcap_frames_by_filter", pcap_path=str(mixed), display_filter="http2")
    named = [m.group(0) for m in RULE.finditer(got["hint"])]
    assert named and PORT_RULE not in named
    assert hides(mixed, named) == []
    assert per_stream(mixed, "http2", named)


def n4_sbi(result: dict[str, Any]) -> list[Any]:
    return [(p["procedure"], p["first_frame"], p.get("n4_sbi")) for u in result["ues"] for p in u["procedures"]]


@pytest.mark.parametrize("case", ["oai", "5greplay_oai.pcap"])
async def test_procedures_keep_their_n4_sbi_links_with_the_profile(daemon: DaemonProcess, built: dict[str, Path],
                                                                   case: str) -> None:
    path = capture(built, case)
    plain = await call(daemon, "ngap_ue_sessions", pcap_path=str(path), view="procedures")
    profiled = await call(daemon, "ngap_ue_sessions", pcap_path=str(path), view="procedures", profile="5gc-lab")
    assert n4_sbi(profiled) == n4_sbi(plain)
    assert profiled["n4_sbi"] == plain["n4_sbi"]
    # The SBI calls tshark finds (HTTP/1.1 POSTs that open a session) are there with the profile too.
    posts = per_stream(path, 'http.request.method == "POST" && !gtp && http.request.uri matches '
                             '"^/(nsmf-pdusession/v1/sm-contexts|namf-comm/v1/ue-contexts/[^/]+/n1-n2-messages)$"')
    linked = [m for _, _, links in n4_sbi(profiled) for m in links or [] if m["interface"] == "SBI"]
    assert posts and len(linked) == sum(posts.values())
