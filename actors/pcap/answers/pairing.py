"""Service response times of GTPv2-C, PFCP, SIP and HTTP/1.1 for pcap_stats, paired here by what each
protocol pairs on, never by the response links one Wireshark sets (4.0 links GTPv2 for some message types
only, links SIP ACKs as responses, files an INVITE's 408 under its CANCEL and takes an ICMP error quoting
a request for a second request).

One sharkd `frames` pass over the frames carrying the protocol reads each message's own fields and the
frame's innermost addresses and ports (a frame inside ICMP is the quoted datagram: its innermost header
is the request as it was sent). Then, in frame order:

- GTPv2-C and PFCP: a response answers the open request with its sequence number sent the other way
  between the same addresses and UDP ports, when its message type answers that request's type
  (X Request -> X Response, X Notification -> X Acknowledge(ment), a GTPv2 Command -> its Failure
  Indication or the bearer Request it triggers, Context Response -> Context Acknowledge; a Version Not
  Supported message answers any request). A request repeated while open is a retransmission; once
  answered, its sequence number may be reused by a new request.
- SIP: a response answers the request with its Call-ID, CSeq number and CSeq method sent the other way
  between the same addresses (a proxy's two legs share Call-ID and CSeq). A final response (>= 200)
  closes it; 1xx are provisional and time nothing. ACK is no request of its own (it has no response) and
  CANCEL is a request with its own responses. SIP never reuses a CSeq, so a repeated request is a
  retransmission even after its answer.
- HTTP/1.1: requests and responses in order on each TCP connection (tcp.stream): a response from the
  other end answers the oldest open request; 1xx other than 101 are interim. HTTP over UDP (SSDP) has no
  connection to pair on.

A response that answers no open request is a repeat (for a retransmitted request) when it answers an
answered one (not in HTTP/1.1), else a response without request (its request before the capture).

A response time runs from the last transmission of the request before its answer to the answer, in
whole nanoseconds of the frames' relative times. An ICMP error quoting a request is the request's fate
(`icmp_errors`), never a request. A request left without an answer is `not_paired`, with why: an ICMP
error instead, only provisional responses, the display filter hid its answer, the capture ends within
the protocol's response timer of it, or no response in the capture.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from diagd.actors.base import Request
from diagd.actors.pcap.answer_types import StatsAnswer
from diagd.actors.pcap.answers.http2_srt import nanoseconds, template
from diagd.actors.pcap.engine.session import CaptureSession

# The frame's times, its innermost addresses and ports (last occurrence), the outer ICMP error (first).
COMMON = ("frame.time_relative:0", "frame.time_epoch:0", "ip.src:-1", "ip.dst:-1", "ipv6.src:-1", "ipv6.dst:-1",
          "udp.srcport:-1", "udp.dstport:-1", "tcp.srcport:-1", "tcp.dstport:-1", "icmp.type:1", "icmp.code:1",
          "icmpv6.type:1", "icmpv6.code:1")
FRAMES_SHOWN = 5  # request frames listed per row that are not paired
UNREAD = "unread"  # a frame whose messages cannot be told apart


@dataclass(slots=True)
class Message:
    """One message of a frame, as read for pairing."""

    frame: int
    at_ns: int                   # relative time
    epoch: float                 # absolute time (the capture's end is compared with it)
    src: tuple[str, ...]         # the sender (addresses, and the port where the protocol pairs on it)
    dst: tuple[str, ...]
    key: tuple[str, ...]         # what a request and its answer share besides the peers
    name: str                    # message type, SIP/HTTP method, or status code
    procedure: str | None = None  # set: a request of this procedure (a row)
    answers: frozenset[str] | None = None  # a request's answers by name (None: any answer on its key)
    answer: bool = False         # may answer a request
    final: bool = True           # an answer that closes its request (1xx: provisional)
    status: str | None = None    # a SIP/HTTP response's status code
    icmp: str | None = None      # set: the datagram quoted in this ICMP error, not a message sent
    unpairable: str | None = None  # set: a request that cannot be paired, why


@dataclass
class Rules:
    """How one protocol's messages are read and paired."""

    protocol: str
    filter: str
    fields: tuple[str, ...]      # sharkd columns read besides COMMON
    wait_s: float                # the response timer: a request closer than this to the capture's end may
    #                              have been answered after it
    resends: str                 # a repeated request is a retransmission: "while open" (its sequence number
    #                              may be reused once answered), "always" (SIP never reuses a CSeq), "never"
    #                              (HTTP/1.1: TCP retransmits, a repeated request is a new one)
    any_answer: frozenset[str]   # answers any request on its key (Version Not Supported)
    statuses: bool               # rows count their answers' status codes
    method: str
    decode: Callable[[int, dict[str, str]], list[Message]] = field(repr=False)


@dataclass(slots=True)
class Transaction:
    request: Message
    last: Message                # its latest transmission
    retransmissions: int = 0
    provisional: int = 0
    repeated: int = 0
    icmp_errors: int = 0
    icmp: str | None = None
    answer: Message | None = None
    answer_from: Message | None = None  # the transmission the answer is timed from


def number(text: str) -> int | None:
    """A number as sharkd shows it: `181`, `0x00000b (11)`, `0x00000b`."""
    text = text.strip()
    if m := re.search(r"\((\d+)\)$", text):
        return int(m.group(1))
    try:
        return int(text, 0)
    except ValueError:
        return None


_UNREACHABLE = {0: "network unreachable", 1: "host unreachable", 2: "protocol unreachable", 3: "port unreachable",
                4: "fragmentation needed", 9: "administratively prohibited", 10: "administratively prohibited",
                13: "administratively prohibited"}
_ICMP = {4: "source quench", 5: "redirect", 11: "time exceeded", 12: "parameter problem"}
_UNREACHABLE6 = {0: "no route", 1: "administratively prohibited", 3: "address unreachable", 4: "port unreachable"}
_ICMP6 = {2: "packet too big", 3: "time exceeded", 4: "parameter problem"}


def icmp_error(v4_type: str, v4_code: str, v6_type: str, v6_code: str) -> str | None:
    """'ICMP port unreachable' for the ICMP (v4 or v6) error a frame is, or None."""
    if v4_type:
        kind, code, name = number(v4_type), number(v4_code), "ICMP"
        text = _UNREACHABLE.get(code or 0) if kind == 3 else _ICMP.get(kind or 0)
    elif v6_type:
        kind, code, name = number(v6_type), number(v6_code), "ICMPv6"
        text = _UNREACHABLE6.get(code or 0) if kind == 1 else _ICMP6.get(kind or 0)
    else:
        return None
    return f"{name} {text}" if text else f"{name} type {kind} code {code}"


def _values(text: str, count: int) -> list[str]:
    """A per-message column cut into `count` values (sharkd joins occurrences with commas); a value that
    holds commas itself is kept whole when there is one message."""
    if count == 1:
        return [text]
    parts = text.split(",") if text else []
    return parts if len(parts) == count else [""] * count


# -- GTPv2-C and PFCP: sequence number and peer

_COMMANDS = {"Modify Bearer Command": ("Modify Bearer Failure Indication", "Update Bearer Request"),
             "Delete Bearer Command": ("Delete Bearer Failure Indication", "Delete Bearer Request"),
             "Bearer Resource Command": ("Bearer Resource Failure Indication", "Create Bearer Request",
                                         "Update Bearer Request", "Delete Bearer Request")}
_GTPV2_ANSWERS = (" Response", " Acknowledge", " Acknowledgement")
_COMMAND_ANSWERS = {name for answers in _COMMANDS.values() for name in answers}  # (DDN Failure Indication
#                                                                                 answers nothing)


def gtpv2_answers(name: str) -> frozenset[str]:
    """The GTPv2-C message types that answer one (TS 29.274 7.6: a reply or triggered message carries its
    initial message's sequence number); empty for a message that is no request."""
    if name.endswith(" Request"):
        return frozenset({name.removesuffix(" Request") + " Response"})
    if name.endswith(" Notification"):
        base = name.removesuffix(" Notification")
        return frozenset({base + " Acknowledge", name + " Acknowledge", name + " Acknowledgement"})
    if name == "Context Response":
        return frozenset({"Context Acknowledge"})
    return frozenset(_COMMANDS.get(name, ()))


def pfcp_answers(name: str) -> frozenset[str]:
    return frozenset({name.removesuffix(" Request") + " Response"}) if name.endswith(" Request") else frozenset()


def _sequenced(kind: str, seq: str, answers: Callable[[str], frozenset[str]],
               is_answer: Callable[[str], bool]) -> Callable[[int, dict[str, str]], list[Message]]:
    def decode(frame: int, c: dict[str, str]) -> list[Message]:
        names = c[kind].split(",") if c[kind] else []
        seqs = _values(c[seq], len(names))
        src = (c["ip.src"], c["ipv6.src"], c["udp.srcport"])
        dst = (c["ip.dst"], c["ipv6.dst"], c["udp.dstport"])
        found = []
        for name, sequence in zip(names, seqs, strict=True):
            opens = answers(name)
            found.append(_message(frame, c, src, dst, (str(number(sequence)),), name,
                                  procedure=name.removesuffix(" Request") if opens else None,
                                  answers=opens or None, answer=is_answer(name)))
        return found
    return decode


def _message(frame: int, c: dict[str, str], src: tuple[str, ...], dst: tuple[str, ...], key: tuple[str, ...],
             name: str, **kwargs: Any) -> Message:
    return Message(frame, nanoseconds(c["frame.time_relative"] or "0"), float(c["frame.time_epoch"] or 0), src, dst,
                   key, name, icmp=icmp_error(c["icmp.type"], c["icmp.code"], c["icmpv6.type"], c["icmpv6.code"]),
                   **kwargs)


# -- SIP: Call-ID, CSeq and peer addresses

def _sip(frame: int, c: dict[str, str]) -> list[Message]:
    calls = c["sip.Call-ID"].split(",") if c["sip.Call-ID"] else []
    count = len(calls)
    cseqs, cmethods = _values(c["sip.CSeq.seq"], count), _values(c["sip.CSeq.method"], count)
    methods = c["sip.Method"].split(",") if c["sip.Method"] else []
    codes = c["sip.Status-Code"].split(",") if c["sip.Status-Code"] else []
    if len(methods) + len(codes) != count or (methods and codes):
        return [Message(frame, 0, 0.0, (), (), (), "", unpairable=UNREAD)]  # mixed: which is which is unknown
    src, dst = (c["ip.src"], c["ipv6.src"]), (c["ip.dst"], c["ipv6.dst"])
    found = []
    for i, call in enumerate(calls):
        key = (call, cseqs[i], cmethods[i])
        if methods:
            found.append(_message(frame, c, src, dst, key, methods[i], procedure=methods[i]))
        else:
            status = number(codes[i]) or 0
            found.append(_message(frame, c, src, dst, key, cmethods[i], answer=True, final=status >= 200,
                                  status=codes[i]))
    return found


# -- HTTP/1.1: order on each TCP connection

def _http(frame: int, c: dict[str, str]) -> list[Message]:
    methods = c["http.request.method"].split(",") if c["http.request.method"] else []
    uris = _values(c["http.request.uri"], len(methods))
    codes = c["http.response.code"].split(",") if c["http.response.code"] else []
    stream = c["tcp.stream"]
    src = (c["ip.src"], c["ipv6.src"], c["tcp.srcport"] or c["udp.srcport"])
    dst = (c["ip.dst"], c["ipv6.dst"], c["tcp.dstport"] or c["udp.dstport"])
    found = []
    for code in codes:  # a frame is one direction: a server's responses, or a client's requests
        status = number(code) or 0
        found.append(_message(frame, c, src, dst, (stream,), code if stream else f"{code} over UDP", answer=True,
                              final=status >= 200 or status == 101, status=code))
    for method, uri in zip(methods, uris, strict=True):
        found.append(_message(frame, c, src, dst, (stream,), method, procedure=f"{method} {template(path(uri))}",
                              unpairable=None if stream else "HTTP over UDP: no connection to pair on"))
    return found


def path(uri: str) -> str:
    """The path of a request-target: origin form as it is, absolute form less scheme and authority."""
    if "://" in uri:
        return "/" + uri.split("://", 1)[1].partition("/")[2]
    return uri or "?"


RULES = {
    "gtpv2": Rules("gtpv2", "gtpv2", ("gtpv2.message_type:0", "gtpv2.seq:0"), 3.0, "while open",
                   frozenset({"Version Not Supported Indication"}), False,
                   "computed: GTPv2-C requests paired with the responses carrying their sequence number back between "
                   "the same addresses and UDP ports (TS 29.274), from sharkd columns gtpv2.message_type and gtpv2.seq "
                   "(not Wireshark's gtpv2.response_to, which 4.0 sets for some message types only)",
                   _sequenced("gtpv2.message_type", "gtpv2.seq", gtpv2_answers,
                              lambda n: n.endswith(_GTPV2_ANSWERS) or n in _COMMAND_ANSWERS
                              or n == "Version Not Supported Indication")),
    "pfcp": Rules("pfcp", "pfcp", ("pfcp.msg_type:0", "pfcp.seqno:0"), 3.0, "while open",
                  frozenset({"PFCP Version Not Supported Response"}), False,
                  "computed: PFCP requests paired with the responses carrying their sequence number back between the "
                  "same addresses and UDP ports (TS 29.244), from sharkd columns pfcp.msg_type and pfcp.seqno "
                  "(not Wireshark's pfcp.response_to)",
                  _sequenced("pfcp.msg_type", "pfcp.seqno", pfcp_answers, lambda n: n.endswith(" Response"))),
    "sip": Rules("sip", "sip", ("sip.Method:0", "sip.Status-Code:0", "sip.Call-ID:0", "sip.CSeq.seq:0",
                                "sip.CSeq.method:0"), 32.0, "always", frozenset(), True,
                 "computed: SIP requests paired with their final responses (>= 200) by Call-ID, CSeq number and "
                 "method and the peers' addresses (RFC 3261), from sharkd columns sip.Method, sip.Status-Code, "
                 "sip.Call-ID, sip.CSeq.seq and sip.CSeq.method; 1xx are provisional, ACK is no request of its own "
                 "(not Wireshark's sip.response-request)", _sip),
    "http": Rules("http", "http.request || http.response", ("http.request.method:0", "http.request.uri:0",
                                                             "http.response.code:0", "tcp.stream:-1"), 10.0, "never",
                  frozenset(), True,
                  "computed: HTTP/1.1 requests paired with responses in order on each TCP connection (tcp.stream), "
                  "from sharkd columns http.request.method, http.request.uri and http.response.code; 1xx other than "
                  "101 are interim; ids in paths as {id}", _http),
}


def columns(rules: Rules) -> list[str]:
    return [*COMMON, *rules.fields]


async def srt(capture: CaptureSession, request: Request, rules: Rules, display_filter: str) -> StatsAnswer:
    flt = f"({rules.filter}) && ({display_filter})" if display_filter else rules.filter
    await capture.check_filter(request, flt)
    wanted = columns(rules)
    params: dict[str, Any] = {f"column{i}": c for i, c in enumerate(wanted)}
    params["filter"] = flt
    frames = await capture.sharkd_call(request, "frames", params, display_filter=flt)
    names = [c.rsplit(":", 1)[0] for c in wanted]
    messages: list[Message] = []
    for frame in sorted(frames, key=lambda f: int(f["num"])):
        messages += rules.decode(int(frame["num"]), dict(zip(names, [str(v) for v in frame["c"]], strict=True)))
    end = float((await capture.analysed(request)).get("last") or 0.0)
    return pair(rules, messages, end, bool(display_filter))


def pair(rules: Rules, messages: list[Message], capture_end: float, filtered: bool) -> StatsAnswer:
    """The rows of `messages` (in frame order) paired by `rules`."""
    open_: dict[tuple[Any, ...], list[Transaction]] = defaultdict(list)
    closed: dict[tuple[Any, ...], list[Transaction]] = defaultdict(list)
    done: list[Transaction] = []
    orphans: Counter[str] = Counter()
    unread: list[int] = []
    responses = acks = icmp_unmatched = 0

    def answers(t: Transaction, m: Message) -> bool:
        return t.request.answers is None or m.name in t.request.answers or m.name in rules.any_answer

    for m in messages:
        if m.unpairable == UNREAD:
            unread.append(m.frame)
            continue
        if m.icmp is not None:  # the datagram an ICMP error quotes: the fate of the request it was
            here = (m.src, m.dst, m.key)
            quoted = [t for t in open_[here] + closed[here][::-1] if t.request.name == m.name]
            if m.procedure is not None and quoted:
                quoted[0].icmp_errors += 1
                quoted[0].icmp = quoted[0].icmp or m.icmp
            else:
                icmp_unmatched += 1
            continue
        if rules.protocol == "sip" and m.procedure == "ACK":
            acks += 1  # no request of its own: it has no response
            continue
        if m.answer:
            responses += 1
            back = (m.dst, m.src, m.key)
            match = next((t for t in open_[back] if answers(t, m)), None)
            if match is not None:
                if m.final:
                    match.answer, match.answer_from = m, match.last
                    open_[back].remove(match)
                    closed[back].append(match)
                else:
                    match.provisional += 1
            elif rules.resends != "never" and (earlier := next((t for t in closed[back][::-1] if answers(t, m)),
                                                               None)) is not None:
                earlier.repeated += 1  # sent again for a retransmitted request (HTTP/1.1 repeats none)
            elif m.procedure is None:
                orphans[m.name] += 1
        if m.procedure is not None:
            here = (m.src, m.dst, m.key)
            again = None
            if rules.resends != "never":
                again = next((t for t in open_[here] if t.request.name == m.name), None)
            if again is None and rules.resends == "always":
                again = next((t for t in closed[here][::-1] if t.request.name == m.name), None)
            if again is not None:
                again.retransmissions += 1
                again.last = m
                continue
            t = Transaction(m, m)
            done.append(t)
            if m.unpairable is None:
                open_[here].append(t)

    rows = _rows(rules, done, capture_end, filtered)
    result: StatsAnswer = {"method": rules.method, "rows": rows, "requests": len(done), "responses": responses,
                           "responses_without_request": dict(sorted(orphans.items())),
                           "retransmissions": sum(t.retransmissions for t in done),
                           "icmp_errors": sum(t.icmp_errors for t in done) + icmp_unmatched}
    if icmp_unmatched:
        result["icmp_errors_quoting_no_request"] = icmp_unmatched
    if rules.protocol == "sip":
        result["acks"] = acks
    if unread:
        result["unread_frames"] = unread
    return result


def _reason(rules: Rules, t: Transaction, capture_end: float, filtered: bool) -> str:
    if t.request.unpairable is not None:
        return t.request.unpairable
    if t.icmp is not None:
        return f"{t.icmp} instead of a response"
    if t.provisional:
        return "only provisional (1xx) responses"
    if filtered:
        return "no response among the frames display_filter keeps"
    if capture_end - t.last.epoch < rules.wait_s:
        return f"capture ends within {rules.wait_s:g} s of the request"
    return "no response in the capture"


def _rows(rules: Rules, done: list[Transaction], capture_end: float, filtered: bool) -> list[dict[str, Any]]:
    by: dict[str, list[Transaction]] = defaultdict(list)
    for t in done:
        by[t.request.procedure or "?"].append(t)
    rows = []
    for procedure in sorted(by):
        times: list[int] = []
        reasons: Counter[str] = Counter()
        unpaired: list[int] = []
        statuses: Counter[str] = Counter()
        for t in by[procedure]:
            if t.answer is not None and t.answer_from is not None:
                times.append(t.answer.at_ns - t.answer_from.at_ns)
                statuses[t.answer.status or "?"] += 1
            else:
                reasons[_reason(rules, t, capture_end, filtered)] += 1
                unpaired.append(t.request.frame)
        row: dict[str, Any] = {"procedure": procedure, "count": len(times)}
        if times:
            row.update(min_s=min(times) / 1e9, max_s=max(times) / 1e9, avg_s=round(sum(times) / len(times) / 1e9, 9),
                       sum_s=sum(times) / 1e9)
        row["not_paired"] = dict(sorted(reasons.items()))
        if unpaired:
            row["not_paired_frames"] = sorted(unpaired)[:FRAMES_SHOWN]
        for name, value in (("retransmissions", sum(t.retransmissions for t in by[procedure])),
                            ("repeated_responses", sum(t.repeated for t in by[procedure])),
                            ("icmp_errors", sum(t.icmp_errors for t in by[procedure])),
                            ("provisional_responses", sum(t.provisional for t in by[procedure]))):
            if value:
                row[name] = value
        if rules.statuses and times:
            row["statuses"] = dict(sorted(statuses.items()))
        rows.append(row)
    return rows
