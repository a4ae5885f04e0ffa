"""pcap_follow: the flow a frame belongs to (HTTP/2 stream, Diameter session, SIP call, GTPv2-C tunnel,
TCP or UDP stream), its frames, and for TCP/UDP the payload text as Wireshark's own follow gives it.

What is followed, and by which key: the first of these the frame carries (with `text`, its TCP or UDP
stream whatever it carries above):
- HTTP/2: `tcp.stream` + `http2.streamid` (one stream of one connection);
- Diameter: `diameter.Session-Id`; SIP: `sip.Call-ID`;
- GTPv2-C: the control-plane tunnel, its two ends (address, TEID) as the messages exchange them
  (TS 29.274 5.5.1: a message's header TEID is the receiver's, its Sender F-TEID for Control Plane
  announces the sender's). Starting from the frame, an end is its header TEID at its destination and
  the first top-level F-TEID whose Wireshark interface type is a GTP-C one, at the frame's source (the
  sender's: a PGW S5/S8 F-TEID the SGW passes on has the PGW's address). Every GTPv2 frame sharing an
  end, and Wireshark's request/response pair (`gtpv2.response_in` / `response_to`) of each (a Create
  Session Request is sent to TEID 0), belongs to the tunnel; repeated until nothing is added. A frame
  with no end (Echo) is followed as its request/response exchange (`gtpv2.seq`, Wireshark's pairing).
- TCP / UDP: `tcp.stream` / `udp.stream` (the innermost one of a tunnelled frame); with `text` (bytes),
  the stream's payload as `tshark -q -z follow,tcp,ascii,N` prints it (bytes other than printable
  ASCII, CR and LF as '.'), read from sharkd's own follow, cut at `text` bytes with the cut said; of
  sharkd's answer (the whole stream, in one line) only answer_budget(text) bytes are ever held.

Candidates for a GTPv2 tunnel are asked of sharkd by filter (`gtpv2.teid in {...}`), and only their
trees read: the capture's other GTPv2 frames are never decoded for it.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import TypedDict

from diagd.actors.base import Request
from diagd.actors.pcap.answer_types import FollowAnswer
from diagd.actors.pcap.engine.session import CaptureSession
from diagd.actors.pcap.messages import Follow
from diagd.actors.pcap.shark import tree as tree_mod
from diagd.actors.pcap.shark.sharkd import Cut
from diagd.protocol.errors import DiagdError, ErrorCode

# kind -> the fields a frame must carry to be followed so, in the order they are tried.
KEYS: dict[str, tuple[str, ...]] = {
    "http2": ("http2.streamid", "tcp.stream"), "diameter": ("diameter.Session-Id",), "sip": ("sip.Call-ID",),
    "gtpv2": ("gtpv2.seq",), "tcp": ("tcp.stream",), "udp": ("udp.stream",)}
NAMED = {"diameter": "Diameter Session-Id", "sip": "SIP Call-ID"}
WANTED = {f for fields in KEYS.values() for f in fields}
TRANSPORTS = ("tcp", "udp")
MAX_ROUNDS = 32  # GTPv2 tunnel closure: each round adds the ends the last one found (2 or 3 in practice)
MAX_FOLLOW_TEXT = 1 << 20
# sharkd 4.0's follow has no size option: it answers with every payload of the stream (base64) in one JSON line, its
# totals (sbytes, cbytes) first. Of that line only answer_budget(text) bytes are kept, room for the base64 of `text`
# bytes and each chunk's JSON around it; the rest is read off the pipe and dropped as it arrives (sharkd.Cut).
READ_SLACK = 64 * 1024


async def answer(capture: CaptureSession, request: Request, message: Follow) -> FollowAnswer:
    number = message.frame_number
    frame_tree = (await capture.tree(request, number))["tree"]
    values = tree_mod.field_values(frame_tree, WANTED)
    kind = await _kind(capture, values, message.text_bytes > 0, number, frame_tree)
    if kind == "gtpv2":
        found = await gtpv2_flow(capture, request, number, frame_tree)
    else:
        found = keyed(kind, values)
    flt = message.display_filter
    combined = f"({found.display_filter}) && ({flt})" if flt else found.display_filter
    page = await capture.page(request, combined, message.offset, message.limit)
    result: FollowAnswer = {
        "follow_type": found.follow_type, "follow_key": found.key, "followed": found.followed,
        "follow_display_filter": found.display_filter, "display_filter": combined, "total": page.total,
        "total_exact": page.exact, "frames": page.rows, "has_more": message.offset + len(page.rows) < page.total}
    if "transaction" in found.extra:
        result["transaction"] = found.extra["transaction"]
    if message.text_bytes > 0:
        result["text"] = await stream_text(capture, request, kind, found.key[f"{kind}.stream"],
                                           min(message.text_bytes, MAX_FOLLOW_TEXT))
    elif kind == "tcp" and tree_mod.top_protocols(frame_tree)[-1:] in (["tcp"], ["data"]):
        result["hint"] = f"followed as TCP: the frame carries no protocol above it; {await capture.sbi_hint()}"
    return result


async def _kind(capture: CaptureSession, values: dict[str, list[str]], transport: bool, number: int,
                frame_tree: list[tree_mod.Node]) -> str:
    """What to follow the frame by: the first kind it carries (`transport`: TCP or UDP); a coded error
    naming what it carries when it carries none."""
    present = [k for k, fields in KEYS.items() if all(values.get(f) for f in fields)]
    wanted = [k for k in present if k in TRANSPORTS or not transport]
    if wanted:
        return wanted[0]
    what = "TCP or UDP stream (text needs one)" if transport else \
        "HTTP/2 stream, Diameter Session-Id, SIP Call-ID, GTPv2-C, TCP or UDP stream"
    protocols = tree_mod.top_protocols(frame_tree)
    hint = {"hint": await capture.sbi_hint()} if "tcp" in protocols else {}  # HTTP/2 on a port tshark does not know
    raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"frame {number} carries no {what}", protocols=protocols,
                     followable=present, **hint)


class FoundExtra(TypedDict, total=False):
    transaction: dict[str, Any]  # GTPv2-C: the frame's request/response exchange


@dataclass
class Found:
    follow_type: str
    key: dict[str, Any]
    display_filter: str
    followed: str  # what was followed, by what key, in words
    extra: FoundExtra = field(default_factory=lambda: FoundExtra())


def keyed(kind: str, values: dict[str, list[str]]) -> Found:
    """The flow of a frame by a key it carries (every kind but GTPv2)."""
    if kind == "http2":
        streams = [s for s in values["http2.streamid"] if s != "0"] or values["http2.streamid"]
        key = {"tcp.stream": values["tcp.stream"][0], "http2.streamid": streams[0]}
        return Found("http2.streamid", key, f"tcp.stream == {key['tcp.stream']} && http2.streamid == "
                     f"{key['http2.streamid']}", f"HTTP/2 stream {streams[0]} of TCP stream {key['tcp.stream']}")
    if kind in NAMED:
        name = KEYS[kind][0]
        value = values[name][0]
        return Found(name, {name: value}, f"{name} == {json.dumps(value)}", f"{NAMED[kind]} {value}")
    name = KEYS[kind][0]
    stream = values[name][-1]  # a tunnelled frame's own (innermost) stream
    return Found(name, {name: stream}, f"{name} == {stream}", f"{kind.upper()} stream {stream}")


def answer_budget(most: int) -> int:
    """The bytes of sharkd's follow answer kept to show `most` bytes of text."""
    return 4 * most + READ_SLACK


async def stream_text(capture: CaptureSession, request: Request, kind: str, stream: str, most: int) -> dict[str, Any]:
    """A TCP or UDP stream's payload from sharkd's follow (the tap `tshark -z follow` reads), as its ascii
    mode prints it: one chunk per segment or datagram, cut at `most` bytes. At most answer_budget(most) bytes of
    sharkd's answer are held: the rest of it is read off the pipe and dropped, never decoded."""
    budget = answer_budget(most)
    got = await capture.sharkd_call(request, "follow", {"follow": kind.upper(), "filter": f"{kind}.stream eq {stream}"},
                                    keep=budget)
    header, payloads = _follow_parts(got)
    client, server = _end(header.get("chost"), header.get("cport")), _end(header.get("shost"), header.get("sport"))
    # Payload bytes each end sent: sharkd's own sbytes / cbytes name them the other way (sbytes is the client's).
    client_bytes, server_bytes = int(header.get("sbytes") or 0), int(header.get("cbytes") or 0)
    chunks: list[dict[str, Any]] = []
    shown = 0
    for payload in payloads:
        if shown >= most:
            break
        data = base64.b64decode(payload.get("d") or "")
        if not data:
            continue
        room = most - shown
        chunk: dict[str, Any] = {"frame": payload.get("n"), "from": server if payload.get("s") else client,
                                 "bytes": len(data), "text": ascii_text(data[:room])}
        if len(data) > room:
            chunk["cut"] = True
        shown += min(len(data), room)
        chunks.append(chunk)
    total = client_bytes + server_bytes
    out: dict[str, Any] = {"follow": f"{kind},ascii", "client": client, "server": server,
                           "client_bytes": client_bytes, "server_bytes": server_bytes, "payload_bytes": total,
                           "shown_bytes": shown, "chunks": chunks}
    if shown < total:
        out["cut"] = (f"cut at text={most}: {shown} of the stream's {total} payload bytes are shown, the rest "
                      "left out; a larger text shows more")
        if isinstance(got, Cut) and shown < most:
            out["cut"] += (f"; fewer than text: sharkd's follow answer is {got.answer_bytes} bytes and only its first "
                           f"{budget} (4 x text + {READ_SLACK // 1024} KiB) are kept, the rest skipped undecoded")
    return out


def _follow_parts(got: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the answer's header: ends and byte counts, its payloads) of a whole follow answer, or of the kept head of
    one (sharkd.Cut: the payload objects complete in it)."""
    if not isinstance(got, Cut):
        return got, got.get("payloads") or []
    text = got.text
    result, listed = text.find('"result":'), text.find('"payloads":[')
    if result < 0 or listed < 0:
        return {}, []
    header = json.loads(text[result + len('"result":'):listed].rstrip(",") + "}")
    decoder, at, payloads = json.JSONDecoder(), listed + len('"payloads":['), []
    while True:
        try:
            item, at = decoder.raw_decode(text, at)
        except ValueError:
            break
        payloads.append(item)
        if not text.startswith(",", at):
            break
        at += 1
    return header, payloads


def _end(host: Any, port: Any) -> str:
    host = str(host or "")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def ascii_text(data: bytes) -> str:
    """Bytes as `tshark -z follow,...,ascii` prints them: printable ASCII, CR and LF as they are, others '.'."""
    return "".join(chr(b) if 0x20 <= b < 0x7F or b in (0x0A, 0x0D) else "." for b in data)


# -- GTPv2-C --------------------------------------------------------------------------------------

End = tuple[str, str]  # (address, TEID as Wireshark writes it: 0x0000abcd)


@dataclass
class GtpFrame:
    number: int
    src: str
    dst: str
    teids: list[str]  # header TEIDs other than 0 (several when messages are piggybacked)
    sender: End | None  # the sender's control-plane F-TEID
    seq: list[str]
    pairs: set[int]  # Wireshark's request/response pairing

    @property
    def ends(self) -> set[End]:
        found = {(self.dst, t) for t in self.teids}
        return found | {self.sender} if self.sender is not None else found


def gtp_frame(number: int, frame_tree: list[tree_mod.Node]) -> GtpFrame:
    """What one GTPv2 frame says of its tunnel, from its protocol tree."""
    values = tree_mod.field_values(frame_tree, {"ip.src", "ip.dst", "ipv6.src", "ipv6.dst"})
    src = (values.get("ip.src") or values.get("ipv6.src") or [""])[-1]
    dst = (values.get("ip.dst") or values.get("ipv6.dst") or [""])[-1]
    teids: list[str] = []
    seqs: list[str] = []
    pairs: set[int] = set()
    sender: End | None = None
    for proto in tree_mod.protocol_nodes(frame_tree, {"gtpv2"}):
        for node in proto.get("n") or []:
            name, value = tree_mod.parse_f(str(node.get("f") or ""))
            if name == "gtpv2.teid" and value is not None and int(value, 16):
                teids.append(value)
            elif name == "gtpv2.seq" and value is not None:
                seqs.append(value)
            elif name in ("gtpv2.response_in", "gtpv2.response_to") and value is not None:
                pairs.add(int(value))
            elif sender is None:
                sender = _sender_f_teid(node, src)
    return GtpFrame(number, src, dst, teids, sender, seqs, pairs)


def _sender_f_teid(ie: tree_mod.Node, src: str) -> End | None:
    """A top-level F-TEID IE's (address, TEID) when it is a control-plane one (Wireshark's interface type
    name says GTP-C) with a TEID, at the frame's source address or none."""
    fields: dict[str, tuple[str | None, str]] = {}
    for child in ie.get("n") or []:
        name, value = tree_mod.parse_f(str(child.get("f") or ""))
        fields.setdefault(name, (value, str(child.get("l") or "")))
    kind, key = fields.get("gtpv2.f_teid_interface_type"), fields.get("gtpv2.f_teid_gre_key")
    if kind is None or key is None or key[0] is None or "GTP-C" not in kind[1] or not int(key[0], 16):
        return None
    address = (fields.get("gtpv2.f_teid_ipv4") or fields.get("gtpv2.f_teid_ipv6") or (None, ""))[0]
    return (src, key[0]) if address in (None, src) else None


async def gtpv2_flow(capture: CaptureSession, request: Request, number: int,
                     frame_tree: list[tree_mod.Node]) -> Found:
    """The GTPv2-C tunnel of a frame: its ends and frames, grown from the frame until nothing is added."""
    first = gtp_frame(number, frame_tree)
    seen = {number: first}
    ends, members = set(first.ends), {number}
    last: str | None = None
    for _ in range(MAX_ROUNDS):
        _close(seen, ends, members)
        pending = sorted({p for n in members for p in seen[n].pairs} - set(seen))
        teids = ",".join(sorted({t for _, t in ends}))
        asked = " || ".join(([f"gtpv2.teid in {{{teids}}}", f"gtpv2.f_teid_gre_key in {{{teids}}}"] if teids else [])
                            + ([f"frame.number in {{{','.join(map(str, pending))}}}"] if pending else []))
        if not asked or asked == last:
            break
        last = asked
        numbers = [n for n in await capture.matching(request, f"gtpv2 && ({asked})") if n not in seen]
        for n, found in zip(numbers, await capture.trees_of(request, numbers, keep=False), strict=True):
            seen[n] = gtp_frame(n, found["tree"])
    return _gtpv2_found(first, ends, members, seen)


def _close(seen: dict[int, GtpFrame], ends: set[End], members: set[int]) -> None:
    """Add to `members` every seen frame sharing an end with them or paired with one of them, until none is."""
    grown = True
    while grown:
        grown = False
        paired = {p for n in members for p in seen[n].pairs}
        for n, gtp in seen.items():
            if n not in members and (gtp.ends & ends or n in paired or gtp.pairs & members):
                members.add(n)
                ends |= gtp.ends
                paired |= gtp.pairs
                grown = True


def _gtpv2_found(first: GtpFrame, ends: set[End], members: set[int], seen: dict[int, GtpFrame]) -> Found:
    """The tunnel's key and filter: a clause per end (its TEID in the header of frames to its address), and
    the frames no clause selects (sent to TEID 0) by number."""
    seq = first.seq[0] if first.seq else None
    frames = sorted({first.number, *first.pairs})
    transaction = {"gtpv2.seq": seq, "frames": frames}
    if not ends:
        return Found("gtpv2.seq", transaction, f"gtpv2 && frame.number in {{{','.join(map(str, frames))}}}",
                     f"GTPv2-C exchange of sequence number {seq} (the frame names no tunnel end: no TEID, no "
                     "control-plane F-TEID)")
    ordered = sorted(ends)
    clauses = [f"({'ipv6' if ':' in a else 'ip'}.dst == {a} && gtpv2.teid == {t})" for a, t in ordered]
    by_header = {n for n in members if {(seen[n].dst, t) for t in seen[n].teids} & ends}
    rest = sorted(members - by_header)
    if rest:
        clauses.append(f"frame.number in {{{','.join(map(str, rest))}}}")
    key = {"gtpv2.teid": [{"address": a, "teid": t} for a, t in ordered]}
    ends_text = ", ".join(f"{t} at {a}" for a, t in ordered)
    return Found("gtpv2.teid", key, f"gtpv2 && ({' || '.join(clauses)})",
                 f"GTPv2-C tunnel of TEIDs {ends_text}", {"transaction": transaction})
