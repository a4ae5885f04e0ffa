"""A Mermaid `sequenceDiagram` from `tshark -T fields` rows: one arrow per frame, lifelines per address.

Why this shape:
- Lifelines are IP addresses (the innermost one when a frame is tunnelled: GTP-U, GRE), not ip:port,
  because HTTP/2 clients open connections from ephemeral ports and one NF would split into many lifelines.
- A role (gNB, AMF, SMF, UPF, NRF, ...) names an address only from protocol semantics: the SCTP side on
  port 38412 is the AMF (the other the gNB); the PFCP session requests' sender is the SMF, their receiver
  the UPF; the server of an SBI request is the NF its path names (`/nsmf-pdusession/...` -> SMF). An
  address with evidence for two roles (an SCP or proxy forwards many services) keeps its plain address.
- The message text is Wireshark's own Protocol and Info columns (NGAP procedure + NAS message, PFCP
  message, HTTP method + path / status, SIP request / status, Diameter command), minus SCTP chunk noise,
  so every arrow can be checked against `tshark -T fields -e _ws.col.Info`.
- Failures (NGAP unsuccessful outcome, 5GMM/5GSM cause, PFCP cause != 1, HTTP/SIP status >= 400,
  Diameter result >= 3000) are `-x` arrows with a Note naming the cause.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

FIELDS = ("frame.time_epoch", "ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "_ws.col.Protocol", "_ws.col.Info",
          "sctp.srcport", "sctp.dstport", "pfcp.msg_type", "pfcp.cause", "http2.headers.path",
          "http2.headers.status", "http.request.uri", "http.response.code", "sip.Status-Code",
          "diameter.Result-Code", "diameter.Experimental-Result-Code", "nas_5gs.mm.5gmm_cause",
          "nas_5gs.sm.5gsm_cause", "ngap.unsuccessfulOutcome_element")

NGAP_PORT = "38412"
PFCP_FROM_SMF = {"50", "52", "54", "57"}  # session establishment/modification/deletion requests, report response
PFCP_FROM_UPF = {"51", "53", "55", "56"}
SBI_ROLES = ("amf", "smf", "upf", "nrf", "ausf", "udm", "udr", "pcf", "nssf", "bsf", "chf", "nef", "smsf", "scp")
NORMAL_5GSM_CAUSES = {"36"}  # regular deactivation: a release, not a failure
LABEL_MAX = 90
_SBI_PATH = re.compile(r"^/n([a-z]+)-")
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


def safe(text: str) -> str:
    """Text that Mermaid shows as written, never as syntax."""
    text = " ".join(text.translate(_UNSAFE).split())
    text = text.replace("--", "-").replace("->", "-›")
    return text if len(text) <= LABEL_MAX else text[:LABEL_MAX - 1] + "…"


def label(row: dict[str, Any]) -> str:
    protocol = str(row.get("_ws.col.Protocol") or "")
    return safe(f"[{row['frame.number']}] {protocol} {clean_info(protocol, str(row.get('_ws.col.Info') or ''))}")


def failure(row: dict[str, Any]) -> str | None:
    """The cause when the frame reports a failure, else None."""
    causes: list[str] = []
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


def role_votes(row: dict[str, Any], src: str, dst: str) -> Iterable[tuple[str, str]]:
    """(address, role) evidence one frame gives."""
    if last(row.get("sctp.dstport")) == NGAP_PORT and "NGAP" in str(row.get("_ws.col.Protocol")):
        yield from ((src, "gNB"), (dst, "AMF"))
    elif last(row.get("sctp.srcport")) == NGAP_PORT and "NGAP" in str(row.get("_ws.col.Protocol")):
        yield from ((src, "AMF"), (dst, "gNB"))
    pfcp = set(values(row.get("pfcp.msg_type")))
    if pfcp & PFCP_FROM_SMF:
        yield from ((src, "SMF"), (dst, "UPF"))
    if pfcp & PFCP_FROM_UPF:
        yield from ((src, "UPF"), (dst, "SMF"))
    for path in values(row.get("http2.headers.path")) + values(row.get("http.request.uri")):
        found = _SBI_PATH.match(path)
        if found and found.group(1) in SBI_ROLES:
            yield dst, found.group(1).upper()


@dataclass
class Arrow:
    frame: int
    time: float
    src: str
    dst: str
    text: str
    cause: str | None


@dataclass
class Diagram:
    arrows: list[Arrow] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # frames without an IP source and destination
    roles: dict[str, set[str]] = field(default_factory=dict)

    def add(self, row: dict[str, Any]) -> None:
        src = last(row.get("ip.src")) or last(row.get("ipv6.src"))
        dst = last(row.get("ip.dst")) or last(row.get("ipv6.dst"))
        if src is None or dst is None:
            self.skipped.append(int(row["frame.number"]))
            return
        for address, role in role_votes(row, src, dst):
            self.roles.setdefault(address, set()).add(role)
        time = float(last(row.get("frame.time_epoch")) or 0.0)
        self.arrows.append(Arrow(int(row["frame.number"]), time, src, dst, label(row), failure(row)))

    def role(self, address: str) -> str | None:
        found = self.roles.get(address, set())
        return next(iter(found)) if len(found) == 1 else None

    def participants(self) -> dict[str, tuple[str, str]]:
        """address -> (Mermaid id, shown name), in first-seen order."""
        out: dict[str, tuple[str, str]] = {}
        for arrow in self.arrows:
            for address in (arrow.src, arrow.dst):
                if address not in out:
                    role = self.role(address)
                    ident = f"{role or 'N'}_{len(out) + 1}"
                    out[address] = (ident, safe(f"{role} {address}" if role else address))
        return out

    def gap_threshold(self) -> float:
        """A pause worth a Note: over 1 s and ten times the flow's median gap."""
        gaps = [b.time - a.time for a, b in zip(self.arrows, self.arrows[1:], strict=False)]
        return max(1.0, 10 * statistics.median(gaps)) if gaps else float("inf")

    def mermaid(self) -> str:
        names = self.participants()
        lines = ["sequenceDiagram"]
        lines += [f"    participant {ident} as {shown}" for ident, shown in names.values()]
        threshold = self.gap_threshold()
        previous: Arrow | None = None
        for arrow in self.arrows:
            src, dst = names[arrow.src][0], names[arrow.dst][0]
            if previous is not None and arrow.time - previous.time > threshold:
                span = src if src == dst else f"{src},{dst}"
                lines.append(f"    Note over {span}: +{arrow.time - previous.time:.3f} s")
            lines.append(f"    {src}{'-x' if arrow.cause else '->>'}{dst}: {arrow.text}")
            if arrow.cause:
                lines.append(f"    Note right of {dst}: {safe(arrow.cause)}")
            previous = arrow
        return "\n".join(lines) + "\n"

    def describe(self) -> dict[str, Any]:
        names = self.participants()
        return {"participants": [{"id": i, "name": n, "address": a, "role": self.role(a)}
                                 for a, (i, n) in names.items()],
                "arrows": len(self.arrows), "failures": [{"frame": a.frame, "cause": a.cause}
                                                         for a in self.arrows if a.cause]}


def build(rows: list[dict[str, Any]]) -> Diagram:
    diagram = Diagram()
    for row in rows:
        diagram.add(row)
    return diagram
