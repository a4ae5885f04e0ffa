"""Subscriber-identity masking for pcap tool results (`[pcap] mask_subscriber_ids = true`).

Every pcap tool's result, error and progress message passes through `SubscriberMask.guard` (guard.py), wired
once in `register()` (actors/pcap/tools.py), so a tool added later is masked without doing anything.
Two sources decide what is hidden:

1. The identities actually in the capture. One tshark pass per capture and decoding lists IMSIs,
   SUCI MSINs, MSISDNs, SIP/tel numbers and identities embedded in text (Diameter Session-Id, SBI
   paths, JSON). Wherever those digits show up afterwards (decimal text, a hex string of TBCD or
   ASCII bytes, a hex dump), they become '*'.
2. Patterns that need no capture: `imsi-…`, `IMSI…`, `supi`, `suci-…`, `msisdn-…`, `tel:`,
   `sip:<digits>@`, decoded-text labels (`MSIN: …`, `E.164 number (MSISDN): …`) and result keys
   that name an identity field (`e212.imsi`, `suci_msin`).

Masking keeps lengths (one '*' per hidden character), so offsets, hex-dump columns and reported
file sizes stay true. IMSIs keep their first five digits (MCC + a 2-digit MNC: a 3-digit MNC loses
its last digit, which hides more, never less). Filters, sorting and searches run on the real values
inside the actor; only what leaves a tool is masked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from diagd.actors.pcap.shark.tree import HEX_CELLS_WIDTH, HEX_TEXT_GAP, hex_line

log = structlog.get_logger("diagd.pcap.mask")

IMSI_KEEP = 5  # MCC + 2-digit MNC stay readable: enough to tell home from roaming subscribers
MIN_DIGITS = 7  # shorter numbers (SIP extensions such as 101) are masked only where context says so
NIBBLE_MIN = 9  # identities searched in TBCD nibbles need more digits: less context, more coincidence
EDGE_MIN = 6  # a digit run cut by a snippet or byte budget is masked when it is a piece of an identity
MAX_CAPTURES = 64  # identity lists kept (one per capture + decoding)

# Fields whose values are identities, by kind (checked against `tshark -G fields` of 4.0).
IMSI_FIELDS = ("e212.imsi", "e212.assoc.imsi", "diameter.3GPP-IMSI", "diameter.User-Name", "gsm_a.rr.ec_imsi")
MSIN_FIELDS = ("nas_5gs.mm.suci.msin",)
NUMBER_FIELDS = ("e164.msisdn", "e164.isdn", "e164.calling_party_number.digits", "e164.called_party_number.digits",
                 "diameter.Subscription-Id-Data", "pfcp.user_id.gpsi",
                 "nas_eps.esm.remote_ue_context_list.ue_context.msisdn",
                 "sip.r-uri.user", "sip.from.user", "sip.to.user", "sip.contact.user", "sip.pai.user",
                 "sip.ppi.user", "sip.pmiss.user")
# Free text that may embed identities (`imsi-…` in SBI paths, `IMSI…` in Session-Ids, JSON supi/gpsi).
TEXT_FIELDS = ("diameter.Session-Id", "http.request.uri", "http.location", "http2.headers.path",
               "http2.headers.location", "json.value.string", "nas_5gs.mm.suci.nai", "pfcp.user_id.supi",
               "sip.r-uri", "sip.from.addr", "sip.to.addr", "sip.pai.addr", "sip.ppi.addr")
ALL_FIELDS = IMSI_FIELDS + MSIN_FIELDS + NUMBER_FIELDS + TEXT_FIELDS


def _stars(text: str) -> str:
    return "*" * len(text)


def _keep_imsi(digits: str) -> str:
    return digits[:IMSI_KEEP] + _stars(digits[IMSI_KEEP:]) if len(digits) > IMSI_KEEP + 4 else _stars(digits)


# Context patterns: each keeps group 1 and masks group 2 (IMSI-like ones keep MCC+MNC of group 2).
_IMSI_CONTEXT = re.compile(r"(?i)((?<![a-z])(?:imsi|supi)[-:_ ]?)(\d{6,16})")
_NUMBER_CONTEXT = re.compile(r"(?i)((?<![a-z])(?:msisdn|gpsi|tel|e164)[-:_ ]?\+?)(\d{3,})")
_SUCI_CONTEXT = re.compile(r"(?i)((?<![a-z])suci-\d-\d{3}-\d{2,3}-[0-9a-f]{1,4}-\d{1,2}-\d{1,3}-)([0-9a-f]+)")
# A SIP/SIPS URI user part that starts with digits (`sip:101@`, `sip:+1226…@`, `sip:0619…-ab@`);
# the lookahead wants the '@', so `sip:10.0.0.1:5060` (a host) stays as it is.
_SIP_CONTEXT = re.compile(r"(?i)((?<![a-z])sips?:\+?)(\d{3,})(?=[^\s@<>;\"',:]*@)")
# Decoded-text labels (tshark -V wording) followed by the value, possibly after `val=` (Diameter AVP
# summary lines) on the same line.
_LABEL_CONTEXT = re.compile(
    r"(?i)((?:imsi|msin|msisdn|supi|gpsi|user part|user-name|subscription-id-data|e\.164 number|"
    r"calling party number digits|called party number digits)[^\n]{0,60}?(?:==\s*\"?|[:=]\s*|\s\(|val=)\+?)(\d{3,})")
_CONTEXTS = (_IMSI_CONTEXT, _NUMBER_CONTEXT, _SUCI_CONTEXT, _SIP_CONTEXT, _LABEL_CONTEXT)

# Result keys naming an identity: their digit runs are masked whatever the capture holds.
_ID_KEY = re.compile(r"(?i)(imsi|msin|msisdn|supi|gpsi|suci|isdn|user[-_ ]?name|user[-_ ]?id|user[-_ ]part|"
                     r"subscription-id-data|party_number|(?:^|\.)user$)")
# Not digits next to '*': those are the MCC+MNC an earlier rule kept on purpose.
_KEY_DIGITS = re.compile(r"(?<![A-Za-z0-9_.*])\+?\d{3,}(?![\d*])")
_DIGITS = re.compile(r"\d+")
_HEX_TOKEN = re.compile(r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{8,}(?![0-9A-Fa-f])")


@dataclass(frozen=True)
class Identities:
    """Digit strings of the subscriber identities of a capture (only digits, no '+' or prefix)."""

    imsis: frozenset[str] = frozenset()
    numbers: frozenset[str] = frozenset()  # MSISDNs, SIP/tel numbers: masked whole
    msins: frozenset[str] = frozenset()  # the tail of an IMSI: masked where a digit run ends with it

    def __or__(self, other: Identities) -> Identities:
        return Identities(self.imsis | other.imsis, self.numbers | other.numbers, self.msins | other.msins)

    def __len__(self) -> int:
        return len(self.imsis | self.numbers | self.msins)


def identities_from(fields: Mapping[str, Iterable[str]]) -> Identities:
    """Sort collected field values into identities; free text is searched with the context patterns."""
    imsis: set[str] = set()
    numbers: set[str] = set()
    msins: set[str] = set()
    for name, values in fields.items():
        for value in values:
            if name in IMSI_FIELDS:
                # diameter.User-Name is an IMSI on S6a but a NAI elsewhere: only all-digit values count.
                if value.isdigit() and len(value) >= MIN_DIGITS:
                    imsis.add(value)
            elif name in MSIN_FIELDS:
                if value.isdigit() and len(value) >= MIN_DIGITS:
                    msins.add(value)
            elif name in NUMBER_FIELDS:
                numbers.update(d for d in _DIGITS.findall(value) if len(d) >= MIN_DIGITS)
            if name in TEXT_FIELDS or name in NUMBER_FIELDS:
                imsis.update(m.group(2) for m in _IMSI_CONTEXT.finditer(value) if len(m.group(2)) >= MIN_DIGITS)
                for pattern in (_NUMBER_CONTEXT, _SIP_CONTEXT):
                    numbers.update(m.group(2) for m in pattern.finditer(value) if len(m.group(2)) >= MIN_DIGITS)
                msins.update(m.group(2) for m in _SUCI_CONTEXT.finditer(value)
                             if m.group(2).isdigit() and len(m.group(2)) >= MIN_DIGITS)
    return Identities(frozenset(imsis), frozenset(numbers - imsis), frozenset(msins))


class Masker:
    """Masks text and JSON-like values against a set of identities plus the context patterns."""

    def __init__(self, ids: Identities) -> None:
        self.imsis = ids.imsis
        self.numbers = ids.numbers - ids.imsis
        self.msins = ids.msins
        full = self.imsis | self.numbers
        self.full_lengths = sorted({len(x) for x in full if len(x) >= MIN_DIGITS})
        self.msin_lengths = sorted({len(x) for x in self.msins if len(x) >= MIN_DIGITS})
        # Pieces of identities, for digit runs cut at the edge of a string (snippets, byte budgets).
        every = [x for x in full | self.msins if len(x) >= MIN_DIGITS]
        self.heads = {x[:n] for x in every for n in range(EDGE_MIN, len(x))}
        self.tails = {x[-n:] for x in every for n in range(EDGE_MIN, len(x))}

    # -- values -----------------------------------------------------------------------------

    def value(self, value: Any, key: str | None = None) -> Any:
        """A JSON-like value with every string (keys included) masked; identity keys mask harder."""
        if isinstance(value, str):
            masked = self.text(value)
            if key is not None and _ID_KEY.search(key):
                masked = self._by_key(key, masked)
            return masked
        if isinstance(value, dict):
            return {self.text(k) if isinstance(k, str) else k: self.value(v, k if isinstance(k, str) else key)
                    for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v, key) for v in value]
        if isinstance(value, int) and not isinstance(value, bool):
            shown = self.value(str(value), key)
            return value if shown == str(value) else shown  # an identity held as a number
        return value

    @staticmethod
    def _by_key(key: str, text: str) -> str:
        if "msin" in key.lower():
            return _stars(text)  # an MSIN has no public part
        keep = re.search(r"(?i)imsi|supi", key) is not None

        def hide(m: re.Match[str]) -> str:
            digits = m.group()
            plus = "+" if digits.startswith("+") else ""
            digits = digits.removeprefix("+")
            return plus + (_keep_imsi(digits) if keep else _stars(digits))

        return _KEY_DIGITS.sub(hide, text)

    # -- text -------------------------------------------------------------------------------

    def text(self, text: str) -> str:
        if not text or not any(c.isdigit() for c in text):
            return text
        if "  " not in text or not _looks_like_hexdump(text):
            return self._plain(text)
        out: list[str] = []
        block: list[tuple[str, bytes, str]] = []
        plain: list[str] = []
        for line in text.split("\n"):
            row = _hexdump_row(line)
            if row is not None:
                if plain:
                    out.append(self._plain("\n".join(plain)))
                    plain = []
                block.append(row)
                continue
            if block:
                out.append(self._hexdump(block))
                block = []
            plain.append(line)
        if block:
            out.append(self._hexdump(block))
        if plain:
            out.append(self._plain("\n".join(plain)))
        return "\n".join(out)

    def _plain(self, text: str, bytes_view: bool = True) -> str:
        hidden = self._hidden_chars(text, bytes_view)
        return "".join("*" if hide else c for c, hide in zip(text, hidden, strict=True))

    def _hidden_chars(self, text: str, bytes_view: bool) -> bytearray:
        """One flag per character: set where a rule hides it (rules only ever add flags)."""
        hidden = bytearray(len(text))
        for pattern in _CONTEXTS:
            for m in pattern.finditer(text):
                start, end = m.span(2)
                imsi_like = pattern is _IMSI_CONTEXT or (pattern is _LABEL_CONTEXT and re.search(
                    r"(?i)imsi|supi", m.group(1)) is not None)
                shown = _keep_imsi(m.group(2)) if imsi_like else _stars(m.group(2))
                for i, c in enumerate(shown, start):
                    if c == "*":
                        hidden[i] = 1
        for m in _DIGITS.finditer(text):
            if text[max(0, m.start() - 2):m.start()] in ("0x", "0X"):
                continue  # a number literal (TEID, SEID, flags), never an identity's digits
            whole = m.start() == 0 and m.end() == len(text)
            for start, end in self._decimal(m.group(), at_start=m.start() == 0 and not whole,
                                            at_end=m.end() == len(text) and not whole):
                hidden[m.start() + start:m.start() + end] = b"\x01" * (end - start)
        if bytes_view:
            for m in _HEX_TOKEN.finditer(text):
                token = m.group()
                if len(token) % 2 or text[max(0, m.start() - 2):m.start()] in ("0x", "0X"):
                    continue
                for index in self._hidden_bytes(bytes.fromhex(token), nested=True):
                    hidden[m.start() + 2 * index:m.start() + 2 * index + 2] = b"\x01\x01"
        return hidden

    def _decimal(self, run: str, *, at_start: bool = False, at_end: bool = False) -> list[tuple[int, int]]:
        """Spans of a digit run to hide: an identity as the whole run, at its end (after a dial
        prefix), anywhere for long ones, an MSIN at the end (after MCC+MNC), or a piece of one cut at
        the string's edge."""
        spans: list[tuple[int, int]] = []
        n = len(run)
        for length in self.full_lengths:
            if length > n:
                break
            starts: Iterable[int] = range(n - length + 1) if length >= 12 else (n - length,)
            for i in starts:
                piece = run[i:i + length]
                if piece in self.imsis:
                    spans.append((i + IMSI_KEEP, i + length))
                elif piece in self.numbers:
                    spans.append((i, i + length))
        for length in self.msin_lengths:
            if length <= n and run[n - length:] in self.msins:
                spans.append((n - length, n))
        if not spans and n >= EDGE_MIN:  # never a whole string: a short value is not a cut identity
            if at_start and run in self.tails:
                spans.append((0, n))
            elif at_end and run in self.heads:
                spans.append((min(IMSI_KEEP, n) if any(run == x[:n] for x in self.imsis) else 0, n))
        return spans

    def _anywhere(self, run: str, with_msins: bool) -> list[tuple[int, int]]:
        """Spans of identities anywhere in a digit run (TBCD nibbles carry no boundaries)."""
        spans: list[tuple[int, int]] = []
        n = len(run)
        lengths = [(x, False) for x in self.full_lengths if x >= NIBBLE_MIN]
        if with_msins:
            lengths += [(x, True) for x in self.msin_lengths if x >= NIBBLE_MIN]
        for length, msin in lengths:
            for i in range(n - length + 1):
                piece = run[i:i + length]
                if msin:
                    if piece in self.msins:
                        spans.append((i, i + length))
                elif piece in self.imsis:
                    spans.append((i + IMSI_KEEP, i + length))
                elif piece in self.numbers:
                    spans.append((i, i + length))
        return spans

    def _hidden_bytes(self, data: bytes, nested: bool) -> set[int]:
        """Indices of bytes that carry identity digits, as ASCII text or as TBCD nibbles."""
        hidden: set[int] = set()
        shown = "".join(chr(b) if 32 <= b < 127 else "." for b in data)
        if any(c.isdigit() for c in shown):
            flags = self._hidden_chars(shown, bytes_view=False)
            hidden.update(i for i, flag in enumerate(flags) if flag)
        # TBCD: low nibble first; 0xa-0xf (filler, flags) break a run of digits.
        nibbles = "".join("0123456789xxxxxx"[b & 15] + "0123456789xxxxxx"[b >> 4] for b in data)
        for m in _DIGITS.finditer(nibbles):
            # MSINs are searched in frame hex dumps only: alone they are short and zero-heavy, and a
            # hidden byte there costs nothing (the decoded tree still shows every value).
            for start, end in self._anywhere(m.group(), with_msins=not nested):
                hidden.update(range((m.start() + start) // 2, (m.start() + end - 1) // 2 + 1))
        return hidden

    def _hexdump(self, rows: list[tuple[str, bytes, str]]) -> str:
        """Hex-dump lines with the bytes of identities shown as `**` and `*`, found across lines."""
        hidden = self._hidden_bytes(b"".join(data for _, data, _ in rows), nested=False)
        out = []
        index = 0
        for offset, data, text in rows:
            cells = ["**" if index + i in hidden else f"{b:02x}" for i, b in enumerate(data)]
            shown = "".join("*" if index + i in hidden else c for i, c in enumerate(text))
            index += len(data)
            out.append(hex_line(offset, " ".join(cells), shown))
        return "\n".join(out)


def _looks_like_hexdump(text: str) -> bool:
    return re.search(r"(?m)^[0-9a-f]{4,8}  [0-9a-f]{2} ", text) is not None


def _hexdump_row(line: str) -> tuple[str, bytes, str] | None:
    """(offset, bytes, text column) of a `_pcap_tree.hexdump` line, read by position (the text
    column may start with spaces), or None for any other line."""
    offset, sep, rest = line.partition("  ")
    gap_end = HEX_CELLS_WIDTH + len(HEX_TEXT_GAP)
    if not sep or not re.fullmatch(r"[0-9a-f]{4,8}", offset) or rest[HEX_CELLS_WIDTH:gap_end] != HEX_TEXT_GAP:
        return None
    cells, text = rest[:HEX_CELLS_WIDTH].rstrip(), rest[gap_end:]
    tokens = cells.split(" ")
    if not 1 <= len(text) <= 16 or len(tokens) != len(text) or any(
            not re.fullmatch(r"[0-9a-f]{2}", t) for t in tokens):
        return None
    return offset, bytes.fromhex("".join(tokens)), text
