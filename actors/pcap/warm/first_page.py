"""A new filter's first page before the full pass: one tshark that stops at `limit` matching frames.

sharkd filters every frame before it returns the first row of a new filter; a plain `tshark -Y`
prints matches as it finds them. The actor runs both and answers with whichever page is ready first
(the pass goes on and gives the exact total and the later pages).

Only a single-pass tshark can stop early, and a single pass does not know what later frames tell:
its Info column lacks "(reply in 228)", and links to later frames (`pfcp.response_in`,
`tcp.reassembled_in`: Wireshark's FT_FRAMENUM fields) or "no response seen" are not yet known. So
tshark gives only the frame *numbers* of the page, the rows come from a loaded sharkd worker (its
`frame` request with the packet-list columns, two-pass like every sharkd answer), and a filter
naming a field whose value depends on later frames is not raced: sharkd answers it alone. The
differential test compares the pages with sharkd's own on every corpus capture.

On a fresh capture no worker is loaded yet, and waiting for one is waiting for the whole file. Then
the single pass gives the rows too (`early_rows`, the packet list of `tshark -T tabs`), each marked
with the columns that a later frame may still change (`provisional`): the frame set and the other
columns are exact. Which columns may change for which row is measured, not guessed: the differential
test (tests/e2e/test_pcap_provisional.py) compares every row of every corpus capture with sharkd's
two-pass row and fails on a difference not marked, and on a mark no difference needs.
"""

from __future__ import annotations

import re
from typing import Any

from diagd.actors._subprocess import RunHead, head
from diagd.actors.pcap.shark.single_pass_text import FRAME_START, FrameText, frames_of
from diagd.actors.pcap.shark.tshark import TRUNCATED, fields_argv, filter_refusal, tabs_row
from diagd.protocol.errors import DiagdError, ErrorCode

MAX_EARLY_ROWS = 2000  # beyond this a page is far into the matches: the pass is the better way there
MAX_EARLY_PAGE = 1000  # rows fetched one `frame` request each (pipelined): a bigger page waits for the pass

# Protocols a single pass dissects exactly as the second of two does: each frame on its own (or
# reassembled from earlier frames only). Not here: protocols above TCP reassembly such as HTTP/2
# and what it carries (a single pass leaves an SBI JSON body undecoded), RTP set up by signalling,
# and anything not checked. The differential test (tests/e2e/test_pcap_first_page.py) holds every
# protocol of this list to sharkd's own matches on every corpus capture that carries it.
SINGLE_PASS_PROTOCOLS = frozenset({
    "frame", "eth", "vlan", "sll", "ip", "ipv6", "arp", "icmp", "icmpv6", "udp", "sctp", "tcp", "gtp", "gtpv2",
    "pfcp", "diameter", "ngap", "s1ap", "nas-5gs", "nas-eps", "e212", "sip", "sdp", "dns", "x2ap", "gtpprime",
})
# Fields whose value a single pass gives differently: links to later frames (FT_FRAMENUM, caught by
# type), "no response seen" markers and expert items (a single pass flags every request as
# unanswered), and the fields found to differ between `tshark` and `tshark -2` on the corpus
# (tests/e2e/test_pcap_first_page.py recomputes that list and fails on a field missing here).
_LATER = re.compile(r"^_ws\.expert|no_?resp|unanswered|response_?in|response_?to|response_?time|reassembled_?in"
                    r"|retransmitted_in|^frame\.protocols$")
LATER_FIELDS = frozenset({
    "sctp.sack_cumulative_tsn_ack", "sip.call_id_generated", "tcp.analysis.initial_rtt", "tcp.completeness",
    "udp.stream", "udp.time_relative", "icmp.resp_in", "ip.reassembled_in", "megaco.context",
})
Kinds = tuple[tuple[str, str | None, str | None], ...]  # (name, type, protocol): Catalogue.kinds


def raceable(display_filter: str, offset: int, limit: int, kinds: Kinds | None) -> bool:
    """Whether an early-stopping single pass finds exactly the frames sharkd's filter matches
    (`kinds`: the filter's names, as Catalogue.kinds gives them; None: not known, so no)."""
    if not display_filter or offset + limit > MAX_EARLY_ROWS or limit > MAX_EARLY_PAGE:
        return False
    return single_pass_safe(kinds)


def loading_safe(display_filter: str, offset: int, limit: int, kinds: Kinds | None) -> bool:
    """Whether a capture still loading may answer this page from a single pass (all frames too)."""
    if offset + limit > MAX_EARLY_ROWS or limit > MAX_EARLY_PAGE:
        return False
    return single_pass_safe(kinds)


def single_pass_safe(kinds: Kinds | None) -> bool:
    """Whether a single pass gives what two passes give for every name: each is a field or protocol
    of SINGLE_PASS_PROTOCOLS, and none depends on later frames. A word that is no field (an unquoted
    value) makes it unsafe, and so do names not looked up (None): unsure is no."""
    if kinds is None:
        return False
    for name, kind, protocol in kinds:
        if kind is None or protocol not in SINGLE_PASS_PROTOCOLS:
            return False
        if kind == "FT_FRAMENUM" or _LATER.search(name) or name in LATER_FIELDS:
            return False
    return True


def single_pass(argv: list[str]) -> list[str]:
    """The capture's cold argv without `-2`: output starts with the first match."""
    return [a for a in argv if a != "-2"]


async def early_numbers(argv: list[str], display_filter: str, want: int, *,
                        run: RunHead = head) -> tuple[list[int], bool]:
    """(numbers, complete): the first `want` matching frame numbers of a single tshark pass, which is
    stopped once they are in; complete is True when tshark read the whole capture (fewer matches, or
    exactly `want`), so their count is then the exact total."""
    # -l: a line per match as it is found (a pipe is block-buffered: 20 matches would wait for 4 KiB);
    # one line more than asked says the page is not the last.
    done = await run(numbers_argv(argv, display_filter), want + 1, max_line=1 << 16)
    numbers = [int(line) for line in done.lines if line.strip().isdigit()]
    if not done.stopped and done.returncode != 0 and not (TRUNCATED in done.stderr and numbers):
        raise await _failure(done.stderr, display_filter, done.returncode)
    return numbers[:want], not done.stopped


async def early_rows(argv: list[str], display_filter: str, want: int, *,
                     run: RunHead = head) -> tuple[list[dict[str, Any]], bool]:
    """(rows, complete): the packet-list rows of the first `want` matches of a single tshark pass
    (stopped once they are in), each with its `provisional` columns; complete as early_numbers."""
    done = await run(tabs_argv(argv, display_filter), want + 1, max_line=1 << 16)
    rows = [row for line in done.lines if (row := tabs_row(line)) is not None]
    if not done.stopped and done.returncode != 0 and not (TRUNCATED in done.stderr and rows):
        raise await _failure(done.stderr, display_filter, done.returncode)
    for row in rows[:want]:
        if marks := provisional(row):
            row["provisional"] = marks
    return rows[:want], not done.stopped


def numbers_argv(argv: list[str], display_filter: str) -> list[str]:
    """early_numbers' tshark: the frame numbers of a single pass, a line per match as it is found."""
    return [*single_pass(argv), "-l", "-Y", display_filter, "-T", "fields", "-e", "frame.number"]


def early_argvs(argv: list[str]) -> list[tuple[list[str], bool]]:
    """The early passes' tsharks of a capture's cold `argv` (with a stand-in filter): what its standbys
    run, each with whether a first call may need it (a fresh capture's first page or text search) or
    only a loaded capture does (a new filter's first frame numbers). The timeline's (any field list:
    fields_standby.py) is started by itself, after those two."""
    return [(tabs_argv(argv, "frame"), True), (text_argv(argv, "frame"), True), (numbers_argv(argv, "frame"), False)]


def timeline_argv(argv: list[str]) -> list[str]:
    """early_fields' tshark of a capture's cold `argv` (a stand-in filter and field)."""
    fields = fields_argv(single_pass(argv), "frame", ["frame.number"])
    return [fields[0], "-l", *fields[1:]]


def tabs_argv(argv: list[str], display_filter: str) -> list[str]:
    """early_rows' tshark: the packet list of a single pass, a line per match as it is found."""
    return [*single_pass(argv), "-l", *(["-Y", display_filter] if display_filter else []), "-T", "tabs"]


def text_argv(argv: list[str], display_filter: str) -> list[str]:
    """early_text's tshark: the `-V` text of a single pass, flushed frame by frame."""
    return [*single_pass(argv), "-l", *(["-Y", display_filter] if display_filter else []), "-V"]


async def early_fields(argv: list[str], display_filter: str, want: int, *,
                       run: RunHead = head) -> tuple[list[list[str]], bool]:
    """(cells per row, complete): `tshark -T fields` (argv: tshark.fields_argv of a single-pass-safe
    filter and fields, so every value is exact) stopped after the first `want` rows."""
    done = await run([argv[0], "-l", *argv[1:]], want + 1, max_line=1 << 30)
    rows = [line.split("\t") for line in done.lines]
    if not done.stopped and done.returncode != 0 and not (TRUNCATED in done.stderr and rows):
        raise await _failure(done.stderr, display_filter, done.returncode)
    return rows[:want], not done.stopped


async def early_text(argv: list[str], display_filter: str, want: int, *,
                     run: RunHead = head) -> tuple[list[FrameText], bool]:
    """(frames, complete): the `tshark -V` text of the first `want` frames a single pass displays
    (stopped once the frame after them begins); complete as early_numbers."""
    done = await run(text_argv(argv, display_filter), want, max_line=1 << 20, records=FRAME_START)
    frames = frames_of(done.text)
    if not done.stopped and done.returncode != 0 and not (TRUNCATED in done.stderr and frames):
        raise await _failure(done.stderr, display_filter, done.returncode)
    return frames[:want], not done.stopped


# What a second pass may change in a single pass's row, by the row's protocol (`row_key`: the
# Protocol column's top protocol, without a GTP tunnel's wrapper and a version). Measured over every
# corpus capture by tests/e2e/test_pcap_provisional.py, which fails on a difference not covered here
# and on an entry no difference needs. Number, time, addresses and length never differ.
#   info: "(reply in 228)" (ICMP), "[Reassembled in #105]" (IP fragments), the PDU a later segment
#   completes (TCP, MySQL), a JSON body reassembled (HTTP2);
#   protocol: the protocol a later frame reveals (TCP -> OpenFlow, TLSv1 -> TLSv1.2, HTTP2 -> HTTP2/JSON).
MAY_DIFFER: dict[str, frozenset[str]] = {
    "info": frozenset({"ICMP", "IP", "TCP", "MYSQL", "HTTP2"}),
    "protocol": frozenset({"TCP", "TLS", "HTTP2"}),
}
# An SCTP SACK's cumulative TSN ack is shown relative to a TSN a single pass may not have seen yet.
_SACK = re.compile(r"\bSACK \(Ack=")
# Row keys of protocols the corpus has (and so measured): any other row gets both columns marked.
MEASURED = frozenset({
    "ANSI C12.22", "ARP", "DIAMETER", "DNS", "GTP", "HTTP", "HTTP2", "ICMP", "IP", "LTP SEGMENT", "MDNS", "MEGACO",
    "MYSQL", "NGAP", "NTP", "OPENFLOW", "OPENVPN", "PFCP", "RESP", "RTCP", "RTP", "RTP EVENT", "S1AP", "SCTP", "SIP",
    "SSDP", "SSH", "T.38", "TCP", "TLS", "UDP",
})
_GTP_INNER = re.compile(r"^GTP <(.*)>$")
_VERSION = re.compile(r"v\d[\d.]*$")


def row_key(protocol: str) -> str:
    """The row's protocol as MAY_DIFFER names it: "GTP <TLSv1.2>" -> "TLS", "HTTP2/JSON" -> "HTTP2"."""
    inner = _GTP_INNER.match(protocol)
    top = (inner.group(1) if inner else protocol).split("/")[0]
    return _VERSION.sub("", top).upper()


def provisional(row: dict[str, Any]) -> list[str]:
    """The columns of a single pass's row that a second pass may change (empty: the row is exact)."""
    key = row_key(str(row.get("protocol") or ""))
    if key not in MEASURED:
        return ["info", "protocol"]
    marks = [column for column, keys in MAY_DIFFER.items() if key in keys]
    if "info" not in marks and _SACK.search(str(row.get("info") or "")):
        marks.append("info")
    return sorted(marks)


async def _failure(err: str, display_filter: str, returncode: int | None) -> DiagdError:
    """INVALID_FILTER when tshark's compiler refuses the filter (tshark.filter_refusal), else tshark
    could not read the capture."""
    message = "\n".join(line for line in err.splitlines() if line and not line.startswith("Running as user"))
    refused = await filter_refusal(display_filter)
    if refused is not None:
        return DiagdError(ErrorCode.INVALID_FILTER, f"invalid display filter: {refused}",
                          display_filter=display_filter)
    return DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"tshark could not read the capture: {message[-2000:]}",
                      exit_code=returncode)
