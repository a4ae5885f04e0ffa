"""A display filter the index does not translate (index/filters.py), matched by tshark over only the
frames it can match: the frames carrying a layer every match must carry, and every frame their
dissection depends on (query.records_carrying: their TCP streams, their IP ends' frames, fragments,
frames without IP), cut from the file (narrow.py) and read two-pass with the capture's own decoding.

Which layer every match carries is read off the filter's structure, from its protocol names alone:
`dns && dns.qry.name contains "x"` needs `dns`, `A && B` A's layer (or B's), `A || B` one of both, `!A`
none. A protocol's name is narrowed on only where the index itself translates that name (filters.PROTOCOLS:
its name alone matches exactly the frames naming it in frame.protocols, checked on every corpus capture).
A field's protocol is never the ground: Wireshark's dissectors put one protocol's fields in another's
frames (DNS's under mDNS, NAS's in GTPv2 and Diameter AVPs, containers of NGAP in S1AP...), which no list
here could follow, so `dns.qry.name contains "x"` alone is not narrowed (sharkd answers it).
The filter's names must mean the same in a cut: no frame numbers (links to other frames, FT_FRAMENUM),
no numbering of Wireshark's own (stream, association, session indexes), no time since the first frame,
no columns or expert items (their text holds frame numbers), and only fields of protocols that dissect
from their own conversation's frames (the single-pass set). What is not narrowed is not answered here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagd.actors.pcap.index import cut_columns, filters, query
from diagd.actors.pcap.shark.wireshark import FILTER_KEYWORDS

Kinds = tuple[tuple[str, str | None, str | None], ...]  # (name, type, protocol): Catalogue.kinds

# Protocols whose fields mean in a cut what they mean in the whole file when the cut holds what
# records_carrying adds (the single-pass set of warm/first_page.py, less `frame`: each dissects from its
# own and earlier frames of the same conversation).
FIELD_PROTOCOLS = frozenset({
    "eth", "vlan", "sll", "ip", "ipv6", "arp", "icmp", "icmpv6", "udp", "sctp", "tcp", "gtp", "gtpv2", "pfcp",
    "diameter", "ngap", "s1ap", "nas-5gs", "nas-eps", "sip", "sdp", "dns", "x2ap", "gtpprime",
})
# The protocol names a cut is chosen by: those the index translates (their name alone is their layer).
LAYERS = filters.PROTOCOLS - {"frame"}
# Layers under most frames of a capture: a test of one narrows little.
CARRIERS = frozenset({"eth", "vlan", "sll", "ip", "ipv6", "udp", "tcp", "sctp"})
# frame.* fields that are the frame's own (not its number, nor times relative to other frames).
FRAME_OWN = frozenset({"frame.len", "frame.cap_len", "frame.time", "frame.time_epoch", "frame.protocols",
                       "frame.encap_type", "frame.interface_id"})
_NUMBERING = re.compile(r"\.(stream|assoc_index|index|session|connection\.number)$|time_relative$|^_ws\.|^frame\.")
_TOKEN = re.compile(r"""\s*(?:
    (?P<string>r?"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<op>&&|\|\||\^\^|!(?!=)|\(|\)|\{|\}|\[|\])
  | (?P<word>[\w.:\-/$]+)
  | (?P<other>[^\s"'&|()\[\]{}\w]+|[&|])
)""", re.VERBOSE)
_BOOLEAN = {"and": "&&", "or": "||", "not": "!", "xor": "^^"}
# A word that starts with a digit yet is a name (`6lowpan.reassembled.in`), not a number or an address:
# letters before its first dot.
_DIGIT_NAME = re.compile(r"^[0-9][\w\-]*[A-Za-z_][\w\-]*\.")
_NAME = re.compile(r"^[A-Za-z_][\w\-]*(?:\.[\w\-]+)*")  # a word's name part, as Catalogue.kinds reads names
MAX_DEPTH = 100  # nested negations and parentheses read; deeper: not narrowed
# Comparisons that may hold on a frame lacking the field ("all not equal"), and functions that may
# (count() of an absent field is 0): an atom holding one narrows nothing.
_MAY_HOLD_ABSENT = re.compile(r"^(!=|~=|ne|any_ne|all_ne)$", re.IGNORECASE)


@dataclass(frozen=True)
class _Atom:
    names: tuple[str, ...]  # the words of one test, in order
    absent_may_hold: bool
    alone: bool  # one word and nothing else (a protocol's or field's name: "is it there")


@dataclass(frozen=True)
class _Not:
    inner: Expr


@dataclass(frozen=True)
class _Both:
    op: str  # && || ^^
    left: Expr
    right: Expr


Expr = _Atom | _Not | _Both


class _Unreadable(Exception):
    pass


def required_layers(display_filter: str, kinds: Kinds) -> tuple[str, ...] | None:
    """The layers one of which every frame the filter matches carries (sorted), when the filter may be
    matched on a cut of the frames carrying them; None otherwise (its answer comes from elsewhere)."""
    read = _cut_safe(display_filter, kinds)
    if read is None:
        return None
    try:
        needed = _needs(*read)
    except RecursionError:
        return None
    return tuple(sorted(needed)) if needed else None


def cut_safe(display_filter: str, kinds: Kinds) -> bool:
    """Whether the filter means in a cut what it means in the whole file, whatever layer the cut is chosen
    by: its names are no frame numbers, no numbering, only fields of FIELD_PROTOCOLS, all vouched for."""
    return _cut_safe(display_filter, kinds) is not None


def _cut_safe(display_filter: str, kinds: Kinds) -> tuple[Expr, dict[str, tuple[str, str | None]]] | None:
    """The filter read (its tree, and the kind and protocol of each name it holds) when it is cut-safe."""
    if any(_NUMBERING.search(name) and name not in FRAME_OWN for name, _, _ in kinds):
        return None  # whether the catalogue lists it or not (`_ws.col.Info` is no field of -G fields)
    known = {name: (kind, protocol) for name, kind, protocol in kinds if kind is not None}
    for name, (kind, protocol) in known.items():
        if kind == "FT_FRAMENUM" or (protocol not in FIELD_PROTOCOLS and name not in FRAME_OWN):
            return None
    if any(kind is None and "." in name for name, kind, _ in kinds):
        return None  # a dotted word the catalogue does not know: an alias (ssl.*) or a typo, not vouched for
    try:
        tokens = _tokens(display_filter)
        if any(_DIGIT_NAME.match(part.lstrip("-")) for kind, value in tokens if kind == "word"
               for part in value.split("..")):
            return None  # a name starting with a digit (6lowpan.*): no lookup above saw it
        # Every name this reading sees must be one the checks above saw (a name they missed, hidden from
        # them by how it is written, is not vouched for): else nothing is narrowed.
        looked_up = {name for name, _, _ in kinds}
        if any(name not in looked_up and name.lower() not in FILTER_KEYWORDS for kind, value in tokens
               if kind == "word" for part in value.split("..") for name in _NAME.findall(part.lstrip("-"))):
            return None
        parser = _Parser(tokens)
        tree = parser.expression()
        if parser.at != len(tokens):
            return None
    except (_Unreadable, RecursionError):
        return None
    return tree, known


def _tokens(text: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    at = 0
    while at < len(text):
        if text[at:].strip() == "":
            break
        match = _TOKEN.match(text, at)
        if match is None or match.end() == at:
            raise _Unreadable(text[at:at + 20])
        at = match.end()
        kind = match.lastgroup or "other"
        value = match.group(kind)
        if kind == "word" and value.lower() in _BOOLEAN:
            kind, value = "op", _BOOLEAN[value.lower()]
        found.append((kind, value))
    return found


class _Parser:
    """or := and (|| and)*; and := unary (&& unary)*; unary := ! unary | ( or ) | atom. An atom is the
    words and signs of one test; its own brackets (a call's, a set's, a slice's) are part of it."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.at = 0
        self.depth = 0

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def expression(self) -> Expr:
        left = self._and()
        while self._peek() in (("op", "||"), ("op", "^^")):
            op = self.tokens[self.at][1]
            self.at += 1
            left = _Both(op, left, self._and())
        return left

    def _and(self) -> Expr:
        left = self._unary()
        while self._peek() == ("op", "&&"):
            self.at += 1
            left = _Both("&&", left, self._unary())
        return left

    def _unary(self) -> Expr:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Unreadable("nested too deep")
        try:
            return self._unary_inner()
        finally:
            self.depth -= 1

    def _unary_inner(self) -> Expr:
        token = self._peek()
        if token == ("op", "!"):
            self.at += 1
            return _Not(self._unary())
        if token == ("op", "("):
            self.at += 1
            inner = self.expression()
            if self._peek() != ("op", ")"):
                raise _Unreadable("(")
            self.at += 1
            return inner
        return self._atom()

    def _atom(self) -> _Atom:
        words: list[str] = []
        absent_may_hold = False
        depth = 0
        start = self.at
        while (token := self._peek()) is not None:
            kind, value = token
            if depth == 0 and kind == "op" and value in ("&&", "||", "^^", "!", ")"):
                break
            if kind == "op" and value in ("(", "{", "["):
                if value == "(":  # a call: the function's result may hold without the field
                    absent_may_hold = True
                depth += 1
            elif kind == "op" and value in (")", "}", "]"):
                depth -= 1
            elif kind == "word":
                if "$" in value:  # a macro: what it stands for is not read here
                    raise _Unreadable(value)
                words.append(value)
                absent_may_hold |= bool(_MAY_HOLD_ABSENT.match(value))
            elif kind == "other":
                absent_may_hold |= bool(_MAY_HOLD_ABSENT.match(value))
            self.at += 1
        if self.at == start or depth != 0:
            raise _Unreadable("an empty or unbalanced test")
        return _Atom(tuple(words), absent_may_hold, alone=self.at - start == 1 and len(words) == 1)


def _needs(tree: Expr, known: dict[str, tuple[str, str | None]]) -> frozenset[str] | None:
    """The layers one of which a frame meeting `tree` carries; None: a frame with none may meet it."""
    if isinstance(tree, _Atom):
        # Only a protocol's name alone: its layer is in frame.protocols wherever it matches (LAYERS).
        if len(tree.names) == 1 and not tree.absent_may_hold and tree.alone:
            name = tree.names[0]
            if known.get(name, ("", None))[0] == "FT_PROTOCOL" and name in LAYERS:
                return frozenset({name})
        return None
    if isinstance(tree, _Not):
        return None
    needs_left, needs_right = _needs(tree.left, known), _needs(tree.right, known)
    if tree.op == "&&":
        # Either side's layers will do: the one fewer frames carry (no carrier layer, fewer layers).
        options = [n for n in (needs_left, needs_right) if n is not None]
        return min(options, key=lambda n: (bool(n & CARRIERS), len(n))) if options else None
    if needs_left is None or needs_right is None:  # || and ^^: either side alone
        return None
    return needs_left | needs_right


@dataclass(frozen=True)
class Narrowed:
    """The frames a filter matches (whole-file numbers, ascending), and what tshark read to find them."""

    numbers: list[int]
    layers: tuple[str, ...]
    cut_frames: int  # frames cut from the capture and read

    def note(self, frames: int) -> str:
        return (f"matched by tshark -Y over {self.cut_frames} of the capture's {frames} frames, cut from the file "
                f"by its index: those carrying {' or '.join(self.layers)}, with what their dissection depends on "
                "(their TCP streams, their IP ends' other frames, frames without IP); their rows are the index's")


def seam_note(meta: dict[str, Any]) -> str | None:
    """What a chunked index's seam frames mean for a match read from a cut (None: there are none)."""
    how = query.chunked(meta)
    if not how or not how["seam_frames"]:
        return None
    return (f"the frames cut were chosen by the index's rows, read in {how['chunks']} chunks: its "
            f"{how['seam_frames']} seam frames' layers and streams may differ from one pass over the whole file, "
            "so a match among them (or among the frames they ride with) may be missed")


async def matching(capture: Path, index: Path, frames: int, argv: list[str], display_filter: str,
                   layers: tuple[str, ...], kept: int) -> Narrowed:
    """The frames of `capture` (its index at `index`, `frames` frames; `argv`: its own two-pass tshark
    command) that `display_filter` matches, read from a cut of the frames carrying `layers`
    (required_layers) and what they depend on. Each match's layers must be the index's: else, as for a
    file that cannot be cut, NOT_FOUND with `index_unanswered` (the tool asks the loaded capture: never a
    silently different answer); more than `kept` matches are refused."""
    # With no frame to cut, tshark still reads the filter over the empty cut, with the capture's own
    # decoding (a preference may define a field): a wrong filter never answers "no match".
    numbers: list[int] = []
    cut = await cut_columns.read(capture, index, frames, argv, display_filter, cut_columns.Fields(()), layers,
                                 lambda number, _: numbers.append(number), purpose="narrow this filter",
                                 max_frames=kept, too_many="narrow it")
    return Narrowed(numbers, layers, cut)
