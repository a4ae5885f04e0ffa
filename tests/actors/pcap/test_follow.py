"""follow.py on hand-built input: which key a frame is followed by, a GTPv2-C tunnel's ends and frames, and a
TCP/UDP stream's text as `tshark -z follow,...,ascii` prints it (tests/e2e/test_pcap_follow.py compares the
same with tshark on every corpus capture)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest
import trio

from diagd.actors.pcap.answers import follow
from diagd.actors.pcap.engine.session import CaptureSession
from diagd.actors.pcap.shark.sharkd import Cut, ResponseLines, Sharkd
from diagd.protocol.errors import DiagdError
from tests.pcaps import pcap

MME, SGW, PGW = "10.0.0.1", "10.0.0.2", "10.0.0.3"


def node(f: str, label: str = "", children: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"f": f, "l": label, **({"n": children} if children else {})}


def f_teid(kind: int, name: str, teid: str, ipv4: str | None) -> dict[str, Any]:
    fields = [node(f"gtpv2.f_teid_interface_type == {kind}", f"..00 1010 = Interface Type: {name} ({kind})"),
              node(f"gtpv2.f_teid_gre_key == {teid}")]
    return node("frame[1:9] == 00", "Fully Qualified Tunnel Endpoint Identifier (F-TEID)",
                fields + ([node(f"gtpv2.f_teid_ipv4 == {ipv4}")] if ipv4 else []))


def gtp_tree(src: str, dst: str, teid: str | None, seq: str, *ies: dict[str, Any],
             pair: tuple[str, int] | None = None) -> list[dict[str, Any]]:
    header = [node("gtpv2.message_type == 32"), *([node(f"gtpv2.teid == {teid}")] if teid else []),
              node(f"gtpv2.seq == {seq}"), *([node(f"gtpv2.{pair[0]} == {pair[1]}")] if pair else [])]
    return [{"f": "ip", "t": "proto", "n": [node(f"ip.src == {src}"), node(f"ip.dst == {dst}")]},
            {"f": "gtpv2", "t": "proto", "n": [*header, *ies]}]


def test_a_tunnel_end_is_the_header_teid_at_its_receiver_and_the_senders_control_plane_f_teid() -> None:
    """A Create Session Response from the SGW: its header TEID is the MME's; of its F-TEIDs only the first
    GTP-C one at the SGW's own address is the SGW's end (the PGW's S5/S8 one has the PGW's address; a
    bearer context's S1-U F-TEID is nested and user plane)."""
    tree = gtp_tree(SGW, MME, "0x00000001", "0x000010",
                    f_teid(7, "S5/S8 PGW GTP-C interface", "0x00000099", PGW),
                    f_teid(11, "S11/S4 SGW GTP-C interface", "0x00000003", SGW),
                    node("frame[9:9] == 00", "Bearer Context", [f_teid(1, "S1-U SGW GTP-U interface", "0x5", SGW)]),
                    pair=("response_to", 36))
    frame = follow.gtp_frame(37, tree)
    assert frame.ends == {(MME, "0x00000001"), (SGW, "0x00000003")} and frame.pairs == {36}
    # A request to TEID 0 names only its sender; a GTP-C F-TEID without a TEID names nothing.
    request = follow.gtp_frame(36, gtp_tree(MME, SGW, "0x00000000", "0x000010",
                                            f_teid(10, "S11 MME GTP-C interface", "0x00000000", None),
                                            f_teid(10, "S11 MME GTP-C interface", "0x00000001", MME)))
    assert request.ends == {(MME, "0x00000001")} and request.teids == []


def frame(number: int, src: str, dst: str, teid: str | None, sender: str | None = None, seq: str = "0x1",
          pairs: tuple[int, ...] = ()) -> follow.GtpFrame:
    return follow.GtpFrame(number, src, dst, [teid] if teid else [], (src, sender) if sender else None, [seq],
                           set(pairs))


def tunnel(seen: dict[int, follow.GtpFrame], start: int) -> follow.Found:
    first = seen[start]
    ends, members = set(first.ends), {start}
    follow._close(seen, ends, members)
    return follow._gtpv2_found(first, ends, members, seen)


def test_two_tunnels_between_the_same_peers_stay_apart_though_their_teids_collide() -> None:
    """TEID 1 is the MME's end of tunnel A and the SGW's end of tunnel B: an end is (address, TEID)."""
    seen = {f.number: f for f in [
        frame(1, MME, SGW, None, sender="0x1", pairs=(2,)),  # A: Create Session Request to TEID 0
        frame(2, SGW, MME, "0x1", sender="0x3", pairs=(1,)),
        frame(3, MME, SGW, None, sender="0x9", pairs=(4,)),  # B
        frame(4, SGW, MME, "0x9", sender="0x1", pairs=(3,)),
        frame(5, MME, SGW, "0x3", pairs=(6,)),  # A: Delete Session
        frame(6, SGW, MME, "0x1", pairs=(5,)),
        frame(7, MME, SGW, "0x1", pairs=(8,)),  # B: Modify Bearer
        frame(8, SGW, MME, "0x9", pairs=(7,)),
        frame(9, MME, SGW, None, seq="0x77", pairs=(10,)),  # Echo: no end
        frame(10, SGW, MME, None, seq="0x77", pairs=(9,)),
    ]}
    a = tunnel(seen, 5)
    assert a.follow_type == "gtpv2.teid"
    assert a.key == {"gtpv2.teid": [{"address": MME, "teid": "0x1"}, {"address": SGW, "teid": "0x3"}]}
    assert a.display_filter == (f"gtpv2 && ((ip.dst == {MME} && gtpv2.teid == 0x1) || (ip.dst == {SGW} && "
                                "gtpv2.teid == 0x3) || frame.number in {1})")
    assert a.extra == {"transaction": {"gtpv2.seq": "0x1", "frames": [5, 6]}}
    b = tunnel(seen, 3)
    assert b.key == {"gtpv2.teid": [{"address": MME, "teid": "0x9"}, {"address": SGW, "teid": "0x1"}]}
    assert "frame.number in {3}" in b.display_filter
    echo = tunnel(seen, 9)
    assert (echo.follow_type, echo.key) == ("gtpv2.seq", {"gtpv2.seq": "0x77", "frames": [9, 10]})
    assert echo.display_filter == "gtpv2 && frame.number in {9,10}"


def test_text_is_what_tshark_follow_ascii_prints() -> None:
    assert follow.ascii_text(bytes([0x41, 0x0D, 0x0A, 0x09, 0x00, 0x7E, 0x7F, 0x80, 0xFF, 0x20])) == "A\r\n..~... "


class FakeCapture:
    """The two session calls follow's text and kind choice make."""

    def __init__(self, answer: dict[str, Any] | Cut) -> None:
        self.answer = answer
        self.asked: list[tuple[str, dict[str, Any], int | None]] = []

    async def sharkd_call(self, request: Any, method: str, params: dict[str, Any], *,
                          keep: int | None = None) -> dict[str, Any] | Cut:
        self.asked.append((method, params, keep))
        return self.answer

    async def sbi_hint(self) -> str:
        return "HTTP/2 on tcp/7777 needs decode-as"


def payload(n: int, data: bytes, server: bool = False) -> dict[str, Any]:
    return {"n": n, "d": base64.b64encode(data).decode(), **({"s": 1} if server else {})}


def test_stream_text_is_cut_at_the_limit_and_says_so() -> None:
    # sharkd's sbytes is what the client sent, cbytes the server (named the other way round).
    fake = FakeCapture({"chost": "fd00::1", "cport": "5060", "shost": "10.0.0.9", "sport": "80", "sbytes": 19,
                        "cbytes": 17,
                        "payloads": [payload(3, b"GET / HTTP/1.1\r\n"), payload(5, b"HTTP/1.1 200 OK\r\n", True),
                                     payload(7, b"bye")]})
    text = trio.run(follow.stream_text, cast(CaptureSession, fake), None, "tcp", "4", 20)
    assert fake.asked == [("follow", {"follow": "TCP", "filter": "tcp.stream eq 4"}, follow.answer_budget(20))]
    assert text["client"] == "[fd00::1]:5060" and text["server"] == "10.0.0.9:80"
    assert (text["client_bytes"], text["server_bytes"], text["payload_bytes"], text["shown_bytes"]) == (19, 17, 36, 20)
    assert text["chunks"] == [
        {"frame": 3, "from": "[fd00::1]:5060", "bytes": 16, "text": "GET / HTTP/1.1\r\n"},
        {"frame": 5, "from": "10.0.0.9:80", "bytes": 17, "text": "HTTP", "cut": True}]
    assert text["cut"].startswith("cut at text=20: 20 of the stream's 36 payload bytes are shown")


@pytest.mark.parametrize(("carried", "transport", "kind"), [
    ({"http2.streamid": ["0", "3"], "tcp.stream": ["2"], "sip.Call-ID": ["x"]}, False, "http2"),
    ({"tcp.stream": ["2"], "sip.Call-ID": ["x"]}, False, "sip"),
    ({"gtpv2.seq": ["0x1"], "udp.stream": ["0"]}, False, "gtpv2"),
    ({"gtpv2.seq": ["0x1"], "udp.stream": ["0"]}, True, "udp"),
    ({"http2.streamid": ["1"], "tcp.stream": ["2"]}, True, "tcp"),
    ({"udp.stream": ["0", "5"]}, False, "udp"),
])
def test_a_frame_is_followed_by_the_first_key_it_carries_or_by_its_stream_for_text(
        carried: dict[str, list[str]], transport: bool, kind: str) -> None:
    got = trio.run(follow._kind, cast(CaptureSession, FakeCapture({})), carried, transport, 1, [])
    assert got == kind


def test_a_frame_carrying_nothing_to_follow_is_a_coded_error_naming_what_it_carries() -> None:
    tree = [{"f": "frame", "t": "proto"}, {"f": "ip", "t": "proto"}, {"f": "sctp", "t": "proto"}]
    with pytest.raises(DiagdError) as raised:
        trio.run(follow._kind, cast(CaptureSession, FakeCapture({})), {}, False, 7, tree)
    assert raised.value.code.name == "INVALID_ARGUMENT" and "frame 7 carries no" in raised.value.message
    assert raised.value.details == {"protocols": ["frame", "ip", "sctp"], "followable": []}
    tcp = [*tree[:2], {"f": "tcp", "t": "proto"}]
    with pytest.raises(DiagdError) as raised:
        trio.run(follow._kind, cast(CaptureSession, FakeCapture({})), {"sip.Call-ID": ["x"]}, True, 7, tcp)
    assert "no TCP or UDP stream" in raised.value.message
    assert raised.value.details["followable"] == ["sip"] and "decode-as" in raised.value.details["hint"]


def test_a_tunnelled_frame_is_followed_by_its_own_innermost_stream() -> None:
    found = follow.keyed("udp", {"udp.stream": ["0", "5"]})
    assert (found.follow_type, found.key, found.display_filter) == ("udp.stream", {"udp.stream": "5"},
                                                                    "udp.stream == 5")


def test_a_cut_answer_gives_its_totals_and_the_payloads_complete_in_what_was_kept() -> None:
    """The head of sharkd's follow line: its totals come first; a payload object cut off is not shown."""
    whole = {"jsonrpc": "2.0", "id": 7, "result": {
        "shost": "10.0.0.9", "sport": "80", "sbytes": 6, "chost": "10.0.0.1", "cport": "5060", "cbytes": 4000,
        "payloads": [payload(3, b"abc"), payload(4, b"x" * 4000, True), payload(5, b"def")]}}
    line = json.dumps(whole, separators=(",", ":"))
    kept = line[:line.index('"n":4') + 40]  # into the second payload's data
    text = trio.run(follow.stream_text, cast(CaptureSession, FakeCapture(Cut(kept, len(line)))), None, "tcp", "4",
                    100)
    assert (text["client_bytes"], text["server_bytes"], text["payload_bytes"], text["shown_bytes"]) == (6, 4000, 4006,
                                                                                                          3)
    assert text["chunks"] == [{"frame": 3, "from": "10.0.0.1:5060", "bytes": 3, "text": "abc"}]
    assert text["cut"].startswith("cut at text=100: 3 of the stream's 4006 payload bytes are shown")
    assert f"sharkd's follow answer is {len(line)} bytes" in text["cut"]


def test_response_lines_keep_a_capped_answer_s_head_only_however_it_arrives() -> None:
    caps = {5: 100}
    lines = ResponseLines(caps, max_line=1000)
    big = b'{"jsonrpc":"2.0","id":5,"result":{"payloads":"' + b"A" * 10_000 + b'"}}'
    small = b'{"jsonrpc":"2.0","id":6,"result":{}}'
    stream = big + b"\n" + small + b"\n" + b'{"jsonrpc":"2.0","id":9,"result":"' + b"B" * 5000 + b'"}\n'
    got = [line for at in range(0, len(stream), 7) for line in lines.split(stream[at:at + 7])]
    last = stream[len(big) + len(small) + 2:-1]
    assert got == [(big[:100], len(big)), (small, len(small)), (last[:1000], len(last))]


def large_udp_stream(root: Path, copies: int) -> Path:
    """One UDP stream of `copies` times the fax call's T.38 stream (udp.stream 10: 2004 datagrams of 172 bytes from
    10.35.60.100:15580), each copy shifted 41 s after the one before (editcap), merged by mergecap: the same
    five-tuple all along, one stream of copies x 344688 payload bytes."""
    one = root / "t38.pcap"
    subprocess.run(["tshark", "-r", pcap("heplify_fax_call_t38_sip.pcap"), "-Y", "udp.stream == 10", "-w",
                    str(one)], check=True, capture_output=True)
    parts = []
    for n in range(copies):
        parts.append(str(root / f"t38_{n}.pcap"))
        subprocess.run(["editcap", "-t", str(41 * n), str(one), parts[-1]], check=True, capture_output=True)
    out = root / "t38_large.pcap"
    subprocess.run(["mergecap", "-F", "pcap", "-w", str(out), *parts], check=True, capture_output=True)
    return out


class RealSharkd:
    """follow's one session call, on a real sharkd worker."""

    def __init__(self, worker: Sharkd) -> None:
        self.worker = worker

    async def sharkd_call(self, request: Any, method: str, params: dict[str, Any], *, keep: int | None = None) -> Any:
        return await self.worker.call(method, params, keep=keep)


@pytest.mark.skipif(shutil.which("sharkd") is None or shutil.which("mergecap") is None,
                    reason="sharkd and mergecap (wireshark-common) are not installed")
async def test_a_large_stream_s_text_holds_only_what_the_answer_shows(tmp_path: Path) -> None:
    """An 8 MB UDP stream, text=20000: of sharkd's 11 MB follow line only answer_budget(20000) bytes are kept (the
    rest read off the pipe and dropped), and the answer is the same as from the whole line: the same chunks, the
    totals of the whole stream, the cut said."""
    capture = large_udp_stream(tmp_path, copies=24)
    ask = {"follow": "UDP", "filter": "udp.stream eq 0"}
    async with trio.open_nursery() as nursery:
        worker = await Sharkd.start(nursery, tmp_path / "conf")
        try:
            with trio.fail_after(300):
                await worker.load(str(capture))
                whole = await worker.call("follow", ask)
                head = await worker.call("follow", ask, keep=follow.answer_budget(20000))
                text = await follow.stream_text(cast(CaptureSession, RealSharkd(worker)), cast(Any, None), "udp",
                                                "0", 20000)
                again = await worker.call("status")  # the worker goes on: the dropped rest was read off its pipe
        finally:
            await worker.close()
    sizes = [len(base64.b64decode(p["d"])) for p in whole["payloads"]]
    assert sum(sizes) == 24 * 344688 == whole["sbytes"] + whole["cbytes"]
    assert isinstance(head, Cut) and len(head.text) == follow.answer_budget(20000) < head.answer_bytes
    assert head.answer_bytes > 10_000_000 and again["frames"] == 24 * 2004
    assert (text["payload_bytes"], text["shown_bytes"]) == (24 * 344688, 20000)
    want, shown = [], 0
    for p, n in zip(whole["payloads"], sizes, strict=True):
        if shown >= 20000:
            break
        want.append((p["n"], n, follow.ascii_text(base64.b64decode(p["d"])[:20000 - shown])))
        shown += min(n, 20000 - shown)
    assert [(c["frame"], c["bytes"], c["text"]) for c in text["chunks"]] == want
    assert text["cut"].startswith(f"cut at text=20000: 20000 of the stream's {24 * 344688} payload bytes")
