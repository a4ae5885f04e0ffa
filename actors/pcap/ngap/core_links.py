"""The N4 (PFCP) and SBI (HTTP/2, HTTP/1.1) messages that belong to a PDU session establishment.

Rows come from `tshark -T fields` (CORE_FIELDS, two-pass). Each attached message says what links
it (`linked_by`), strongest evidence first:
- PFCP Session Establishment Request: its PDI's UE IP address equals the PDU address the NAS
  PDU SESSION ESTABLISHMENT ACCEPT gave the UE;
- Namf_Communication N1N2MessageTransfer: the SUPI in its path is the UE's (null-scheme SUCI:
  imsi-<MCC><MNC><MSIN>);
- otherwise (a rejected session has no UE address; CreateSMContext carries the SUPI only in its
  JSON body): the request falls inside exactly one establishment's time window, first to last frame.
A request inside several windows and with no stronger evidence is left unattached and counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CORE_FILTER = "pfcp.msg_type in {50, 51} || http2.type == 1 || http.request || http.response"
CORE_FIELDS = ("frame.number", "frame.time_epoch", "pfcp.msg_type", "pfcp.seqno", "pfcp.ue_ip_addr_ipv4",
               "pfcp.cause", "pfcp.response_in", "tcp.stream", "http2.streamid", "http2.headers.method",
               "http2.headers.path", "http2.headers.status", "http.request.method", "http.request.uri",
               "http.response_in", "http.response.code", "gtp.teid")
SBI_OPERATIONS = (("/nsmf-pdusession/", "/sm-contexts", "Nsmf_PDUSession CreateSMContext"),
                  ("/namf-comm/", "/n1-n2-messages", "Namf_Communication N1N2MessageTransfer"))


@dataclass
class CoreMessage:
    interface: str  # N4 | SBI
    message: str
    frame: int
    time: float
    response_frame: int | None = None
    response_time: float | None = None
    result: str | None = None  # PFCP cause, HTTP status
    ue_ipv4: str | None = None
    supi: str | None = None

    def describe(self, linked_by: str) -> dict[str, Any]:
        latency = (round((self.response_time - self.time) * 1000, 3) if self.response_time is not None else None)
        return {"interface": self.interface, "message": self.message, "frame": self.frame, "time": round(self.time, 6),
                "response_frame": self.response_frame, "latency_ms": latency, "result": self.result,
                "linked_by": linked_by, **({} if self.response_frame is not None else {"why": "no response seen"})}


@dataclass
class Establishment:
    """What linking needs of one PDU session establishment instance."""

    start: float
    end: float
    ue_ipv4: str | None
    supi_parts: tuple[str, str, str] | None  # (mcc, mnc, msin) from a null-scheme SUCI
    attached: list[dict[str, Any]] = field(default_factory=list)


def _first(row: dict[str, str], name: str) -> str | None:
    value = row.get(name) or ""
    return value.split(",")[0] or None


def core_messages(rows: list[dict[str, str]]) -> list[CoreMessage]:
    """PFCP session establishments and the SBI calls of SBI_OPERATIONS, each with its response."""
    by_frame = {int(r["frame.number"]): r for r in rows}
    out: list[CoreMessage] = []
    h2_answers: dict[tuple[str, str], list[dict[str, str]]] = {}
    for row in rows:
        if _first(row, "http2.headers.status") and _first(row, "tcp.stream"):
            for sid in (row.get("http2.streamid") or "").split(","):
                h2_answers.setdefault((row["tcp.stream"], sid), []).append(row)
    for row in rows:
        frame, time = int(row["frame.number"]), float(row["frame.time_epoch"])
        if _first(row, "pfcp.msg_type") == "50":
            msg = CoreMessage("N4", "PFCP Session Establishment Request", frame, time,
                              ue_ipv4=_first(row, "pfcp.ue_ip_addr_ipv4"))
            answer = by_frame.get(int(_first(row, "pfcp.response_in") or 0))
            if answer is not None:
                msg.response_frame, msg.response_time = int(answer["frame.number"]), float(answer["frame.time_epoch"])
                msg.result = f"cause {_first(answer, 'pfcp.cause')}"
            out.append(msg)
            continue
        if _first(row, "gtp.teid"):
            continue  # user-plane HTTP inside GTP-U, not the SBI
        path = _first(row, "http2.headers.path") or _first(row, "http.request.uri")
        method = _first(row, "http2.headers.method") or _first(row, "http.request.method")
        name = next((n for prefix, suffix, n in SBI_OPERATIONS if path and path.startswith(prefix)
                     and path.endswith(suffix)), None)
        if name is None or method not in (None, "POST"):  # HPACK may have lost :method; the path stays
            continue
        msg = CoreMessage("SBI", name, frame, time)
        if path and "/ue-contexts/imsi-" in path:
            msg.supi = path.split("/ue-contexts/")[1].split("/")[0]
        if row.get("http.response_in"):
            answer = by_frame.get(int(_first(row, "http.response_in") or 0))
            status = _first(answer, "http.response.code") if answer else None
        else:
            sid = _first(row, "http2.streamid") or ""
            later = [a for a in h2_answers.get((row.get("tcp.stream", ""), sid), [])
                     if int(a["frame.number"]) > frame]
            answer = later[0] if later else None
            status = _first(answer, "http2.headers.status") if answer else None
        if answer is not None:
            msg.response_frame, msg.response_time = int(answer["frame.number"]), float(answer["frame.time_epoch"])
            msg.result = f"HTTP {status}"
        out.append(msg)
    return out


def attach(establishments: list[Establishment], messages: list[CoreMessage]) -> dict[str, Any]:
    """Attach each message to its establishment; returns counts of what stayed unattached."""
    unattached = 0
    for msg in messages:
        target, how = None, None
        if msg.ue_ipv4:
            hits = [e for e in establishments if e.ue_ipv4 == msg.ue_ipv4]
            if len(hits) == 1:
                target, how = hits[0], f"UE IPv4 {msg.ue_ipv4} in the PFCP PDI = PDU address in the NAS accept"
        if target is None and msg.supi:
            hits = [e for e in establishments if e.supi_parts and e.start <= msg.time <= e.end
                    and msg.supi == f"imsi-{''.join(e.supi_parts)}"]
            if len(hits) == 1:
                target, how = hits[0], f"SUPI {msg.supi} in the path = the UE's SUCI (null scheme), in its time window"
        if target is None:
            hits = [e for e in establishments if e.start <= msg.time <= e.end]
            if len(hits) == 1:
                target, how = hits[0], "timing window: the only PDU session establishment in progress"
        if target is None or how is None:
            unattached += 1
            continue
        target.attached.append(msg.describe(how))
    return {"n4_sbi_messages": len(messages), "unattached": unattached}
