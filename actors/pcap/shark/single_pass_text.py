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
import re._compiler as sre_compile  # the stdlib's own: one item of a shape compiled as re compiles it
import re._parser as sre_parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeAlias, cast

# A frame of `tshark -V` begins with this line (its number), at the start of a line.
FRAME_START = r"Frame \d+: "
_FRAME = re.compile(r"\nFrame (\d+): ")
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


# A *plain* frame: its single-pass text has no line in a layer that may differ (MAY_DIFFER_LAYERS, or
# a layer not measured). In a plain frame a second pass opens no new layer and changes or adds only
# lines of these whole-line shapes (stripped), each in the layers named: links to later frames and
# the state they complete, all with values of a known form except a SIP/MEGACO generated Call-ID.
# Measured like the rules above (test_pcap_text_provisional: every difference of every plain
# frame of the corpus is one of these, and every shape is needed). What it is for: a literal that
# a single pass does not find in a plain frame, and that no line of these shapes in the frame's
# layers can hold, is not in the two-pass text either (pcap_text_search rules such frames out).
_LINK = r"\[(Answer|Response|Request) In: \d+\]"
_SECONDS = r"-?\d+\.\d+ seconds"
PLAIN_FRAME_LINES: dict[str, tuple[str, ...]] = {
    "Diameter Protocol": (_LINK,),
    "Domain Name System": (_LINK,),
    "GPRS Tunneling Protocol VN": (_LINK,),
    "Network Time Protocol": (_LINK, rf"\[Delta Time: {_SECONDS}\]"),
    "Packet Forwarding Control Protocol": (_LINK, r"\[Response To: \d+\]", rf"\[Response Time: {_SECONDS}\]"),
    "Transmission Control Protocol": (
        r"\[Conversation completeness: (Complete|Incomplete)(, [A-Z_]+)? \(\d+\)\]", rf"\[iRTT: {_SECONDS}\]",
        r"\[Reassembled PDU in frame: \d+\]"),
    "Hypertext Transfer Protocol": (r"\[Response in frame: \d+\]",),
    "Session Initiation Protocol": (r"\[Generated Call-ID: .+\]", r"\[Context: \d+\]"),
    "MEGACO": (r"\[Generated Call-ID: .+\]", r"\[Context: \d+\]"),
    "User Datagram Protocol": (r"\[Stream index: \d+\]", rf"\[Time since first frame: {_SECONDS}\]"),
    "Stream Control Transmission Protocol": (
        r"Cumulative TSN ACK \(relative\): \d+",
        rf"\[This TSN was retransmitted (\d+ times?|in frame \d+ \({_SECONDS} after this frame\))\]",
        r"Reassembled Message in frame: \d+", r"Frame: \d+, payload: \d+-\d+ \(\d+ bytes?\)"),
    "Simple Service Discovery Protocol": (r"\[HTTP request \d+/\d+\]", r"\[Next request in frame: \d+\]"),
}


def layers_of(text: str) -> set[str]:
    """The layers of a frame's text (its top-level lines, as the rules name them)."""
    return {layer_of(line) for _, line in _top_level(text)}


def is_plain(layers: set[str]) -> bool:
    return not any(layer in MAY_DIFFER_LAYERS or layer not in MEASURED_LAYERS for layer in layers)


def layers_that_may_gain(literal: str, case_sensitive: bool) -> frozenset[str]:
    """The layers in which a second pass may add or change a line of a plain frame so that it holds
    `literal` (no newline): those with a PLAIN_FRAME_LINES shape some line of which, indented, could
    contain it. Asked once per search (~0.5 ms), not per frame: `cannot_gain` takes the answer."""
    return frozenset(layer for layer, automata in _SHAPE_AUTOMATA[case_sensitive].items()
                     if any(_may_contain(compiled, literal, case_sensitive) for compiled in automata))


def cannot_gain(text: str, may_gain: frozenset[str]) -> bool:
    """Whether the two-pass text of this frame cannot hold a literal given that its single-pass `text`
    does not: the frame is plain and none of its layers is one that may gain a line that holds it
    (`may_gain`: layers_that_may_gain of the literal)."""
    layers = layers_of(text)
    return is_plain(layers) and not layers & may_gain


def may_contain(pattern: str, literal: str, case_sensitive: bool) -> bool:
    """Whether some string that `pattern` matches whole contains `literal`: the pattern's NFA run
    over the literal from every state at once (every state of these patterns leads to the end).
    A construct it does not model makes the answer True (unsure is yes)."""
    return _may_contain(_nfa_of(pattern, case_sensitive), literal, case_sensitive)


_Compiled: TypeAlias = "tuple[_Nfa, frozenset[int]] | None"  # an automaton, where its runs start; None: unmodelled


def _may_contain(compiled: _Compiled, literal: str, case_sensitive: bool) -> bool:
    """may_contain, by the pattern's automaton (_nfa_of)."""
    if compiled is None or "\n" in literal or (not case_sensitive and not literal.isascii()):
        return True
    nfa, start = compiled
    states = set(start)
    for char in literal:
        states = nfa.closure({to for state in states for accepts, to in nfa.moves[state] if accepts(char)})
        if not states:
            return False
    return True


def _nfa_of(pattern: str, case_sensitive: bool) -> _Compiled:
    """The pattern's automaton and the closure of all its states (where a run over a literal starts).
    None: a construct it does not model."""
    parsed = sre_parse.parse(pattern, 0 if case_sensitive else re.IGNORECASE)
    nfa = _Nfa(parsed.state)
    try:
        nfa.build(list(parsed), nfa.new())
    except _Unmodelled:
        return None
    return nfa, frozenset(nfa.closure(set(range(len(nfa.moves)))))


class _Unmodelled(Exception):
    pass


class _Nfa:
    """Thompson's construction over re's parse tree: per state, moves on one character (a
    predicate compiled from that single item) and empty moves."""

    def __init__(self, state: sre_parse.State) -> None:
        self.state = state
        self.moves: list[list[tuple[Callable[[str], object], int]]] = []
        self.empty: list[list[int]] = []

    def new(self) -> int:
        self.moves.append([])
        self.empty.append([])
        return len(self.moves) - 1

    def build(self, items: list[tuple[object, object]], start: int) -> int:
        at = start
        for op, av in items:
            if op in (sre_parse.LITERAL, sre_parse.NOT_LITERAL, sre_parse.IN, sre_parse.ANY):
                matcher = sre_compile.compile(sre_parse.SubPattern(self.state, [(op, av)]), self.state.flags)
                to = self.new()
                self.moves[at].append((matcher.fullmatch, to))
                at = to
            elif op is sre_parse.SUBPATTERN:
                at = self.build(list(av[3]), at)  # type: ignore[index]
            elif op is sre_parse.BRANCH:
                end = self.new()
                for alternative in av[1]:  # type: ignore[index]
                    self.empty[self.build(list(alternative), at)].append(end)
                at = end
            elif op in (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT):
                low, high, body = cast(tuple[int, int, Any], av)
                for _ in range(low):
                    at = self.build(list(body), at)
                if high == sre_parse.MAXREPEAT:
                    self.empty[self.build(list(body), at)].append(at)
                else:
                    for _ in range(high - low):
                        end = self.build(list(body), at)
                        self.empty[at].append(end)
                        at = end
            else:
                raise _Unmodelled(op)
        return at

    def closure(self, states: set[int]) -> set[int]:
        todo = list(states)
        while todo:
            for to in self.empty[todo.pop()]:
                if to not in states:
                    states.add(to)
                    todo.append(to)
        return states


# Every PLAIN_FRAME_LINES shape's automaton (indented, as a line of the text), for either case: built at
# import, ~15 ms for all, where a search for a new literal paid ~14 ms building them.
_SHAPE_AUTOMATA: Mapping[bool, Mapping[str, tuple[_Compiled, ...]]] = MappingProxyType({
    case_sensitive: MappingProxyType({layer: tuple(_nfa_of(rf"[ ]*(?:{shape})", case_sensitive) for shape in shapes)
                                      for layer, shapes in PLAIN_FRAME_LINES.items()})
    for case_sensitive in (True, False)})


@dataclass(frozen=True)
class FrameText:
    number: int
    text: str


def frames_of(text: str) -> list[FrameText]:
    """`tshark -V` output split into frames (the blank line that ends each one dropped); none in an
    output without a frame (a filter that matched nothing, a capture without packets)."""
    # One scan for the frame starts (a literal prefix after a newline), not a match per line.
    starts = list(_FRAME.finditer("\n" + text))
    if not starts:
        return []
    ends = [start.start() for start in starts[1:]] + [len(text)]
    return [FrameText(int(start.group(1)), text[start.start():end].rstrip("\n"))
            for start, end in zip(starts, ends, strict=True)]


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
        tops = _top_level(text)
        self._starts = [start for start, _ in tops]
        self._layers = [layer_of(line) for _, line in tops]

    def may_differ(self, offset: int) -> bool:
        text = self.text
        start = text.rfind("\n", 0, offset) + 1
        end = text.find("\n", offset)
        line = text[start:end if end >= 0 else None]
        index = bisect.bisect_right(self._starts, start) - 1
        return may_differ(self._layers[index] if index >= 0 else "", line)


# A top-level line (no indentation) after a newline: a search for "\n" first, ~4x faster over
# megabytes of -V text than "^\S" in MULTILINE mode, which is tried at every position.
_TOP_LEVEL = re.compile(r"\n(\S[^\n]*)")


def _top_level(text: str) -> list[tuple[int, str]]:
    """(offset, line) of each top-level line of a frame's text."""
    first = [(0, text.split("\n", 1)[0])] if text[:1] and not text[:1].isspace() else []
    return first + [(m.start(1), m.group(1)) for m in _TOP_LEVEL.finditer(text)]
