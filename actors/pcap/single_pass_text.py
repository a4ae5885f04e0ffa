"""The text `tshark -V` prints in a single pass, and which of its lines a second pass may change.

pcap_text_search on a capture still loading searches the frames a single early-stopping tshark
prints (first_page's idea for text): sharkd's text, like `tshark -2 -V`, is two-pass. A single pass
does not know what later frames tell, so some lines differ: links to later frames ("[Answer In:
N]", "[Reassembled PDU in frame: N]") are absent, TCP's conversation completeness is the state so
far, and a few protocols decode differently until a later frame reassembles them (TLS records, a
Redis array, an HTTP/2 body). Every line is either *exact* (the second pass prints it as is) or
marked as one that may differ; the lines a second pass adds are all of the kinds named here.

Which lines differ is measured, not guessed: tests/e2e/test_pcap_text_provisional.py compares the
single-pass and two-pass `tshark -V` text of every frame of every corpus capture and fails on a
difference these rules do not cover, and on a rule no difference needs.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

# A frame of `tshark -V` begins with this line (its number), at the start of a line.
FRAME_START = r"Frame \d+: "
_FRAME = re.compile(r"Frame (\d+): ")
_HEX_DUMP = re.compile(r"[0-9a-f]{4,8}  ")

# Layers (top-level lines of `tshark -V`, digits as N) whose every line a second pass may change:
# the record a later segment completes is decoded only then (TLS record versions and handshakes,
# a Redis array, an HTTP/2 JSON body, an OpenFlow message), and bytes left undecoded until then.
MAY_DIFFER_LAYERS = frozenset({
    "Transport Layer Security", "REdis Serialization Protocol", "HyperText Transfer Protocol N", "OpenFlow N.N",
    "Data", "(bytes)",
})
# Lines (stripped) of other layers a second pass may change or add, one rule per kind of line:
# links to later frames, state that later frames complete, and values numbered in order of
# discovery (a stream index, a SIP call's generated id).
MAY_DIFFER_LINES: tuple[str, ...] = (
    r"\[Conversation completeness: ",  # TCP: the state so far
    r"\[(Answer|Response|Request) In: \d+\]",  # Diameter, DNS, GTPv2, PFCP, NTP
    r"\[Response in frame: \d+\]",  # HTTP
    r"\[Response frame: \d+\]",  # ICMP
    r"\[Response To: \d+\]",  # PFCP, a response seen before its request's link
    r"\[Response Time: ",
    r"\[Delta Time: ",  # NTP
    r"\[Reassembled IPv\d in frame: \d+\]",
    r"\[Reassembled PDU in frame: \d+\]",  # TCP
    r"Reassembled Message in frame: \d+",  # SCTP
    r"Frame: \d+, payload: ",  # SCTP: a fragment list that later frames complete
    r"\[iRTT: ",  # TCP: needs the handshake's end
    r"\[PDU Size: \d+\]",  # TCP
    r"\[HTTP request \d+/\d+\]",  # SSDP/HTTP: the count of requests in the conversation
    r"\[Next request in frame: \d+\]",
    r"\[Protocols in frame: ",  # the frame's protocols, when a later frame changes its decoding
    r"\[Generated Call-ID: ",  # SIP, MEGACO
    r"\[Context: \d+\]",  # SIP, MEGACO: the call's context
    r"\[Stream index: \d+\]",  # UDP: numbered in order of discovery
    r"\[Time since first frame: ",  # UDP: of its stream
    r"Cumulative TSN ACK \(relative\): ",  # SCTP: relative to a TSN maybe not seen yet
    r"\[This TSN was retransmitted ",  # SCTP
)
_MAY_DIFFER_LINE = re.compile("|".join(f"(?:{rule})" for rule in MAY_DIFFER_LINES))
# Layers the corpus has (so measured): a line of any other layer may differ.
MEASURED_LAYERS = frozenset({
    "(bytes)", "ANSI CN.N", "Address Resolution Protocol", "Data", "Diameter Protocol", "Domain Name System",
    "Ethernet II", "Frame N", "GPRS Tunneling Protocol", "GPRS Tunneling Protocol VN",
    "Generic Routing Encapsulation", "HyperText Transfer Protocol N", "Hypertext Transfer Protocol",
    "ITU-T Recommendation T.N", "Internet Control Message Protocol", "Internet Control Message Protocol vN",
    "Internet Protocol Version N", "JavaScript Object Notation", "Licklider Transmission Protocol",
    "Line-based text data", "Linux cooked capture vN", "MEGACO", "MIME Multipart Media Encapsulation",
    "Multicast Domain Name System", "MySQL Protocol", "NG Application Protocol", "Network Time Protocol",
    "OpenFlow N.N", "OpenVPN Protocol", "Packet Forwarding Control Protocol", "REdis Serialization Protocol",
    "RFC N RTP Event", "Real-Time Transport Protocol", "Real-time Transport Control Protocol",
    "SN Application Protocol", "SSH Protocol", "Session Initiation Protocol", "Simple Service Discovery Protocol",
    "Stream Control Transmission Protocol", "Transmission Control Protocol", "Transport Layer Security",
    "User Datagram Protocol", "WebSocket", "[Malformed Packet", "[N Reassembled TCP Segments",
})


@dataclass(frozen=True)
class FrameText:
    number: int
    text: str


def frames_of(lines: list[str]) -> list[FrameText]:
    """`tshark -V` output split into frames (the blank line that ends each one dropped)."""
    frames: list[FrameText] = []
    number: int | None = None
    body: list[str] = []
    for line in [*lines, "Frame 0: "]:
        found = _FRAME.match(line)
        if found:
            if number is not None:
                while body and not body[-1]:
                    body.pop()
                frames.append(FrameText(number, "\n".join(body)))
            number, body = int(found.group(1)), []
        if number is not None:
            body.append(line)
    return frames


def layer_of(line: str) -> str:
    """The layer a top-level line opens, as the rules name it: "Internet Protocol Version 4, Src: ..."
    -> "Internet Protocol Version N"; a hex dump line -> "(bytes)"."""
    if _HEX_DUMP.match(line):
        return "(bytes)"
    head = re.match(r"\[?[^,(:\[]*", line)
    return re.sub(r"\d+", "N", head.group().strip() if head else "")


def layered(text: str) -> list[tuple[str, str]]:
    """Each line of a frame's text with the layer it is in."""
    layer = ""
    out = []
    for line in text.split("\n"):
        if line and not line[0].isspace():
            layer = layer_of(line)
        out.append((layer, line))
    return out


def may_differ(layer: str, line: str) -> bool:
    """Whether a second pass may print this line of `layer` otherwise, or not at all."""
    if layer in MAY_DIFFER_LAYERS or layer not in MEASURED_LAYERS:
        return True
    return _MAY_DIFFER_LINE.match(line.strip()) is not None


class Lines:
    """One frame's text, asked at offsets whether the line there may differ after a second pass (the
    layers found once by a scan for top-level lines, not line by line)."""

    def __init__(self, text: str) -> None:
        self.text = text
        tops = [(m.start(), m.group()) for m in _TOP_LEVEL.finditer(text)]
        self._starts = [start for start, _ in tops]
        self._layers = [layer_of(line) for _, line in tops]

    def may_differ(self, offset: int) -> bool:
        text = self.text
        start = text.rfind("\n", 0, offset) + 1
        end = text.find("\n", offset)
        line = text[start:end if end >= 0 else None]
        index = bisect.bisect_right(self._starts, start) - 1
        return may_differ(self._layers[index] if index >= 0 else "", line)


_TOP_LEVEL = re.compile(r"^\S[^\n]*", re.MULTILINE)
