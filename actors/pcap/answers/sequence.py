"""A Mermaid `sequenceDiagram` from `tshark -T fields` rows: one arrow per frame, lifelines per endpoint role.

Why this shape:
- Each side of a frame is an end, (address, port) of the innermost IP and transport header (GTP-U, GRE
  tunnels: the inner ones). A role (gNB, AMF, SMF, UPF, NRF, AUSF, ...) names an end only from protocol
  semantics: the SCTP end on port 38412 is the AMF (the other the gNB); the PFCP session requests' sender
  is the SMF, their receiver the UPF; the server end of an SBI request is the NF its path names
  (`/nausf-auth/...` -> AUSF). The client end of a request gets no name from it (an SCP forwards others').
- An address is one lifeline when that is unambiguous: none of its ends is named differently from another
  and none talks to another. HTTP/2 and HTTP/1.1 clients use ephemeral ports, so one NF on its own
  address stays one lifeline. On an all-in-one core (every NF on 127.0.0.1 or one docker address) the
  named ends are lifelines of their own, so no arrow points to itself unless both its ends are one.
- The message text is Wireshark's own Protocol and Info columns (NGAP procedure + NAS message, PFCP
  message, HTTP method + path / status, SIP request / status, Diameter command), minus SCTP chunk noise,
  so every arrow can be checked against `tshark -T fields -e _ws.col.Info`.
- Failures are `-x` arrows with a Note naming the cause: a message that reports a failure by its type,
  whatever cause it carries (the 5GMM/5GSM rejects, AUTHENTICATION FAILURE and the STATUS messages of
  TS 24.501 8.2/8.3; NGAP NASNonDeliveryIndication and ErrorIndication, TS 38.413 8.6.4 / 8.7.5), an
  NGAP unsuccessful outcome, a 5GMM cause, a 5GSM cause other than 36, PFCP cause != 1, HTTP/SIP status
  >= 400, Diameter result >= 3000. The message whose rule (ngap/rules.py) decided a procedure's reject
  or failure verdict is a `-x` arrow too, with a Note naming the rule id, its clause and what it says.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import TypedDict

from diagd.actors.pcap.ngap.codes import PROC_ERROR_INDICATION, PROC_NAS_NON_DELIVERY

FIELDS = ("frame.time_epoch", "ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "_ws.col.Protocol", "_ws.col.Info",
          "sctp.srcport", "sctp.dstport", "tcp.srcport", "tcp.dstport", "udp.srcport", "udp.dstport",
          "pfcp.msg_type", "pfcp.cause", "http2.headers.path", "http2.headers.status", "http.request.uri",
          "http.response.code", "sip.Status-Code", "diameter.Result-Code", "diameter.Experimental-Result-Code",
          "nas_5gs.mm.5gmm_cause", "nas_5gs.sm.5gsm_cause", "ngap.unsuccessfulOutcome_element",
          "nas_5gs.mm.message_type", "nas_5gs.sm.message_type", "ngap.procedureCode")

NGAP_PORT = "38412"
PFCP_FROM_SMF = {"50", "52", "54", "57"}  # session establishment/modification/deletion requests, report response
PFCP_FROM_UPF = {"51", "53", "55", "56"}
SBI_ROLES = ("amf", "smf", "upf", "nrf", "ausf", "udm", "udr", "pcf", "nssf", "bsf", "chf", "nef", "smsf", "scp")
NORMAL_5GSM_CAUSES = {"36"}  # regular deactivation: a release, not a failure
LABEL_MAX = 90
NOTE_MAX = 200  # a verdict's Note names a rule, its clause and what the clause says
# Messages that report a failure by what they are, whatever cause IE they carry (an AUTHENTICATION
# REJECT has none): field -> value as `tshark -T fields` prints it -> name.
FAILURE_MESSAGES = {
    "nas_5gs.mm.message_type": {"0x44": "REGISTRATION REJECT", "0x4d": "SERVICE REJECT",
                                "0x58": "AUTHENTICATION REJECT", "0x59": "AUTHENTICATION FAILURE",
                                "0x5f": "SECURITY MODE REJECT", "0x64": "5GMM STATUS"},
    "nas_5gs.sm.message_type": {"0xc3": "PDU SESSION ESTABLISHMENT REJECT", "0xca": "PDU SESSION MODIFICATION REJECT",
                                "0xcd": "PDU SESSION MODIFICATION COMMAND REJECT",
                                "0xd2": "PDU SESSION RELEASE REJECT", "0xd6": "5GSM STATUS"},
    "ngap.procedureCode": {str(PROC_NAS_NON_DELIVERY): "NGAP NASNonDeliveryIndication",
                           str(PROC_ERROR_INDICATION): "NGAP ErrorIndication"},
}
_SBI_PATH = re.compile(r"^/n([a-z]+)-")
_ABSOLUTE = re.compile(r"^[a-z][a-z0-9+.-]*://[^/]*", re.IGNORECASE)  # an HTTP/1.1 absolute-form request URI
# SCTP control chunks Wireshark writes before the payload's own Info ("SACK (Ack=1, Arwnd=1) , ...").
_SCTP_NOISE = re.compile(r"^(?:(?:SACK|INIT|INIT_ACK|COOKIE_ECHO|COOKIE_ACK|HEARTBEAT|HEARTBEAT_ACK|SHUTDOWN"
                         r"|SHUTDOWN_ACK|SHUTDOWN_COMPLETE|ABORT|ERROR|FORWARD_TSN)(?: \([^)]*\))? ?,? ?)+")
_DIAMETER_IDS = re.compile(r" h2h=\S+ e2e=\S+")
# Mermaid reads `;` as a statement end and `#` as an entity start; `<`/`>` as HTML; `:` splits a message.
# `$$...$$` is KaTeX when the diagram is rendered (not when parsed): a bad command fails the whole render
# and a good one draws what the packet wants (`\Huge`, `\rule`), so no two `$` may meet.
_UNSAFE = str.maketrans({";": ",", "#": "no.", "<": "‹", ">": "›", "\n": " ", "\r": " ", "\t": " ", "%": "pct",
                         "{": "(", "}": ")", '"': "'", "$": "＄"})


def values(cell: Any) -> list[str]:
    """A `-T fields` cell (null, text or list) as a list of texts."""
    if cell is None:
        return []
    return [str(v) for v in cell] if isinstance(cell, list) else [str(cell)]


def last(cell: Any) -> str | None:
    """The innermost value: tunnelled frames give (outer, inner) addresses."""
    got = values(cell)
    return got[-1] if got else None


def clean_info(protocol: str, info: str) -> str:
    """Wireshark's Info column without SCTP chunk noise, Diameter hop ids or the trailing ' | '."""
    text = _SCTP_NOISE.sub("", info.strip()) or info.strip()
    text = _DIAMETER_IDS.sub("", text)
    return re.sub(r"[\s|]+$", "", text)


def safe(text: str, limit: int = LABEL_MAX) -> str:
    """Text that Mermaid shows as written, never as syntax."""
    text = " ".join(text.translate(_UNSAFE).split())
    text = text.replace("--", "-").replace("->", "-›")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def label(row: dict[str, Any]) -> str:
    protocol = str(row.get("_ws.col.Protocol") or "")
    return safe(f"[{row['frame.number']}] {protocol} {clean_info(protocol, str(row.get('_ws.col.Info') or ''))}")


def failure(row: dict[str, Any]) -> str | None:
    """The cause when the frame reports a failure, else None."""
    causes = [names[v] for name, names in FAILURE_MESSAGES.items() for v in values(row.get(name)) if v in names]
    if row.get("ngap.unsuccessfulOutcome_element") is not None:
        causes.append("NGAP unsuccessful outcome")
    causes += [f"5GMM cause {c}" for c in values(row.get("nas_5gs.mm.5gmm_cause"))]
    causes += [f"5GSM cause {c}" for c in values(row.get("nas_5gs.sm.5gsm_cause")) if c not in NORMAL_5GSM_CAUSES]
    causes += [f"PFCP cause {c}" for c in values(row.get("pfcp.cause")) if c != "1"]
    for name, what in (("http2.headers.status", "HTTP"), ("http.response.code", "HTTP"),
                       ("sip.Status-Code", "SIP")):
        causes += [f"{what} {c}" for c in values(row.get(name)) if c.isdigit() and int(c) >= 400]
    for name in ("diameter.Result-Code", "diameter.Experimental-Result-Code"):
        causes += [f"Diameter result {c}" for c in values(row.get(name)) if c.isdigit() and int(c) >= 3000]
    return ", ".join(dict.fromkeys(causes)) or None


Port = str | None
End = tuple[str, Port]  # (address, port): one side of a frame


def end_text(end: End) -> str:
    """'10.0.0.1:38412', '[fd00::1]:7777', or the plain address of an end without a port."""
    address, port = end
    if port is None:
        return address
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def ports(row: dict[str, Any]) -> tuple[Port, Port]:
    """(source, destination) port of the innermost transport: TCP, then SCTP, then UDP (GTP-U's outer UDP
    comes before an inner UDP header, so the last value is the inner one)."""
    for proto in ("tcp", "sctp", "udp"):
        src, dst = last(row.get(f"{proto}.srcport")), last(row.get(f"{proto}.dstport"))
        if src is not None and dst is not None:
            return src, dst
    return None, None


def sbi_role(path: str) -> str | None:
    """The NF a request's :path (or HTTP/1.1 request URI, absolute or not) names by its service."""
    found = _SBI_PATH.match(_ABSOLUTE.sub("", path))
    return found.group(1).upper() if found and found.group(1) in SBI_ROLES else None


def role_votes(row: dict[str, Any], src: End, dst: End) -> Iterable[tuple[End, str]]:
    """(end, role) evidence one frame gives: NGAP by the SCTP port 38412 (AMF) and its peer (gNB), PFCP
    by the direction of session messages (the SMF sends the requests), SBI by the service a request's
    path names (the server end of the stream is that NF; its client end gets no name from it)."""
    if "NGAP" in str(row.get("_ws.col.Protocol")):
        if last(row.get("sctp.dstport")) == NGAP_PORT:
            yield from ((src, "gNB"), (dst, "AMF"))
        elif last(row.get("sctp.srcport")) == NGAP_PORT:
            yield from ((src, "AMF"), (dst, "gNB"))
    pfcp = set(values(row.get("pfcp.msg_type")))
    if pfcp & PFCP_FROM_SMF:
        yield from ((src, "SMF"), (dst, "UPF"))
    if pfcp & PFCP_FROM_UPF:
        yield from ((src, "UPF"), (dst, "SMF"))
    for path in values(row.get("http2.headers.path")) + values(row.get("http.request.uri")):
        if (role := sbi_role(path)) is not None:
            yield dst, role


@dataclass
class Arrow:
    frame: int
    time: float
    src: End
    dst: End
    text: str
    cause: str | None
    verdicts: list[str] = field(default_factory=list)  # the procedure verdicts it decided, each with its rule

    @property
    def failed(self) -> bool:
        return self.cause is not None or bool(self.verdicts)


@dataclass
class Lifeline:
    address: str
    port: Port  # None: every end of the address not drawn on a lifeline of its own
    role: str | None

    @property
    def shown(self) -> str:
        where = end_text((self.address, self.port))
        return safe(f"{self.role} {where}" if self.role else where)



class Drawn(TypedDict):
    """A diagram as data: its lifelines, its arrows (as the ladder view draws them) and the failed ones."""

    participants: list[dict[str, Any]]
    arrows: int
    messages: list[dict[str, Any]]
    failures: list[dict[str, Any]]


@dataclass
class Diagram:
    arrows: list[Arrow] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # frames without an IP source and destination
    votes: dict[End, set[str]] = field(default_factory=dict)
    # frame -> what it decided: ["PDU Session Establishment failure: rule pdu-5gmm-status, TS ...: ..."]
    verdicts: dict[int, list[str]] = field(default_factory=dict)

    def add(self, row: dict[str, Any]) -> None:
        src_ip = last(row.get("ip.src")) or last(row.get("ipv6.src"))
        dst_ip = last(row.get("ip.dst")) or last(row.get("ipv6.dst"))
        if src_ip is None or dst_ip is None:
            self.skipped.append(int(row["frame.number"]))
            return
        src_port, dst_port = ports(row)
        src, dst = (src_ip, src_port), (dst_ip, dst_port)
        for end, role in role_votes(row, src, dst):
            self.votes.setdefault(end, set()).add(role)
        time = float(last(row.get("frame.time_epoch")) or 0.0)
        frame = int(row["frame.number"])
        self.arrows.append(Arrow(frame, time, src, dst, label(row), failure(row), self.verdicts.get(frame, [])))

    def end_role(self, end: End) -> str | None:
        """The end's role when all its evidence names one."""
        found = self.votes.get(end, set())
        return next(iter(found)) if len(found) == 1 else None

    def lifelines(self) -> dict[End, Lifeline]:
        """Each end's lifeline. An address is one lifeline (named by its role when every piece of evidence
        for any of its ends names the same one) unless its ends are told apart: two of its ends named
        differently (an all-in-one core: AMF on 38412, SMF on 8805, AUSF by its SBI port), or two of its
        ends talking to each other. Then each named end is a lifeline of its own, and the unnamed ends
        (clients' ephemeral ports) share one lifeline per address unless they too talk to each other."""
        ends = list(dict.fromkeys(e for a in self.arrows for e in (a.src, a.dst)))
        by_address: dict[str, list[End]] = {}
        for end in ends:
            by_address.setdefault(end[0], []).append(end)
        talk = {(a.src, a.dst) for a in self.arrows if a.src[0] == a.dst[0] and a.src != a.dst}
        out: dict[End, Lifeline] = {}
        for address, mine in by_address.items():
            named = {e: r for e in mine if (r := self.end_role(e)) is not None}
            if len(set(named.values())) <= 1 and not any(s[0] == address for s, _ in talk):
                found = set().union(*(self.votes.get(e, set()) for e in mine))
                whole = Lifeline(address, None, next(iter(found)) if len(found) == 1 else None)
                out.update({e: whole for e in mine})
                continue
            unnamed = [e for e in mine if e not in named]
            shared = not any(s in unnamed and d in unnamed for s, d in talk)
            rest = Lifeline(address, None, None)
            for end in mine:
                if end in named:
                    out[end] = Lifeline(address, end[1], named[end])
                else:
                    out[end] = rest if shared else Lifeline(address, end[1], None)
        return out

    def participants(self) -> dict[End, tuple[str, Lifeline]]:
        """end -> (Mermaid id, lifeline), ids numbered in first-seen order of the lifelines."""
        lines = self.lifelines()
        ids: dict[int, str] = {}
        out: dict[End, tuple[str, Lifeline]] = {}
        for arrow in self.arrows:
            for end in (arrow.src, arrow.dst):
                line = lines[end]
                if id(line) not in ids:
                    ids[id(line)] = f"{line.role or 'N'}_{len(ids) + 1}"
                out[end] = (ids[id(line)], line)
        return out

    def gap_threshold(self) -> float:
        """A pause worth a Note: over 1 s and ten times the flow's median gap."""
        gaps = [b.time - a.time for a, b in zip(self.arrows, self.arrows[1:], strict=False)]
        return max(1.0, 10 * statistics.median(gaps)) if gaps else float("inf")

    def mermaid(self) -> str:
        names = self.participants()
        lines = ["sequenceDiagram"]
        lines += [f"    participant {ident} as {line.shown}"
                  for ident, line in dict(names.values()).items()]
        threshold = self.gap_threshold()
        previous: Arrow | None = None
        for arrow in self.arrows:
            src, dst = names[arrow.src][0], names[arrow.dst][0]
            if previous is not None and arrow.time - previous.time > threshold:
                span = src if src == dst else f"{src},{dst}"
                lines.append(f"    Note over {span}: +{arrow.time - previous.time:.3f} s")
            lines.append(f"    {src}{'-x' if arrow.failed else '->>'}{dst}: {arrow.text}")
            notes = ([arrow.cause] if arrow.cause else []) + arrow.verdicts
            lines += [f"    Note right of {dst}: {safe(note, NOTE_MAX)}" for note in notes]
            previous = arrow
        return "\n".join(lines) + "\n"

    def describe(self) -> Drawn:
        names = self.participants()
        lines = dict(names.values())
        return {"participants": [{"id": i, "name": line.shown, "address": line.address, "port": line.port,
                                  "role": line.role} for i, line in lines.items()],
                "arrows": len(self.arrows),
                # Each arrow as the Mermaid draws it, for a view that draws the ladder itself (docs/views.md).
                "messages": [{"frame": a.frame, "time": a.time, "from": ids[0], "to": ids[1], "label": a.text,
                              "failed": a.failed}
                             for a in self.arrows for ids in [(names[a.src][0], names[a.dst][0])]],
                "failures": [{"frame": a.frame, "cause": a.cause, **({"verdicts": a.verdicts} if a.verdicts else {})}
                             for a in self.arrows if a.failed]}


def build(rows: list[dict[str, Any]], verdicts: dict[int, list[str]] | None = None) -> Diagram:
    """The diagram of `rows`; `verdicts`: the frames that decided a procedure's reject or failure, with
    the rule that did (each one's arrow is `-x` with a Note naming the rule)."""
    diagram = Diagram(verdicts=dict(verdicts or {}))
    for row in rows:
        diagram.add(row)
    return diagram
