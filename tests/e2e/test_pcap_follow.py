"""pcap_follow for GTPv2-C tunnels and TCP/UDP streams, compared with Wireshark's own tools on every corpus
capture that carries the protocol, through the real shim and daemon.

- TCP/UDP: a stream's frames are the frames `tshark -T fields -e tcp.stream` (udp.stream) puts in it, and
  its text (`text`) is `tshark -q -z follow,tcp|udp,ascii,N`, chunk by chunk: who sent it, its length and
  its characters, cut where the answer says. Without `text` a frame is followed by the first key it
  carries, in pcap_follow's order (HTTP/2 stream, Session-Id, Call-ID, GTPv2, TCP, UDP).
- GTPv2-C: a tunnel worked out here from `tshark -T fields` alone: ends are (destination, header TEID)
  and (source, the first F-TEID whose interface type `tshark -G values` names GTP-C, at the source
  address); frames sharing an end are one tunnel, and so are Wireshark's request/response pairs
  (gtpv2.response_in / response_to). Every GTPv2 frame of the corpus is followed, and of a capture
  built from two of them where two tunnels join the same two peers with colliding TEIDs; its sequence
  diagram draws the same frames.

Reference runs are kept on disk (tests/support/pcap_oracle), so a rerun reads no capture twice.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_pcap import client_for, make_env
from tests.pcaps import PCAPS, PCAPS_EXTRA, corpus
from tests.support import mermaid, pcap_oracle
from tests.support.pcapedit import readdress_ipv4

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]

Call = Callable[..., Awaitable[dict[str, Any]]]
SAMPLES = 4  # streams followed per capture and transport, spread over the capture
TEXT = 20000  # text bytes asked: the cut of a longer stream is checked too
HANG_GUARD_S = 300  # not a measurement: only stops a call that hangs
KEYS = ["tcp.stream", "udp.stream", "http2.streamid", "diameter.Session-Id", "sip.Call-ID", "gtpv2.seq"]
GTP = ["ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "gtpv2.teid", "gtpv2.seq", "gtpv2.response_in",
       "gtpv2.response_to", "gtpv2.f_teid_interface_type", "gtpv2.f_teid_gre_key", "gtpv2.f_teid_v4",
       "gtpv2.f_teid_v6", "gtpv2.f_teid_ipv4", "gtpv2.f_teid_ipv6"]
# What the corpus carries (MANIFEST.md): each must be followed.
GTPV2_CAPTURES = {"magma_inbound_roaming_01.pcapng", "tempo_OppoMME-detach.pcap", "tempo_s1ap.pcap"}


def captures() -> list[Path]:
    found = corpus()
    if not found:
        pytest.skip(f"the shared capture corpus is not in {PCAPS}")
    return found


def tool_env(conf: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "TZ": "UTC", "LC_ALL": "C.UTF-8", "WIRESHARK_CONFIG_DIR": conf, "HOME": conf}


def tshark(path: Path, *args: str) -> str:
    """tshark's output as bytes it wrote (CR kept: the follow text is compared character by character),
    kept on disk by the capture, the tshark version, the argv and the configuration."""
    conf = tempfile.mkdtemp(prefix="follow-oracle-conf-")
    argv = ["tshark", "-r", str(path), "-n", "-2", *[a for r in pcap_oracle.decode_as(path) for a in ("-d", r)], *args]

    def run() -> str:
        done = subprocess.run(argv, capture_output=True, check=False, timeout=HANG_GUARD_S, env=tool_env(conf))
        assert done.returncode == 0, (argv, done.stderr[-2000:])
        return done.stdout.decode("latin-1")

    try:
        return pcap_oracle.cached_text(path, [*argv, pcap_oracle.config_key(tool_env(conf))], run)
    finally:
        shutil.rmtree(conf, ignore_errors=True)


def table(path: Path, flt: str, fields: list[str]) -> dict[int, dict[str, list[str]]]:
    """frame -> field -> every value `tshark -T fields` prints for it."""
    text = tshark(path, "-Y", flt, "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=\x1f", "-e", "frame.number",
                  *[a for f in fields for a in ("-e", f)])
    rows = {}
    for line in text.splitlines():
        cells = line.split("\t")
        rows[int(cells[0])] = {f: [v for v in c.split("\x1f") if v] for f, c in zip(fields, cells[1:], strict=True)}
    return rows


Chunk = tuple[str, int, str]  # (sender address:port, length, text)


def follow_texts(path: Path, kind: str, streams: list[str]) -> dict[str, list[Chunk]]:
    """`tshark -q -z follow,KIND,ascii,N` for each stream (one run), read chunk by chunk: a chunk is its length
    on a line (a tab before it: node 1 sent it), that many characters, then a line break."""
    out = tshark(path, "-q", *[a for s in streams for a in ("-z", f"follow,{kind},ascii,{s}")])
    found: dict[str, list[Chunk]] = {}
    rule = "=" * 67 + "\n"
    pos = 0
    while (start := out.find(rule + "Follow: ", pos)) >= 0:
        pos = start + len(rule)
        head = out[pos:].split("\n", 4)
        stream = re.fullmatch(rf"Filter: {kind}\.stream eq (\d+)", head[1]).group(1)  # type: ignore[union-attr]
        nodes = [head[2].split(": ", 1)[1], head[3].split(": ", 1)[1]]
        pos += sum(len(line) + 1 for line in head[:4])
        chunks: list[Chunk] = []
        while not out.startswith(rule, pos):
            length = re.match(r"(\t?)(\d+)\n", out[pos:])
            assert length, out[pos:pos + 80]
            pos += length.end()
            n = int(length.group(2))
            chunks.append((nodes[1 if length.group(1) else 0], n, out[pos:pos + n]))
            pos += n
            assert out[pos] == "\n"
            pos += 1
        found[stream] = chunks
    assert set(found) == set(streams), (found.keys(), streams)
    return found


def cut(chunks: list[Chunk], most: int) -> list[Chunk]:
    """The chunks as an answer cut at `most` bytes shows them (the last one shortened, with its full length)."""
    shown, out = 0, []
    for sender, n, text in chunks:
        if shown >= most:
            break
        out.append((sender, n, text[:most - shown]))
        shown += min(n, most - shown)
    return out


def sample(items: list[str], most: int) -> list[str]:
    if len(items) <= most:
        return items
    step = (len(items) - 1) / (most - 1)
    return list(dict.fromkeys(items[round(i * step)] for i in range(most)))


def first_key(values: dict[str, list[str]]) -> str:
    """The key pcap_follow follows a frame by without `text`: the first it carries, in its order."""
    if values["http2.streamid"] and values["tcp.stream"]:
        return "http2.streamid"
    for name in ("diameter.Session-Id", "sip.Call-ID"):
        if values[name]:
            return name
    if values["gtpv2.seq"]:
        return "gtpv2.teid"  # or gtpv2.seq for a frame naming no tunnel end: none in the corpus
    return "tcp.stream" if values["tcp.stream"] else "udp.stream"


@pytest.fixture(scope="module")
def follow_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("followd")
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}", "{PCAPS_EXTRA}", "{root}"]\ncall_timeout_s = 120\n'
                         "[pcap]\nmax_loaded = 2\n")
    daemon = start_daemon(env)
    yield daemon
    daemon.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


@asynccontextmanager
async def session(daemon: DaemonProcess) -> AsyncIterator[Call]:
    """One MCP client for many calls."""
    async with client_for(daemon) as client:
        async def call(tool: str, path: Path, **args: Any) -> dict[str, Any]:
            with trio.fail_after(HANG_GUARD_S):
                result = await client.call_tool(tool, {"pcap_path": str(path),
                                                       "decode_as": pcap_oracle.decode_as(path), **args})
            payload: dict[str, Any] = json.loads(result.content[0].text)
            assert not result.is_error, payload
            return payload

        yield call


async def test_tcp_and_udp_streams_are_tsharks_frames_and_follow_text_on_every_capture(
        follow_daemon: DaemonProcess) -> None:
    followed: dict[str, set[str]] = {"tcp": set(), "udp": set()}
    carrying: dict[str, set[str]] = {"tcp": set(), "udp": set()}
    async with session(follow_daemon) as call:
        for path in captures():
            rows = table(path, "tcp || udp", KEYS)
            for kind in ("tcp", "udp"):
                name = f"{kind}.stream"
                firsts: dict[str, int] = {}  # stream -> its first frame that `text` follows by it
                for number, values in rows.items():
                    if values[name] and (kind == "tcp" or not values["tcp.stream"]):
                        firsts.setdefault(values[name][-1], number)
                if not firsts:
                    continue
                carrying[kind].add(path.name)
                streams = sample(sorted(firsts, key=int), SAMPLES)
                texts = follow_texts(path, kind, streams)
                for stream in streams:
                    number = firsts[stream]
                    got = await call("pcap_follow", path, frame_number=number, text=TEXT, limit=5000)
                    assert (got["follow_type"], got["follow_key"]) == (name, {name: stream}), (path.name, number)
                    expected = [n for n, values in rows.items() if stream in values[name]]
                    assert got["total"] == len(expected), (path.name, stream)
                    assert [f["number"] for f in got["frames"]] == expected[:5000], (path.name, stream)
                    text = got["text"]
                    shown = [(c["from"], c["bytes"], c["text"]) for c in text["chunks"]]
                    assert shown == cut(texts[stream], TEXT), (path.name, kind, stream)
                    total = sum(n for _, n, _ in texts[stream])
                    assert text["payload_bytes"] == total and ("cut" in text) == (total > TEXT)
                    assert {s for s, _, _ in texts[stream]} <= {text["client"], text["server"]}
                    auto = await call("pcap_follow", path, frame_number=number, limit=1)
                    assert auto["follow_type"] == first_key(rows[number]), (path.name, number)
                    assert "text" not in auto
                    followed[kind].add(path.name)
    assert followed == carrying and followed["tcp"] and followed["udp"]


def control_plane_types() -> set[str]:
    """The F-TEID interface types Wireshark names GTP-C (`tshark -G values`)."""
    text = pcap_oracle.cached_tool_text(["tshark", "-G", "values"], lambda: pcap_oracle.run(["tshark", "-G", "values"]))
    return {cells[2] for line in text.splitlines()
            if (cells := line.split("\t"))[:2] == ["V", "gtpv2.f_teid_interface_type"] and "GTP-C" in cells[3]}


def tunnels(path: Path) -> tuple[dict[int, list[int]], dict[int, set[tuple[str, str]]]]:
    """(frame -> the frames of its tunnel or exchange, frame -> the tunnel's ends), from tshark's fields alone."""
    rows = table(path, "gtpv2", GTP)
    cplane = control_plane_types()
    parent: dict[Any, Any] = {}

    def root(x: Any) -> Any:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    def join(a: Any, b: Any) -> None:
        parent[root(a)] = root(b)

    for number, v in rows.items():
        src, dst = (v["ip.src"] or v["ipv6.src"])[-1], (v["ip.dst"] or v["ipv6.dst"])[-1]
        ends = [(dst, t) for t in v["gtpv2.teid"] if int(t, 16)]
        v4, v6 = iter(v["gtpv2.f_teid_ipv4"]), iter(v["gtpv2.f_teid_ipv6"])
        for kind, key, has4, has6 in zip(v["gtpv2.f_teid_interface_type"], v["gtpv2.f_teid_gre_key"],
                                         v["gtpv2.f_teid_v4"], v["gtpv2.f_teid_v6"], strict=True):
            address = next(v4) if has4 == "1" else None
            address = next(v6) if has6 == "1" else address
            if kind in cplane and int(key, 16) and address in (None, src):
                ends.append((src, key))
                break
        for end in ends:
            join(("frame", number), ("end", end))
        for other in v["gtpv2.response_in"] + v["gtpv2.response_to"]:
            join(("frame", number), ("frame", int(other)))
    groups: dict[Any, list[int]] = {}
    ends_of: dict[Any, set[tuple[str, str]]] = {}
    for x in list(parent):
        (groups if x[0] == "frame" else ends_of).setdefault(root(x), [] if x[0] == "frame" else set())
        if x[0] == "frame":
            groups[root(x)].append(x[1])
        else:
            ends_of[root(x)].add(x[1])
    return ({n: sorted(groups[root(("frame", n))]) for n in rows},
            {n: ends_of.get(root(("frame", n)), set()) for n in rows})


def two_tunnels(root: Path) -> Path:
    """tempo_s1ap's GTPv2-C (MME .195, SGW .196) moved onto tempo_OppoMME-detach's peers (.149, .132) and
    merged with it: two tunnels between the same two peers, the SGW's TEID 1 of one beside the MME's TEID 1
    of the other. (The F-TEIDs inside keep the old addresses: those tunnels join through their pairs.)"""
    s1ap, oppo = PCAPS_EXTRA / "tempo_s1ap.pcap", PCAPS_EXTRA / "tempo_OppoMME-detach.pcap"
    data = bytearray(s1ap.read_bytes())
    assert readdress_ipv4(data, {"192.168.61.195": "192.168.61.149", "192.168.61.196": "192.168.61.132"}) > 0
    moved, out = root / "s1ap_moved.pcap", root / "two_tunnels.pcapng"  # pcapng: the two link types
    moved.write_bytes(bytes(data))
    subprocess.run(["mergecap", "-F", "pcapng", "-w", str(out), str(oppo), str(moved)], check=True, capture_output=True)
    return out


async def test_every_gtpv2_frame_is_followed_to_the_tunnel_tsharks_fields_give(follow_daemon: DaemonProcess) -> None:
    paths = [p for p in captures() if p.name in GTPV2_CAPTURES]
    assert {p.name for p in paths} == GTPV2_CAPTURES, "a GTPv2 capture of MANIFEST.md is missing"
    paths.append(two_tunnels(Path(follow_daemon.env.root)))
    sizes = []
    async with session(follow_daemon) as call:
        for path in paths:
            frames, ends = tunnels(path)
            for number, want in frames.items():
                got = await call("pcap_follow", path, frame_number=number)
                assert [f["number"] for f in got["frames"]] == want and got["total"] == len(want), (path.name, number)
                assert got["follow_type"] == ("gtpv2.teid" if ends[number] else "gtpv2.seq")
                if ends[number]:
                    assert {(e["address"], e["teid"]) for e in got["follow_key"]["gtpv2.teid"]} == ends[number]
                    assert "GTPv2-C tunnel of TEIDs" in got["followed"]
                drawn = await call("pcap_sequence_diagram", path, frame_number=number)
                assert [a.frame for a in mermaid.read(drawn["diagram"])[1]] == want
            sizes.append(sorted({len(w) for w in frames.values()}))
    # The merged capture holds the two tunnels apart (6 and 8 frames), not one of 14.
    assert sizes[-1] == [6, 8], sizes


async def test_a_frame_with_nothing_to_follow_or_no_stream_for_text_is_a_coded_error(
        follow_daemon: DaemonProcess) -> None:
    n2 = PCAPS / "adrian_sandbox_n2.pcap"
    async with client_for(follow_daemon) as client:
        for args, says in (({"frame_number": 1}, "carries no HTTP/2 stream, Diameter Session-Id, SIP Call-ID"),
                           ({"frame_number": 1, "text": 100}, "carries no TCP or UDP stream")):
            with trio.fail_after(HANG_GUARD_S):
                result = await client.call_tool("pcap_follow", {"pcap_path": str(n2), **args})
            answer = json.loads(result.content[0].text)
            assert result.is_error and answer["code"] == "INVALID_ARGUMENT" and says in answer["message"]
            assert answer["details"]["protocols"] == ["frame", "eth", "ip", "sctp"]
