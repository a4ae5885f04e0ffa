"""The procedures view (actors/pcap/ngap/procedures_view.py) on a registration built here PDU by PDU.

One gNB (10.0.0.2:9487) and one AMF (10.0.0.1:38412, TS 38.412's port), one UE: its REGISTRATION REQUEST,
an authentication it answers (TS 24.501 5.4.1.3.3: success), a SECURITY MODE REJECT (5.4.2.5: failure),
the REGISTRATION REJECT (5.5.1.2.5: reject), then a PDU SESSION ESTABLISHMENT REQUEST nobody answers
(incomplete), and an NG SETUP at the end (not UE-associated). What the view must say is written out here
from docs/5g.md ("5G procedures with timings"): counts, the failed list (rejects and failures), the
incomplete count, the association, the PDU count, the warnings, the reason of an empty answer, and the N4
link of a PFCP request that falls in the unanswered establishment's window, which runs to the capture's end.
"""

from __future__ import annotations

from typing import Any

from diagd.actors.pcap import ngap
from diagd.actors.pcap.ngap.core_links import CORE_FIELDS
from diagd.actors.pcap.ngap.pdus import NasMessage, NgapPdu

GNB, AMF = "10.0.0.2:9487", "10.0.0.1:38412"
T0 = 1_700_000_000.0
NO_CORE = ("no PFCP session establishment or SBI PDU session call in this capture: give a capture merged with "
           "the N4/SBI views (mergecap) and decode_as for HTTP/2 on its port")
FILTERED = "display_filter given: procedures are built from the filtered NGAP frames only"
PERCENTILES = "nearest rank over completed instances (success, reject, failure)"


def at(frame: int) -> float:
    return T0 + frame * 0.25  # frame n at 250 ms steps


def message(frame: int, layer: str, code: int, name: str, cause: int | None = None, psi: int | None = None,
            outer: str | None = None) -> NasMessage:
    return NasMessage(frame=frame, layer=layer, code=f"0x{code:02x}", message=name, cause=cause,
                      values={"nas_5gs.pdu_session_id": [str(psi)]} if psi is not None else {}, outer=outer)


def ue_pdu(frame: int, code: int, *nas: NasMessage, uplink: bool = True, amf: str | None = "100") -> NgapPdu:
    """A UE-associated initiating message (InitialUEMessage 15, DownlinkNASTransport 4, UplinkNASTransport 46)."""
    return NgapPdu(frame=frame, time=at(frame), procedure_code=code, procedure={15: "InitialUEMessage",
                   4: "DownlinkNASTransport", 46: "UplinkNASTransport"}[code], pdu_type="initiatingMessage",
                   ran_ue_id="1", amf_ue_id=amf, src=GNB if uplink else AMF, dst=AMF if uplink else GNB,
                   assoc_index=0, nas=list(nas))


def ng_setup(frame: int, undecoded: int = 0) -> NgapPdu:
    return NgapPdu(frame=frame, time=at(frame), procedure_code=21, procedure="NGSetup", pdu_type="initiatingMessage",
                   src=GNB, dst=AMF, assoc_index=0, nas_undecoded=undecoded)


def registration() -> list[NgapPdu]:
    mm = "5GMM"
    return [
        ue_pdu(1, 15, message(1, mm, 0x41, "Registration request"), amf=None),
        ue_pdu(2, 4, message(2, mm, 0x56, "Authentication request"), uplink=False),
        ue_pdu(3, 46, message(3, mm, 0x57, "Authentication response")),
        ue_pdu(4, 4, message(4, mm, 0x5D, "Security mode command"), uplink=False),
        ue_pdu(5, 46, message(5, mm, 0x5F, "Security mode reject", cause=24)),
        ue_pdu(6, 4, message(6, mm, 0x44, "Registration reject", cause=3), uplink=False),
        ue_pdu(7, 46, message(7, mm, 0x67, "UL NAS transport", psi=5),
               message(7, "5GSM", 0xC1, "PDU session establishment request", psi=5, outer="5GMM 0x67")),
        ng_setup(12),
    ]


def view(pdus: list[NgapPdu], filtered: bool = False, core_rows: list[dict[str, str]] | None = None
         ) -> dict[str, Any]:
    result: dict[str, Any] = ngap.procedures(ngap.build_model(pdus), filtered=filtered, core_rows=core_rows)
    return result


def brief(instances: list[dict[str, Any]]) -> list[tuple[str, int, str, str]]:
    return sorted((p["procedure"], p["first_frame"], p["outcome"], p["rule_id"]) for p in instances)


WANT = [("Authentication", 2, "success", "authentication-response"),
        ("PDU Session Establishment", 7, "incomplete", "unanswered"),
        ("Registration", 1, "reject", "registration-reject"),
        ("Security Mode", 4, "failure", "security-mode-reject")]


def test_a_registration_s_procedures_counts_failures_and_association() -> None:
    result = view(registration())
    assert result["ue_count"] == 1 and result["procedure_count"] == 4 and result["incomplete"] == 1
    (ue,) = result["ues"]
    assert {k: v for k, v in ue.items() if k != "procedures"} == {
        "ue": "A1/amf-100/ran-1", "association": "A1", "gnb": GNB, "ran_ue_ngap_id": 1, "amf_ue_ngap_id": 100}
    assert brief(ue["procedures"]) == WANT
    assert all(p["ue"] == "A1/amf-100/ran-1" for p in ue["procedures"])
    # Only rejects and failures are failed; an unanswered request is incomplete, not failed.
    assert brief(result["failed"]) == [w for w in WANT if w[2] in ("reject", "failure")]
    assert {p["procedure"]: p["cause"] for p in result["failed"]} == {
        "Registration": {"kind": "5GMM", "code": 3, "name": None},
        "Security Mode": {"kind": "5GMM", "code": 24, "name": None}}
    assert result["statistics"] == {
        "Authentication": {"count": 1, "success": 1, "reject": 0, "failure": 0, "incomplete": 0,
                           "p50_ms": 250.0, "p95_ms": 250.0, "max_ms": 250.0},
        "PDU Session Establishment": {"count": 1, "success": 0, "reject": 0, "failure": 0, "incomplete": 1,
                                      "p50_ms": None, "p95_ms": None, "max_ms": None},
        "Registration": {"count": 1, "success": 0, "reject": 1, "failure": 0, "incomplete": 0,
                         "p50_ms": 1250.0, "p95_ms": 1250.0, "max_ms": 1250.0},
        "Security Mode": {"count": 1, "success": 0, "reject": 0, "failure": 1, "incomplete": 0,
                          "p50_ms": 250.0, "p95_ms": 250.0, "max_ms": 250.0}}
    assert result["associations"] == [{"association": "A1", "endpoints": sorted([GNB, AMF]), "sctp_assoc_index": 0,
                                       "gnb": GNB, "amf": AMF, "first_frame": 1, "ngap_pdus": 8}]
    assert result["ngap_pdus"] == 8
    assert result["percentiles"] == PERCENTILES
    # An establishment and no N4/SBI row: the view says what capture would show its links.
    assert result["warnings"] == [NO_CORE]
    assert result["n4_sbi"] == {"n4_sbi_messages": 0, "unattached": 0}
    (est,) = [p for p in ue["procedures"] if p["procedure"] == "PDU Session Establishment"]
    assert est["n4_sbi"] == [] and est["pdu_session_id"] == 5
    assert "reason" not in result
    assert set(result) == {"ue_count", "procedure_count", "ues", "non_ue_procedures", "statistics", "failed",
                           "incomplete", "associations", "ngap_pdus", "percentiles", "warnings", "n4_sbi"}
    assert result["non_ue_procedures"] == []


def test_a_display_filter_is_said_before_the_missing_core() -> None:
    result = view(registration(), filtered=True)
    assert result["warnings"] == [FILTERED, NO_CORE]
    assert brief([p for u in result["ues"] for p in u["procedures"]]) == WANT


def test_no_establishment_no_core_warning() -> None:
    result = view(registration()[:6])
    assert result["warnings"] == [] and result["incomplete"] == 0 and result["procedure_count"] == 3


def pfcp_rows(request_frame: int, request_time: float) -> list[dict[str, str]]:
    """A PFCP Session Establishment Request (type 50) and its response (51, cause 1: accepted), as tshark gives them."""
    def row(**values: str) -> dict[str, str]:
        return {name: values.get(name.replace(".", "_"), "") for name in CORE_FIELDS}
    return [row(frame_number=str(request_frame), frame_time_epoch=f"{request_time:.6f}", pfcp_msg_type="50",
                pfcp_seqno="1", pfcp_response_in=str(request_frame + 1)),
            row(frame_number=str(request_frame + 1), frame_time_epoch=f"{request_time + 0.002:.6f}",
                pfcp_msg_type="51", pfcp_seqno="1", pfcp_cause="1")]


def test_an_unanswered_establishment_s_window_runs_to_the_capture_s_last_ngap_pdu() -> None:
    """A PFCP request after the establishment's own last frame (7) but before the capture's last NGAP PDU (12):
    the only establishment in progress, so it is linked by the timing window; one after frame 12 is not."""
    inside = view(registration(), core_rows=pfcp_rows(100, at(10)))
    assert inside["n4_sbi"] == {"n4_sbi_messages": 1, "unattached": 0}
    assert inside["warnings"] == []
    (est,) = [p for u in inside["ues"] for p in u["procedures"] if p["procedure"] == "PDU Session Establishment"]
    assert [(m["interface"], m["frame"], m["response_frame"], m["linked_by"]) for m in est["n4_sbi"]] == [
        ("N4", 100, 101, "timing window: the only PDU session establishment in progress")]
    after = view(registration(), core_rows=pfcp_rows(100, at(13)))
    assert after["n4_sbi"] == {"n4_sbi_messages": 1, "unattached": 1}
    assert after["warnings"] == []  # N4 messages were given: nothing to ask for


def test_an_empty_answer_says_why() -> None:
    for filtered, reason in ((False, "no NGAP over SCTP in the capture"),
                             (True, "no NGAP over SCTP in the capture that matches the display filter")):
        result = view([], filtered=filtered)
        assert result["reason"] == reason
        assert (result["ue_count"], result["procedure_count"], result["ues"], result["statistics"], result["failed"],
                result["incomplete"], result["associations"], result["ngap_pdus"]) == (0, 0, [], {}, [], 0, [], 0)
        assert result["warnings"] == ([FILTERED] if filtered else [])
    # NGAP, but no procedure message in it; NAS that did not decode is named as the likely cause.
    result = view([ng_setup(1)])
    assert result["reason"] == "no procedure message (TS 24.501 / 38.413) in the NGAP PDUs"
    assert result["ngap_pdus"] == 1 and result["ue_count"] == 0
    result = view([ng_setup(1), ng_setup(2, undecoded=1)], filtered=True)
    assert result["reason"] == ("no procedure message (TS 24.501 / 38.413) in the NGAP PDUs; NAS did not decode, "
                                "see warnings")
    assert result["warnings"][-1] == FILTERED and len(result["warnings"]) == 2  # the analysis's NAS warning first


def test_by_default_the_view_is_unfiltered_and_given_no_core_rows() -> None:
    result = ngap.procedures(ngap.build_model(registration()))
    assert result["warnings"] == [NO_CORE] and result["n4_sbi"] == {"n4_sbi_messages": 0, "unattached": 0}
