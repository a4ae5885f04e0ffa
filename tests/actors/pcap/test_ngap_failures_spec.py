"""What one NGAP PDU reports as failures (actors/pcap/ngap/failures.py), on PDUs built here, against docs/5g.md.

docs/5g.md: a failure is a reject or failure NAS message, a 5GMM/5GSM STATUS, a DL NAS transport returning an
unforwarded 5GSM message (TS 24.501 5.4.5.2.5), an NGAP unsuccessfulOutcome, ErrorIndication or NAS
non-delivery, a PDU session in a FailedTo... list, a release with an abnormal cause. Normal ends are not:
NGAP `nas: normal-release`/`deregister`, `radioNetwork: user-inactivity`, `successful-handover`,
`release-due-to-…-generated-reason`, handover/redirection triggers, `misc: om-intervention`, 5GSM causes 36
(regular deactivation) and 39 (reactivation requested). Each failure has `frame`, `kind`, `code`, `cause`
and `why`. The PDUs are built from Wireshark's own names and numbers (tshark -G values / -G decodes): every
NAS message type, every NGAP procedure with every outcome it has, every cause of every NGAP cause group.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from diagd.actors.pcap.ngap.failures import pdu_failures
from diagd.actors.pcap.ngap.pdus import NasMessage, NgapPdu, SessionItem
from tests.support import wireshark_names

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")

MM, SM = "nas_5gs.mm.message_type", "nas_5gs.sm.message_type"
GROUPS = ("radioNetwork", "transport", "nas", "protocol", "misc")  # TS 38.413 9.3.1.2 Cause CHOICE
# docs/5g.md's normal NGAP causes, by Wireshark's names; every other cause of a release is abnormal.
NORMAL_NGAP = {
    "radioNetwork": {"successful-handover", "release-due-to-ngran-generated-reason",
                     "release-due-to-5gc-generated-reason", "user-inactivity", "ng-intra-system-handover-triggered",
                     "ng-inter-system-handover-triggered", "xn-handover-triggered", "ue-context-transfer",
                     "ims-voice-eps-fallback-or-rat-fallback-triggered", "redirection",
                     "release-due-to-cn-detected-mobility"},
    "nas": {"normal-release", "deregister"},
    "misc": {"om-intervention"},
}
# TS 24.501 messages that are failures in themselves (rejects, the UE's failures, the STATUS messages).
FAILURE_MESSAGES = {"Registration reject", "Service reject", "Authentication reject", "Authentication failure",
                    "Security mode reject", "5GMM status", "PDU session establishment reject",
                    "PDU session modification reject", "PDU session modification command reject",
                    "PDU session release reject", "5GSM status"}
RELEASES = {"PDU session release request", "PDU session release command"}  # abnormal only by their 5GSM cause
NORMAL_5GSM = {"Regular deactivation", "Reactivation requested"}
RETURNED = "the AMF returned an unforwarded 5GSM message (DL NAS transport with a 5GMM cause)"
FRAME = 7


def proc_code(name: str) -> int:
    return wireshark_names.code("ngap.procedureCode", name)


def pdu(procedure: str = "id-DownlinkNASTransport", pdu_type: str = "initiatingMessage",
        causes: list[dict[str, Any]] | None = None, items: list[SessionItem] | None = None,
        nas: list[NasMessage] | None = None) -> NgapPdu:
    """A PDU as pdus.py reads one: the procedure under Wireshark's name without `id-`."""
    return NgapPdu(frame=FRAME, time=1.0, procedure_code=proc_code(procedure), procedure=procedure.removeprefix("id-"),
                   pdu_type=pdu_type, causes=causes or [], items=items or [], nas=nas or [])


def ngap_cause(group: str, name: str, procedure: str, psi: int | None = None) -> dict[str, Any]:
    """An NGAP cause as pdus.py reads it (an item's cause names its PDU session)."""
    code = wireshark_names.code(f"ngap.{group}", name)
    return {"frame": FRAME, "kind": "NGAP", "group": group, "code": code, "cause": name,
            "procedure": procedure.removeprefix("id-"), **({"pdu_session_id": psi} if psi is not None else {})}


def no_cause(procedure: str, **extra: Any) -> dict[str, Any]:
    return {"frame": FRAME, "kind": "NGAP", "group": None, "code": None, "cause": None,
            "procedure": procedure.removeprefix("id-"), **extra}


def nas(field: str, name: str, cause: int | None = None) -> NasMessage:
    layer = {MM: "5GMM", SM: "5GSM"}[field]
    text = None if cause is None else wireshark_names.names(
        "nas_5gs.mm.5gmm_cause" if field == MM else "nas_5gs.sm.5gsm_cause").get(cause, "Unknown")
    return NasMessage(frame=FRAME, layer=layer, code=f"0x{wireshark_names.code(field, name):02x}", message=name,
                      cause=cause, cause_text=text)


def nas_failure(message: NasMessage, why: str) -> dict[str, Any]:
    return {"frame": FRAME, "kind": message.layer, "code": message.cause, "cause": message.cause_text,
            "message": message.message, "why": why}


def every_ngap_message() -> list[tuple[str, str]]:
    """(procedure, NGAP-PDU choice) of every NGAP message there is: each procedure's initiating message and the
    outcomes Wireshark registers it with (class 1: a successful, some an unsuccessful outcome)."""
    tables = wireshark_names.decodes("ngap")
    out = []
    for code, name in sorted(wireshark_names.names("ngap.procedureCode").items()):
        out.append((name, "initiatingMessage"))
        out += [(name, kind) for kind, table in (("successfulOutcome", "ngap.proc.sout"),
                                                 ("unsuccessfulOutcome", "ngap.proc.uout")) if code in tables[table]]
    return out


def every_ngap_cause() -> list[tuple[str, str]]:
    if shutil.which("tshark") is None:  # collected all the same: the module's skip says why
        return []
    return [(group, name) for group in GROUPS for name in wireshark_names.names(f"ngap.{group}").values()]


@pytest.mark.parametrize("field", [MM, SM])
@pytest.mark.parametrize("cause", [None, 26, 36])
def test_each_nas_message_is_a_failure_as_ts_24_501_says(field: str, cause: int | None) -> None:
    """Every 5GMM / 5GSM message Wireshark names, alone in a PDU, without a cause and with #26 "Insufficient
    resources" (5GSM) / #26 "Non-5G authentication unacceptable" (5GMM) or #36 (5GSM "Regular deactivation")."""
    for name in wireshark_names.names(field).values():
        if name == "Not used in current version":
            continue
        message = nas(field, name, cause)
        if name in FAILURE_MESSAGES:
            want = [nas_failure(message, name)]
        elif name == "DL NAS transport" and cause is not None:
            want = [nas_failure(message, RETURNED)]
        elif name in RELEASES and cause is not None and message.cause_text not in NORMAL_5GSM:
            want = [nas_failure(message, f"abnormal cause in {name}")]
        else:
            want = []
        assert pdu_failures(pdu(nas=[message])) == want, (name, cause)


def test_a_release_s_5gsm_cause_is_abnormal_unless_it_is_36_or_39() -> None:
    for cause, text in wireshark_names.names("nas_5gs.sm.5gsm_cause").items():
        for name in sorted(RELEASES):
            message = nas(SM, name, cause)
            want = [] if text in NORMAL_5GSM else [nas_failure(message, f"abnormal cause in {name}")]
            assert pdu_failures(pdu(nas=[message])) == want, (name, cause, text)


def test_several_nas_messages_each_report_their_own() -> None:
    """A DL NAS transport returning a PDU SESSION ESTABLISHMENT REQUEST with #90 (payload was not forwarded): the
    transport is the failure, the returned request is not; then a 5GSM STATUS in the same PDU."""
    transport = nas(MM, "DL NAS transport", 90)
    returned = nas(SM, "PDU session establishment request")
    status = nas(SM, "5GSM status", 98)
    assert pdu_failures(pdu(nas=[transport, returned, status])) == [
        nas_failure(transport, RETURNED), nas_failure(status, "5GSM status")]
    assert pdu_failures(pdu(nas=[nas(MM, "UL NAS transport"), nas(SM, "PDU session establishment request")])) == []


@pytest.mark.parametrize(("group", "name"), every_ngap_cause())
def test_every_ngap_message_with_one_cause(group: str, name: str) -> None:
    """Each NGAP message with one top-level cause: an unsuccessful outcome fails with it, ErrorIndication and
    NASNonDeliveryIndication report it, the release procedures' initiating messages only when it is abnormal,
    and no other message is a failure by its cause."""
    abnormal = name not in NORMAL_NGAP.get(group, set())
    for procedure, kind in every_ngap_message():
        cause = ngap_cause(group, name, procedure)
        bare = procedure.removeprefix("id-")
        if kind == "unsuccessfulOutcome":
            want = [{**cause, "why": f"{bare} failed (unsuccessfulOutcome)"}]
        elif procedure in ("id-ErrorIndication", "id-NASNonDeliveryIndication"):
            want = [{**cause, "why": bare}]
        elif kind == "initiatingMessage" and procedure in ("id-UEContextRelease", "id-UEContextReleaseRequest",
                                                           "id-PDUSessionResourceRelease") and abnormal:
            want = [{**cause, "why": f"abnormal release cause in {bare}"}]
        else:
            want = []
        assert pdu_failures(pdu(procedure, kind, [cause])) == want, (procedure, kind)


def test_an_unsuccessful_outcome_or_an_error_indication_without_a_cause_still_fails() -> None:
    for procedure, kind in every_ngap_message():
        bare = procedure.removeprefix("id-")
        if kind == "unsuccessfulOutcome":
            want = [{**no_cause(procedure), "why": f"{bare} failed (unsuccessfulOutcome)"}]
        elif procedure in ("id-ErrorIndication", "id-NASNonDeliveryIndication"):
            want = [{**no_cause(procedure), "why": bare}]
        else:
            want = []
        assert pdu_failures(pdu(procedure, kind)) == want, (procedure, kind)


def test_only_the_first_top_level_ngap_cause_names_the_failure() -> None:
    """An item's cause (it names its PDU session) and a NAS cause are not the PDU's own cause."""
    for procedure, kind, why in (("id-HandoverPreparation", "unsuccessfulOutcome",
                                  "HandoverPreparation failed (unsuccessfulOutcome)"),
                                 ("id-ErrorIndication", "initiatingMessage", "ErrorIndication")):
        item = ngap_cause("radioNetwork", "unknown-PDU-session-ID", procedure, psi=5)
        first = ngap_cause("protocol", "semantic-error", procedure)
        second = ngap_cause("misc", "hardware-failure", procedure)
        mm_cause = {"frame": FRAME, "kind": "5GMM", "code": 9, "cause": "UE identity cannot be derived by the network",
                    "message": "Registration reject"}
        assert pdu_failures(pdu(procedure, kind, [mm_cause, item, first, second])) == [{**first, "why": why}]
        # With only an item's cause or a NAS cause, the PDU has no cause of its own.
        assert pdu_failures(pdu(procedure, kind, [mm_cause, item])) == [{**no_cause(procedure), "why": why}]


def test_a_release_lists_each_abnormal_cause_its_items_included() -> None:
    procedure = "id-PDUSessionResourceRelease"
    causes = [ngap_cause("nas", "normal-release", procedure), ngap_cause("transport", "unspecified", procedure),
              ngap_cause("radioNetwork", "user-inactivity", procedure, psi=1),
              ngap_cause("radioNetwork", "radio-connection-with-ue-lost", procedure, psi=2),
              ngap_cause("nas", "authentication-failure", procedure),
              {"frame": FRAME, "kind": "5GSM", "code": 26, "cause": "Insufficient resources", "message": "x"}]
    why = "abnormal release cause in PDUSessionResourceRelease"
    assert pdu_failures(pdu(procedure, "initiatingMessage", causes)) == [
        {**causes[1], "why": why}, {**causes[3], "why": why}, {**causes[4], "why": why}]
    # Its response (class 1: successfulOutcome) is no failure whatever its causes.
    assert pdu_failures(pdu(procedure, "successfulOutcome", causes)) == []


@pytest.mark.parametrize(("role", "failed"), [("setup-failed", True), ("modify-failed", True), ("resume-failed", True),
                                              ("setup-ok", False), ("setup-request", False),
                                              ("release-command", False)])
def test_each_session_in_a_failed_list_is_a_failure(role: str, failed: bool) -> None:
    """PDUSessionResourceSetupResponse's items: the FailedTo... lists' sessions failed, with their own cause."""
    procedure = "id-PDUSessionResourceSetup"
    with_cause = ngap_cause("radioNetwork", "radio-resources-not-available", procedure, psi=5)
    items = [SessionItem(role=role, psi=5, cause=with_cause), SessionItem(role=role, psi=6)]
    label = role.replace("-", " ")
    want = [{**with_cause, "why": f"PDU session 5: {label} in PDUSessionResourceSetup"},
            {**no_cause(procedure, pdu_session_id=6), "why": f"PDU session 6: {label} in PDUSessionResourceSetup"}]
    assert pdu_failures(pdu(procedure, "successfulOutcome", [with_cause], items)) == (want if failed else [])


def test_an_initial_context_setup_failure_reports_the_pdu_then_its_sessions_then_its_nas() -> None:
    """InitialContextSetupFailure (TS 38.413 8.3.1.3) with its own cause, a session that failed to set up, and
    a REGISTRATION REJECT riding in the same PDU: three failures, in that order."""
    procedure = "id-InitialContextSetup"
    own = ngap_cause("misc", "unspecified", procedure)
    item_cause = ngap_cause("radioNetwork", "slice-not-supported", procedure, psi=3)
    reject = nas(MM, "Registration reject", 7)
    got = pdu_failures(pdu(procedure, "unsuccessfulOutcome", [own, item_cause],
                           [SessionItem(role="setup-failed", psi=3, cause=item_cause)], [reject]))
    assert got == [{**own, "why": "InitialContextSetup failed (unsuccessfulOutcome)"},
                   {**item_cause, "why": "PDU session 3: setup failed in InitialContextSetup"},
                   nas_failure(reject, "Registration reject")]
