"""Requests paired with their responses from `tshark -T fields` alone, by each protocol's own rules, the
oracle pcap_stats' GTPv2, PFCP, SIP, HTTP/1.1 and Diameter response times are compared with. Never imports
diagd; written apart from actors/pcap/answers/pairing.py (message types by number from TS 29.274 / 29.244, names
from `tshark -G values`; every occurrence of a field kept apart with an unambiguous aggregator).

The rules (docs/pcap.md, "Wireshark's statistics"):
- GTPv2-C / PFCP: a response carries its request's sequence number back between the same addresses and
  UDP ports, and is of a type that answers the request's type; a request repeated while unanswered is a
  retransmission (its sequence number may be reused once answered).
- SIP: Call-ID + CSeq number + CSeq method + the peers' addresses; a final (>= 200) response closes; 1xx
  are provisional; ACK is no request; a repeated request is always a retransmission.
- HTTP/1.1: in order per tcp.stream; 1xx other than 101 are interim.
- Diameter: hop-by-hop + end-to-end identifier on the transport connection.
A response time is from the request's last transmission before its answer; a frame inside an ICMP error
is the quoted datagram (the fate of the request it quotes). Reasons for requests left unpaired: the ICMP
error, only provisional answers, the display filter, the capture ending within the protocol's timer
(GTPv2/PFCP 3 s, SIP 32 s, HTTP 10 s), else no response in the capture.

Every tshark run is kept on disk (tests/support/pcap_oracle.cached_text / cached_tool_text).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import pcap_oracle

SEP = "\x1f"
COMMON = ["frame.number", "frame.time_relative", "frame.time_epoch", "ip.src", "ip.dst", "ipv6.src", "ipv6.dst",
          "udp.srcport", "udp.dstport", "tcp.srcport", "tcp.dstport", "icmp.type", "icmp.code", "icmpv6.type",
          "icmpv6.code"]
PROTOCOLS: dict[str, tuple[str, list[str]]] = {
    "gtpv2": ("gtpv2", ["gtpv2.message_type", "gtpv2.seq"]),
    "pfcp": ("pfcp", ["pfcp.msg_type", "pfcp.seqno"]),
    "sip": ("sip", ["sip.Method", "sip.Status-Code", "sip.Call-ID", "sip.CSeq.seq", "sip.CSeq.method"]),
    "http": ("http.request || http.response", ["http.request.method", "http.request.uri", "http.response.code",
                                              "tcp.stream"]),
}
WAIT_S = {"gtpv2": 3.0, "pfcp": 3.0, "sip": 32.0, "http": 10.0}

# TS 29.274 Table 6.1-1: initial message -> the messages that answer it (reply or triggered message).
GTPV2 = {1: {2}, 4: {5}, 6: {7}, 25: {26}, 27: {28}, 29: {30}, 31: {240}, 32: {33}, 34: {35}, 36: {37}, 38: {39},
         40: {41}, 64: {65, 97}, 66: {67, 99}, 68: {69, 95, 97, 99}, 95: {96}, 97: {98}, 99: {100}, 101: {102},
         103: {104}, 128: {129}, 130: {131}, 131: {132}, 133: {134}, 135: {136}, 137: {138}, 139: {140},
         149: {150}, 153: {154}, 155: {156}, 158: {159}, 160: {161}, 162: {163}, 164: {165}, 166: {167},
         168: {169}, 170: {171}, 176: {177}, 179: {180}, 200: {201}, 211: {212}, 231: {232}, 233: {234},
         235: {236}, 241: {242}, 243: {244}}
GTPV2_ANY = {3}  # Version Not Supported Indication
# TS 29.244 Table 7.3-1.
PFCP = {1: {2}, 3: {4}, 5: {6}, 7: {8}, 9: {10}, 12: {13}, 14: {15}, 16: {17}, 50: {51}, 52: {53}, 54: {55},
        56: {57}}
PFCP_ANY = {11}  # Version Not Supported Response


def tshark(path: Path, *args: str) -> str:
    return pcap_oracle.cached_text(path, ["srt-pairs", *args], lambda: pcap_oracle.tshark(path, *args))


def names(field_name: str) -> dict[int, str]:
    """{value: name} of a field's value string, from `tshark -G values`."""
    argv = ["tshark", "-G", "values"]
    text = pcap_oracle.cached_tool_text(argv, lambda: pcap_oracle.run(argv))
    found = {}
    for line in text.splitlines():
        cells = line.split("\t")
        if len(cells) == 4 and cells[0] == "V" and cells[1] == field_name:
            found[int(cells[2])] = cells[3]
    return found


def capture_end(path: Path) -> float:
    return max(float(t) for t in tshark(path, "-T", "fields", "-e", "frame.time_epoch").split())


def fields(path: Path, protocol: str, display_filter: str = "") -> list[dict[str, list[str]]]:
    """One dict per frame: field -> every occurrence."""
    base, extra = PROTOCOLS[protocol]
    flt = f"({base}) && ({display_filter})" if display_filter else base
    wanted = COMMON + extra
    text = tshark(path, "-Y", flt, "-T", "fields", "-E", "occurrence=a", "-E", f"aggregator={SEP}",
                  *[a for f in wanted for a in ("-e", f)])
    return [{f: (v.split(SEP) if v else []) for f, v in zip(wanted, line.split("\t"), strict=True)}
            for line in text.splitlines()]


def ns(text: str) -> int:
    """Nanoseconds of tshark's decimal seconds, a frame before the first one negative ("-3.800000000")."""
    sign, digits = (-1, text[1:]) if text.startswith("-") else (1, text)
    whole, _, frac = digits.partition(".")
    return sign * (int(whole) * 10**9 + int(frac.ljust(9, "0")[:9]))


def last(values: list[str]) -> str:
    return values[-1] if values else ""


def first(values: list[str]) -> str:
    return values[0] if values else ""


_V4 = {0: "network unreachable", 1: "host unreachable", 2: "protocol unreachable", 3: "port unreachable",
       4: "fragmentation needed", 9: "administratively prohibited", 10: "administratively prohibited",
       13: "administratively prohibited"}
_V4_TYPES = {4: "source quench", 5: "redirect", 11: "time exceeded", 12: "parameter problem"}
_V6 = {0: "no route", 1: "administratively prohibited", 3: "address unreachable", 4: "port unreachable"}
_V6_TYPES = {2: "packet too big", 3: "time exceeded", 4: "parameter problem"}


def icmp(frame: dict[str, list[str]]) -> str | None:
    for version, (t, c), table, types, unreachable in (
            ("ICMP", ("icmp.type", "icmp.code"), _V4, _V4_TYPES, 3),
            ("ICMPv6", ("icmpv6.type", "icmpv6.code"), _V6, _V6_TYPES, 1)):
        if frame[t]:
            kind, code = int(first(frame[t])), int(first(frame[c]))
            text = table.get(code) if kind == unreachable else types.get(kind)
            return f"{version} {text}" if text else f"{version} type {kind} code {code}"
    return None


@dataclass
class Msg:
    frame: int
    at: int
    epoch: float
    src: tuple[str, ...]
    dst: tuple[str, ...]
    key: tuple[str, ...]
    kind: str                      # "request", "answer", "both" (GTPv2 Context Response, triggered requests)
    name: str                      # request: procedure; answer: what answers match on
    opens: set[str] | None = None  # request: the answer names that close it (None: any)
    final: bool = True
    status: str = ""
    icmp: str | None = None
    why: str | None = None         # a request that cannot be paired
    label: str = ""                # an answer's name among responses_without_request


@dataclass
class Txn:
    req: Msg
    last: Msg
    answer: Msg | None = None
    sent: Msg | None = None
    resent: int = 0
    provisional: int = 0
    repeated: int = 0
    icmp_errors: int = 0
    icmp: str | None = None


@dataclass
class Result:
    answer: dict[str, Any]
    pairs: dict[int, tuple[int, int]] = field(default_factory=dict)  # response frame: (request frame, ns)


def _sequenced(path: Path, protocol: str, display_filter: str) -> list[Msg]:
    table, anyone = (GTPV2, GTPV2_ANY) if protocol == "gtpv2" else (PFCP, PFCP_ANY)
    kind_field, seq_field = PROTOCOLS[protocol][1]
    named = names(kind_field)
    answers_of = {a for v in table.values() for a in v} | anyone
    out = []
    for f in fields(path, protocol, display_filter):
        src = (last(f["ip.src"]), last(f["ipv6.src"]), last(f["udp.srcport"]))
        dst = (last(f["ip.dst"]), last(f["ipv6.dst"]), last(f["udp.dstport"]))
        for kind, seq in zip(f[kind_field], f[seq_field], strict=True):
            t = int(kind)
            name = named.get(t, f"Unknown ({t})")
            is_request, is_answer = t in table, t in answers_of
            if not (is_request or is_answer):
                continue
            out.append(Msg(int(first(f["frame.number"])), ns(first(f["frame.time_relative"])),
                           float(first(f["frame.time_epoch"])), src, dst, (str(int(seq, 0)),),
                           "both" if is_request and is_answer else "request" if is_request else "answer",
                           name.removesuffix(" Request") if is_request else name,
                           opens={named.get(a, "") for a in table[t]} | {named.get(a, "") for a in anyone}
                           if is_request else None, icmp=icmp(f), label=name))
    return out


def _sip(path: Path, display_filter: str) -> tuple[list[Msg], list[int]]:
    out: list[Msg] = []
    mixed: list[int] = []
    for f in fields(path, "sip", display_filter):
        number = int(first(f["frame.number"]))
        methods, codes, calls = f["sip.Method"], f["sip.Status-Code"], f["sip.Call-ID"]
        if (methods and codes) or len(methods) + len(codes) != len(calls):
            mixed.append(number)
            continue
        src, dst = (last(f["ip.src"]), last(f["ipv6.src"])), (last(f["ip.dst"]), last(f["ipv6.dst"]))
        for i, call in enumerate(calls):
            key = (call, f["sip.CSeq.seq"][i], f["sip.CSeq.method"][i])
            common = (number, ns(first(f["frame.time_relative"])), float(first(f["frame.time_epoch"])), src, dst,
                      key)
            if methods:
                out.append(Msg(*common, "request", methods[i], icmp=icmp(f)))
            else:
                out.append(Msg(*common, "answer", key[2], final=int(codes[i]) >= 200, status=codes[i], icmp=icmp(f),
                               label=key[2]))
    return out, mixed


def _http(path: Path, display_filter: str) -> list[Msg]:
    out = []
    for f in fields(path, "http", display_filter):
        number = int(first(f["frame.number"]))
        stream = last(f["tcp.stream"])
        src = (last(f["ip.src"]), last(f["ipv6.src"]), last(f["tcp.srcport"]) or last(f["udp.srcport"]))
        dst = (last(f["ip.dst"]), last(f["ipv6.dst"]), last(f["tcp.dstport"]) or last(f["udp.dstport"]))
        common = (number, ns(first(f["frame.time_relative"])), float(first(f["frame.time_epoch"])), src, dst,
                  (stream,))
        for code in f["http.response.code"]:
            status = int(code)
            out.append(Msg(*common, "answer", code, final=status >= 200 or status == 101, status=code,
                           label=code if stream else f"{code} over UDP"))
        for method, uri in zip(f["http.request.method"], f["http.request.uri"], strict=True):
            out.append(Msg(*common, "request", f"{method} {sbi_template(uri)}",
                           why=None if stream else "HTTP over UDP: no connection to pair on"))
    return out


SBI_ID = re.compile(r"^(\d+|[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}|[0-9a-f]{16,}|(imsi|suci|supi|nai|gci|gli|gpsi"
                    r"|msisdn|extid|imei|imeisv|mac)-.+)$", re.I)


def sbi_template(uri: str) -> str:
    if "://" in uri:
        uri = "/" + uri.split("://", 1)[1].partition("/")[2]
    return "/".join("{id}" if SBI_ID.match(p) else p for p in (uri or "?").partition("?")[0].split("/"))


def pairing(path: Path, protocol: str, display_filter: str = "") -> Result:
    """What pcap_stats' srt answer for `protocol` holds (all but `method`), and the pairs it is made of."""
    mixed: list[int] = []
    if protocol in ("gtpv2", "pfcp"):
        messages = _sequenced(path, protocol, display_filter)
    elif protocol == "sip":
        messages, mixed = _sip(path, display_filter)
    else:
        messages = _http(path, display_filter)
    resend = {"gtpv2": "open", "pfcp": "open", "sip": "always", "http": "never"}[protocol]
    pending: dict[tuple[Any, ...], list[Txn]] = defaultdict(list)
    answered: dict[tuple[Any, ...], list[Txn]] = defaultdict(list)
    txns: list[Txn] = []
    orphans: Counter[str] = Counter()
    responses = acks = stray_icmp = 0

    def closes(t: Txn, m: Msg) -> bool:
        return t.req.opens is None or m.label in t.req.opens

    for m in messages:
        if m.icmp:
            quoted = None
            if m.kind != "answer":
                k = (m.src, m.dst, m.key)
                candidates = [t for t in pending[k] if t.req.label == m.label and t.req.name == m.name] + \
                    [t for t in reversed(answered[k]) if t.req.label == m.label and t.req.name == m.name]
                quoted = candidates[0] if candidates else None
            if quoted is None:
                stray_icmp += 1
            else:
                quoted.icmp_errors += 1
                quoted.icmp = quoted.icmp or m.icmp
            continue
        if protocol == "sip" and m.kind == "request" and m.name == "ACK":
            acks += 1
            continue
        if m.kind in ("answer", "both"):
            responses += 1
            k = (m.dst, m.src, m.key)
            hit = [t for t in pending[k] if closes(t, m)]
            if hit:
                t = hit[0]
                if m.final:
                    t.answer, t.sent = m, t.last
                    pending[k].remove(t)
                    answered[k].append(t)
                else:
                    t.provisional += 1
            else:
                done = [] if resend == "never" else [t for t in reversed(answered[k]) if closes(t, m)]
                if done:
                    done[0].repeated += 1
                elif m.kind == "answer":
                    orphans[m.label] += 1
        if m.kind in ("request", "both"):
            k = (m.src, m.dst, m.key)
            same = [] if resend == "never" else [t for t in pending[k] if t.req.label == m.label
                                                 and t.req.name == m.name]
            if not same and resend == "always":
                same = [t for t in reversed(answered[k]) if t.req.name == m.name]
            if same:
                same[0].resent += 1
                same[0].last = m
                continue
            t = Txn(m, m)
            txns.append(t)
            if m.why is None:
                pending[k].append(t)

    end = capture_end(path)
    result = Result({})
    by: dict[str, list[Txn]] = defaultdict(list)
    for t in txns:
        by[t.req.name].append(t)
    rows = []
    for procedure in sorted(by):
        row: dict[str, Any] = {"procedure": procedure}
        times, reasons, left, codes = [], Counter[str](), [], Counter[str]()
        for t in by[procedure]:
            if t.answer and t.sent:
                took = t.answer.at - t.sent.at
                times.append(took)
                result.pairs[t.answer.frame] = (t.sent.frame, took)
                codes[t.answer.status or "?"] += 1
                continue
            left.append(t.req.frame)
            if t.req.why:
                reasons[t.req.why] += 1
            elif t.icmp:
                reasons[f"{t.icmp} instead of a response"] += 1
            elif t.provisional:
                reasons["only provisional (1xx) responses"] += 1
            elif display_filter:
                reasons["no response among the frames display_filter keeps"] += 1
            elif end - t.last.epoch < WAIT_S[protocol]:
                reasons[f"capture ends within {WAIT_S[protocol]:g} s of the request"] += 1
            else:
                reasons["no response in the capture"] += 1
        row["count"] = len(times)
        if times:
            row |= {"min_s": min(times) / 1e9, "max_s": max(times) / 1e9,
                    "avg_s": round(sum(times) / len(times) / 1e9, 9), "sum_s": sum(times) / 1e9}
        row["not_paired"] = dict(sorted(reasons.items()))
        if left:
            row["not_paired_frames"] = sorted(left)[:5]
        for name, value in (("retransmissions", sum(t.resent for t in by[procedure])),
                            ("repeated_responses", sum(t.repeated for t in by[procedure])),
                            ("icmp_errors", sum(t.icmp_errors for t in by[procedure])),
                            ("provisional_responses", sum(t.provisional for t in by[procedure]))):
            if value:
                row[name] = value
        if protocol in ("sip", "http") and times:
            row["statuses"] = dict(sorted(codes.items()))
        rows.append(row)
    answer: dict[str, Any] = {
        "rows": rows, "requests": len(txns), "responses": responses,
        "responses_without_request": dict(sorted(orphans.items())),
        "retransmissions": sum(t.resent for t in txns),
        "icmp_errors": sum(t.icmp_errors for t in txns) + stray_icmp}
    if stray_icmp:
        answer["icmp_errors_quoting_no_request"] = stray_icmp
    if protocol == "sip":
        answer["acks"] = acks
    if mixed:
        answer["unread_frames"] = mixed
    result.answer = answer
    return result


def http_time(path: Path) -> dict[int, tuple[int, int]]:
    """Wireshark's own HTTP links: {response frame: (request frame, http.time in ns)}."""
    text = tshark(path, "-Y", "http.response", "-T", "fields", "-e", "frame.number", "-e", "http.request_in",
                  "-e", "http.time")
    found = {}
    for line in text.splitlines():
        number, request, seconds = line.split("\t")
        if request and seconds:
            found[int(number)] = (int(request), ns(seconds))
    return found


def diameter(path: Path) -> dict[str, list[int]]:
    """Diameter answer times (ns) per command name (as `-z diameter,srt` names them), each answer paired
    with the request of its hop-by-hop and end-to-end identifier sent the other way on its connection."""
    wanted = ["frame.number", "frame.time_relative", "ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "sctp.srcport",
              "sctp.dstport", "tcp.srcport", "tcp.dstport", "diameter.flags.request", "diameter.cmd.code",
              "diameter.hopbyhopid", "diameter.endtoendid", "_ws.col.Info"]
    text = tshark(path, "-Y", "diameter", "-T", "fields", "-E", "occurrence=a", "-E", f"aggregator={SEP}",
                  *[a for f in wanted for a in ("-e", f)])
    requests: dict[tuple[Any, ...], tuple[int, str]] = {}
    times: dict[str, list[int]] = defaultdict(list)
    for line in text.splitlines():
        f = {k: (v.split(SEP) if v else []) for k, v in zip(wanted, line.split("\t"), strict=True)}
        at = ns(first(f["frame.time_relative"]))
        src = (last(f["ip.src"]), last(f["ipv6.src"]), last(f["sctp.srcport"]) or last(f["tcp.srcport"]))
        dst = (last(f["ip.dst"]), last(f["ipv6.dst"]), last(f["sctp.dstport"]) or last(f["tcp.dstport"]))
        commands = dict(re.findall(r"cmd=(\S+) (?:Request|Answer)\((\d+)\)", " ".join(f["_ws.col.Info"])))
        named = {code: name for name, code in commands.items()}
        for flag, code, hop, end in zip(f["diameter.flags.request"], f["diameter.cmd.code"],
                                        f["diameter.hopbyhopid"], f["diameter.endtoendid"], strict=True):
            if flag in ("1", "True"):
                requests[(src, dst, hop, end)] = (at, named.get(code, code))
            elif (sent := requests.pop((dst, src, hop, end), None)) is not None:
                times[sent[1]].append(at - sent[0])
    return dict(times)
