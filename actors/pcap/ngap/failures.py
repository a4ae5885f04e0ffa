"""What is a failure: the failures one NGAP PDU reports, each with its reason."""

from __future__ import annotations

from typing import Any

from diagd.actors.pcap.ngap.codes import (
    NAS_DL_TRANSPORT,
    NAS_FAILURE_MESSAGES,
    NAS_RELEASES,
    NORMAL_5GSM_RELEASE_CAUSES,
    NORMAL_NGAP_CAUSES,
    PROC_ERROR_INDICATION,
    PROC_NAS_NON_DELIVERY,
    RELEASE_PROCEDURES,
)
from diagd.actors.pcap.ngap.pdus import NgapPdu


def _normal_ngap_cause(cause: dict[str, Any]) -> bool:
    return cause["cause"] in NORMAL_NGAP_CAUSES.get(cause["group"], set())


def pdu_failures(pdu: NgapPdu) -> list[dict[str, Any]]:
    """The failures one PDU reports, each with its reason (`why`)."""
    out: list[dict[str, Any]] = []
    ngap_causes = [c for c in pdu.causes if c["kind"] == "NGAP"]
    top_causes = [c for c in ngap_causes if "pdu_session_id" not in c]
    if pdu.pdu_type == "unsuccessfulOutcome":
        out.extend({**c, "why": f"{pdu.procedure} failed (unsuccessfulOutcome)"} for c in top_causes[:1])
        if not top_causes:
            out.append({"frame": pdu.frame, "kind": "NGAP", "group": None, "code": None, "cause": None,
                        "procedure": pdu.procedure, "why": f"{pdu.procedure} failed (unsuccessfulOutcome)"})
    elif pdu.procedure_code in (PROC_ERROR_INDICATION, PROC_NAS_NON_DELIVERY):
        out.extend({**c, "why": pdu.procedure} for c in top_causes[:1])
        if not top_causes:
            out.append({"frame": pdu.frame, "kind": "NGAP", "group": None, "code": None, "cause": None,
                        "procedure": pdu.procedure, "why": pdu.procedure})
    elif pdu.procedure_code in RELEASE_PROCEDURES and pdu.initiating:
        out.extend({**c, "why": f"abnormal release cause in {pdu.procedure}"} for c in ngap_causes
                   if not _normal_ngap_cause(c))
    for item in pdu.items:
        if item.role.endswith("-failed"):
            cause = item.cause or {"frame": pdu.frame, "kind": "NGAP", "group": None, "code": None, "cause": None,
                                   "procedure": pdu.procedure, "pdu_session_id": item.psi}
            out.append({**cause, "why": f"PDU session {item.psi}: {item.role.replace('-', ' ')} in {pdu.procedure}"})
    for message in pdu.nas:
        base = {"frame": pdu.frame, "kind": message.layer, "code": message.cause, "cause": message.cause_text,
                "message": message.message}
        if message.code in NAS_FAILURE_MESSAGES:
            out.append({**base, "why": message.message})
        elif message.code == NAS_DL_TRANSPORT and message.cause is not None:
            out.append({**base, "why": "the AMF returned an unforwarded 5GSM message (DL NAS transport with a "
                                       "5GMM cause)"})
        elif message.code in NAS_RELEASES and message.cause is not None \
                and message.cause not in NORMAL_5GSM_RELEASE_CAUSES:
            out.append({**base, "why": f"abnormal cause in {message.message}"})
    return out
