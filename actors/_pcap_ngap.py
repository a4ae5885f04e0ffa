"""5G N2 summaries from NGAP protocol trees: per UE, and per PDU session.

Each NGAP PDU is read from its own subtree, so a frame bundling several PDUs (SCTP carries many
DATA chunks per frame) yields one record per PDU with its own UE ids. Names come from
Wireshark's labels; codes from the raw values, never from a home-made decoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagd.actors._pcap_tree import Node, label_name, labelled, protocol_nodes

PDU_TYPES = {"0": "initiatingMessage", "1": "successfulOutcome", "2": "unsuccessfulOutcome"}
NGAP_CAUSE_GROUPS = ("ngap.radioNetwork", "ngap.transport", "ngap.nas", "ngap.protocol", "ngap.misc")


@dataclass
class NgapPdu:
    frame: int
    time: float
    procedure_code: int | None = None
    procedure: str | None = None
    pdu_type: str | None = None  # initiatingMessage | successfulOutcome | unsuccessfulOutcome
    ran_ue_id: str | None = None
    amf_ue_id: str | None = None
    nas: list[dict[str, Any]] = field(default_factory=list)
    causes: list[dict[str, Any]] = field(default_factory=list)
    values: dict[str, list[str]] = field(default_factory=dict)

    def first(self, name: str) -> str | None:
        got = self.values.get(name)
        return got[0] if got else None


_KEEP = {
    "nas_5gs.mm.suci.msin", "nas_5gs.5g_tmsi", "nas_5gs.pdu_session_id", "ngap.pDUSessionID", "nas_5gs.cmn.dnn",
    "nas_5gs.sm.pdu_addr_inf_ipv4", "ngap.TransportLayerAddressIPv4", "ngap.gTP_TEID", "ngap.qosFlowIdentifier",
    "ngap.sST", "ngap.sD", "nas_5gs.mm.sst", "e212.mcc", "e212.mnc",
}


def pdus_in_frame(frame: int, tree: list[Node]) -> list[NgapPdu]:
    epoch = 0.0
    for name, value, _ in labelled(tree[:1]):
        if name == "frame.time_epoch" and value is not None:
            epoch = float(value)
            break
    pdus = []
    for node in protocol_nodes(tree, {"ngap"}):
        pdu = NgapPdu(frame=frame, time=epoch)
        for name, value, label in labelled([node]):
            if value is None:
                continue
            elif name == "ngap.NGAP_PDU" and pdu.pdu_type is None:  # the CHOICE index of the PDU
                pdu.pdu_type = PDU_TYPES.get(value, value)
            elif name == "ngap.procedureCode" and pdu.procedure_code is None:
                pdu.procedure_code = int(value)
                pdu.procedure = label_name(label).removeprefix("id-")
            elif name == "ngap.RAN_UE_NGAP_ID" and pdu.ran_ue_id is None:
                pdu.ran_ue_id = value
            elif name == "ngap.AMF_UE_NGAP_ID" and pdu.amf_ue_id is None:
                pdu.amf_ue_id = value
            elif name in ("nas_5gs.mm.message_type", "nas_5gs.sm.message_type"):
                pdu.nas.append({"frame": frame, "layer": "5GMM" if ".mm." in name else "5GSM",
                                "code": value, "message": label_name(label)})
            elif name in ("nas_5gs.mm.5gmm_cause", "nas_5gs.sm.5gsm_cause"):
                pdu.causes.append({"frame": frame, "kind": "5GMM" if ".mm." in name else "5GSM",
                                   "code": int(value), "cause": label_name(label),
                                   "message": pdu.nas[-1]["message"] if pdu.nas else None})
            elif name in NGAP_CAUSE_GROUPS:
                pdu.causes.append({"frame": frame, "kind": "NGAP", "group": name.removeprefix("ngap."),
                                   "code": int(value), "cause": label_name(label), "procedure": pdu.procedure})
            if value is not None and name in _KEEP:
                pdu.values.setdefault(name, []).append(value)
        pdus.append(pdu)
    return pdus


def _is_failure(cause: dict[str, Any], pdu: NgapPdu) -> bool:
    if cause["kind"] != "NGAP":
        return True
    # NGAP causes in normal releases (e.g. nas: normal-release) are not failures.
    abnormal = cause["group"] in ("radioNetwork", "transport", "protocol", "misc") and \
        "release" not in cause["cause"].lower()
    return pdu.pdu_type == "unsuccessfulOutcome" or "Fail" in (pdu.procedure or "") or abnormal


def ue_sessions(pdus: list[NgapPdu]) -> dict[str, Any]:
    ues: dict[str, dict[str, Any]] = {}
    amf_to_ran: dict[str, str] = {}
    non_ue: list[dict[str, Any]] = []
    for pdu in pdus:
        ran = pdu.ran_ue_id or (amf_to_ran.get(pdu.amf_ue_id) if pdu.amf_ue_id else None)
        step = {"frame": pdu.frame, "procedure": pdu.procedure, "code": pdu.procedure_code, "type": pdu.pdu_type}
        if ran is None:
            non_ue.append(step)
            continue
        if pdu.amf_ue_id:
            amf_to_ran[pdu.amf_ue_id] = ran
        ue = ues.setdefault(ran, {
            "ran_ue_ngap_id": int(ran), "amf_ue_ngap_id": None, "suci_msin": None, "5g_tmsi": None, "plmn": None,
            "first_time": pdu.time, "last_time": pdu.time, "frames": [], "procedures": [], "nas_messages": [],
            "failures": [], "registration": "unknown",
        })
        if pdu.amf_ue_id and ue["amf_ue_ngap_id"] is None:
            ue["amf_ue_ngap_id"] = int(pdu.amf_ue_id)
        ue["suci_msin"] = ue["suci_msin"] or pdu.first("nas_5gs.mm.suci.msin")
        ue["5g_tmsi"] = ue["5g_tmsi"] or pdu.first("nas_5gs.5g_tmsi")
        if ue["plmn"] is None and pdu.first("e212.mcc"):
            ue["plmn"] = {"mcc": pdu.first("e212.mcc"), "mnc": pdu.first("e212.mnc")}
        ue["first_time"] = min(ue["first_time"], pdu.time)
        ue["last_time"] = max(ue["last_time"], pdu.time)
        if pdu.frame not in ue["frames"]:
            ue["frames"].append(pdu.frame)
        ue["procedures"].append(step)
        ue["nas_messages"].extend(pdu.nas)
        ue["failures"].extend(c for c in pdu.causes if _is_failure(c, pdu))
        for message in pdu.nas:
            if message["code"] == "0x42":
                ue["registration"] = "accepted"
            elif message["code"] == "0x44":
                ue["registration"] = "rejected"
    for ue in ues.values():
        ue["duration_s"] = round(ue["last_time"] - ue["first_time"], 6)
        ue["first_time"] = round(ue["first_time"], 6)
        ue["last_time"] = round(ue["last_time"], 6)
    ordered = sorted(ues.values(), key=lambda u: (u["first_time"], u["ran_ue_ngap_id"]))
    return {"ue_count": len(ordered), "ues": ordered, "non_ue_procedures": non_ue,
            "ngap_pdus": len(pdus), "failed_ues": [u["ran_ue_ngap_id"] for u in ordered if u["failures"]]}


def pdu_sessions(pdus: list[NgapPdu]) -> dict[str, Any]:
    sessions: dict[tuple[str, str], dict[str, Any]] = {}

    def session(ran: str, psi: str) -> dict[str, Any]:
        return sessions.setdefault((ran, psi), {
            "ran_ue_ngap_id": int(ran), "amf_ue_ngap_id": None, "pdu_session_id": int(psi),
            "establishment_request_frame": None, "dnn": None, "s_nssai": None,
            "establishment_accept_frame": None, "ue_ipv4": None, "establishment_reject_frame": None,
            "setup_request_frame": None, "setup_response_frame": None,
            "n3_uplink": None, "n3_downlink": None, "qfis": [], "failures": [], "status": "unknown",
        })

    for pdu in pdus:
        ran = pdu.ran_ue_id
        if ran is None:
            continue
        nas_psi = pdu.first("nas_5gs.pdu_session_id")
        for message in pdu.nas:
            if message["layer"] != "5GSM" or nas_psi is None:
                continue
            s = session(ran, nas_psi)
            s["amf_ue_ngap_id"] = s["amf_ue_ngap_id"] or (int(pdu.amf_ue_id) if pdu.amf_ue_id else None)
            code = message["code"]
            if code == "0xc1":
                s["establishment_request_frame"] = pdu.frame
                s["dnn"] = s["dnn"] or pdu.first("nas_5gs.cmn.dnn")
            elif code == "0xc2":
                s["establishment_accept_frame"] = pdu.frame
                s["ue_ipv4"] = pdu.first("nas_5gs.sm.pdu_addr_inf_ipv4")
                s["dnn"] = s["dnn"] or pdu.first("nas_5gs.cmn.dnn")
                s["status"] = "established" if s["status"] != "rejected" else s["status"]
            elif code == "0xc3":
                s["establishment_reject_frame"] = pdu.frame
                s["status"] = "rejected"
            s["failures"].extend(c for c in pdu.causes if c["kind"] == "5GSM")
            if pdu.first("nas_5gs.mm.sst") and s["s_nssai"] is None:
                s["s_nssai"] = {"sst": pdu.first("nas_5gs.mm.sst")}
        if pdu.procedure_code == 29:  # PDUSessionResourceSetup
            for psi in dict.fromkeys(pdu.values.get("ngap.pDUSessionID", [])):
                s = session(ran, psi)
                tunnel = {"address": pdu.first("ngap.TransportLayerAddressIPv4"), "teid": pdu.first("ngap.gTP_TEID")}
                if pdu.pdu_type == "initiatingMessage":
                    s["setup_request_frame"] = pdu.frame
                    s["n3_uplink"] = tunnel
                    s["qfis"] = sorted({int(q) for q in pdu.values.get("ngap.qosFlowIdentifier", [])})
                    if pdu.first("ngap.sST"):
                        s["s_nssai"] = {"sst": pdu.first("ngap.sST"), "sd": pdu.first("ngap.sD")}
                else:
                    s["setup_response_frame"] = pdu.frame
                    s["n3_downlink"] = tunnel
                s["failures"].extend(c for c in pdu.causes if c["kind"] == "NGAP")
    ordered = sorted(sessions.values(), key=lambda s: (s["ran_ue_ngap_id"], s["pdu_session_id"]))
    return {"session_count": len(ordered), "sessions": ordered,
            "rejected": [s for s in ordered if s["status"] == "rejected" or s["failures"]]}
