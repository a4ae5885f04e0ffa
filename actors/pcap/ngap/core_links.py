"""The N4 (PFCP) and SBI (HTTP/2, HTTP/1.1) messages that belong to a PDU session establishment.

Rows come from `tshark -T fields` (CORE_FIELDS, two-pass). The SBI calls are the AMF's
CreateSMContext and N1N2MessageTransfer and, in home-routed roaming, the V-SMF's Nsmf_PDUSession
Create to the H-SMF (POST .../pdu-sessions, TS 29.502 5.2.2.7); their JSON bodies (HTTP/2 DATA frames
of the same stream, or the HTTP/1.1 message) are read for what names the session. Each attached
message says what links it (`linked_by`), strongest evidence first:
- a UE IPv4 address equal to the PDU address the NAS PDU SESSION ESTABLISHMENT ACCEPT gave the UE:
  the PFCP Session Establishment Request's PDI, or the `ueIpv4Address` the H-SMF's answer to a
  Create allocated;
- the SUPI (imsi-<MCC><MNC><MSIN>, the UE's null-scheme SUCI) in an N1N2MessageTransfer's path or in
  a request body's `supi`, inside the establishment's time window, with the body's `pduSessionId`
  equal to the establishment's PDU session id when both are known;
- otherwise (a rejected session has no UE address; a body without `supi`): the request falls inside
  exactly one establishment's time window, first to last frame.
A request inside several windows and with no stronger evidence is left unattached and counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# HTTP/2 DATA frames only when their JSON names a session (a request's supi, a Create answer's UE address).
CORE_FILTER = ('pfcp.msg_type in {50, 51} || http2.type == 1 || http.request || http.response || '
               '(http2.type == 0 && json.key in {"supi", "ueIpv4Address"})')
CORE_FIELDS = ("frame.number", "frame.time_epoch", "pfcp.msg_type", "pfcp.seqno", "pfcp.ue_ip_addr_ipv4",
               "pfcp.cause", "pfcp.response_in", "tcp.stream", "http2.streamid", "http2.headers.method",
               "http2.headers.path", "http2.headers.status", "http.request.method", "http.request.uri",
               "http.response_in", "http.response.code", "gtp.teid", "json.path_with_value", "http2.type")
SBI_OPERATIONS = (("/nsmf-pdusession/", "/sm-contexts", "Nsmf_PDUSession CreateSMContext"),
                  ("/namf-comm/", "/n1-n2-messages", "Namf_Communication N1N2MessageTransfer"),
                  ("/nsmf-pdusession/", "/pdu-sessions", "Nsmf_PDUSession Create"))  # V-SMF -> H-SMF
# Top-level JSON members (json.path_with_value) that name the session: SmContextCreateData and
# PduSessionCreateData (TS 29.502 6.1.6.2.2, 6.1.6.2.9) carry supi and pduSessionId, PduSessionCreatedData the
# UE's ueIpv4Address.
BODY_MEMBERS = {"/supi:": "supi", "/pduSessionId:": "psi", "/ueIpv4Address:": "ue_ipv4"}


@dataclass
class CoreMessage:
    interface: str  # N4 | SBI
    message: str
    frame: int
    time: float
    response_frame: int | None = None
    response_time: float | None = None
    result: str | None = None  # PFCP cause, HTTP status
    ue_ipv4: str | None = None  # N4: the PDI's UE IP address; SBI: the answer's ueIpv4Address
    supi: str | None = None
    supi_in: str = "path"  # where the SUPI was read: the request's path or its JSON body
    psi: int | None = None  # the request body's pduSessionId

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
    psi: int | None = None  # its PDU session id


def _first(row: dict[str, str], name: str) -> str | None:
    value = row.get(name) or ""
    return value.split(",")[0] or None


def _streams(row: dict[str, str]) -> set[str]:
    return {sid for sid in (row.get("http2.streamid") or "").split(",") if sid and sid != "0"}


def _headers_stream(row: dict[str, str]) -> str:
    """The stream id of the row's HEADERS frame (http2.type 1; the two lists run in step), else its first
    stream but 0: a segment may carry a SETTINGS ACK or WINDOW_UPDATE (stream 0) or DATA before the HEADERS."""
    sids, kinds = (row.get("http2.streamid") or "").split(","), (row.get("http2.type") or "").split(",")
    if len(kinds) == len(sids) and "1" in kinds:
        return sids[kinds.index("1")]
    return next((sid for sid in sids if sid and sid != "0"), sids[0])


def body(rows: list[dict[str, str]]) -> dict[str, str]:
    """The BODY_MEMBERS these rows' JSON carries (the first of each)."""
    found: dict[str, str] = {}
    for row in rows:
        for member in (row.get("json.path_with_value") or "").split(","):
            for prefix, key in BODY_MEMBERS.items():
                if member.startswith(prefix) and member[len(prefix):]:
                    found.setdefault(key, member[len(prefix):])
    return found


def core_messages(rows: list[dict[str, str]]) -> list[CoreMessage]:
    """PFCP session establishments and the SBI calls of SBI_OPERATIONS, each with its response."""
    by_frame = {int(r["frame.number"]): r for r in rows}
    out: list[CoreMessage] = []
    h2_answers: dict[tuple[str, str], list[dict[str, str]]] = {}
    h2_bodies: dict[tuple[str, str], list[dict[str, str]]] = {}  # rows with JSON of one HTTP/2 stream only
    for row in rows:
        if _first(row, "http2.headers.status") and _first(row, "tcp.stream"):
            for sid in (row.get("http2.streamid") or "").split(","):
                h2_answers.setdefault((row["tcp.stream"], sid), []).append(row)
        if row.get("json.path_with_value") and len(streams := _streams(row)) == 1:
            h2_bodies.setdefault((row.get("tcp.stream", ""), streams.pop()), []).append(row)
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
        if row.get("http.response_in"):
            answer = by_frame.get(int(_first(row, "http.response_in") or 0))
            status = _first(answer, "http.response.code") if answer else None
            sent, got = body([row]), body([answer] if answer else [])
        else:
            key = (row.get("tcp.stream", ""), _headers_stream(row))
            later = [a for a in h2_answers.get(key, []) if int(a["frame.number"]) > frame]
            answer = later[0] if later else None
            status = _first(answer, "http2.headers.status") if answer else None
            until = int(answer["frame.number"]) if answer else None
            mine = [b for b in h2_bodies.get(key, []) if int(b["frame.number"]) >= frame]
            sent = body([b for b in mine if until is None or int(b["frame.number"]) < until])
            got = body([b for b in mine if until is not None and int(b["frame.number"]) >= until])
        if path and "/ue-contexts/imsi-" in path:
            msg.supi = path.split("/ue-contexts/")[1].split("/")[0]
        elif sent.get("supi", "").startswith("imsi-"):
            msg.supi, msg.supi_in = sent["supi"], "body"
        msg.psi = int(sent["psi"]) if sent.get("psi", "").isdigit() else None
        msg.ue_ipv4 = got.get("ue_ipv4")
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
            where = "the PFCP PDI" if msg.interface == "N4" else "the answer's ueIpv4Address"
            if len(hits) == 1:
                target, how = hits[0], f"UE IPv4 {msg.ue_ipv4} in {where} = PDU address in the NAS accept"
        if target is None and msg.supi:
            hits = [e for e in establishments if e.supi_parts and e.start <= msg.time <= e.end
                    and msg.supi == f"imsi-{''.join(e.supi_parts)}"
                    and (msg.psi is None or e.psi is None or msg.psi == e.psi)]
            psi = f" and PDU session id {msg.psi}" if msg.psi is not None else ""
            if len(hits) == 1:
                target, how = hits[0], (f"SUPI {msg.supi}{psi} in the {msg.supi_in} = the UE's SUCI (null scheme)"
                                        f"{psi and ' and its session'}, in its time window")
        if target is None:
            hits = [e for e in establishments if e.start <= msg.time <= e.end]
            if len(hits) == 1:
                target, how = hits[0], "timing window: the only PDU session establishment in progress"
        if target is None or how is None:
            unattached += 1
            continue
        target.attached.append(msg.describe(how))
    return {"n4_sbi_messages": len(messages), "unattached": unattached}
