"""The NGAP / 5G NAS numbers of actors/pcap/ngap/codes.py against Wireshark's own names for them.

Each expectation is written here as the name TS 38.413 / TS 24.501 (and Wireshark, which decodes by them)
give the thing: an NGAP procedure (`id-UEContextRelease`), a ProtocolIE (`id-AMF-UE-NGAP-ID`), a NAS message
("Registration reject"), a cause ("Regular deactivation", `user-inactivity`). The number is then looked up in
Wireshark's value strings (`tshark -G values`), its dissector tables (`tshark -G decodes`) and its field list
(`tshark -G fields`), never read back from diagd.
"""

from __future__ import annotations

import shutil

import pytest

from diagd.actors.pcap.ngap import codes
from tests.support import wireshark_names

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")

PROC, IE, PDU = "ngap.procedureCode", "ngap.id", "ngap.NGAP_PDU"
MM, SM = "nas_5gs.mm.message_type", "nas_5gs.sm.message_type"


def proc(name: str) -> int:
    return wireshark_names.code(PROC, name)


def ie(name: str) -> int:
    return wireshark_names.code(IE, name)


def mm(name: str) -> str:
    return f"0x{wireshark_names.code(MM, name):02x}"


def sm(name: str) -> str:
    return f"0x{wireshark_names.code(SM, name):02x}"


def test_the_ngap_pdu_choice_and_the_cause_groups_are_wireshark_s() -> None:
    # TS 38.413 9.4.2 NGAP-PDU ::= CHOICE {initiatingMessage, successfulOutcome, unsuccessfulOutcome}; the sharkd
    # tree gives the CHOICE index as a string.
    assert {str(v): name for v, name in wireshark_names.names(PDU).items()} == codes.PDU_TYPES
    assert set(codes.PDU_TYPES.values()) == {"initiatingMessage", "successfulOutcome", "unsuccessfulOutcome"}
    # 9.3.1.2 Cause ::= CHOICE {radioNetwork, transport, nas, protocol, misc, ...}: one field per group.
    groups = [g for v, g in sorted(wireshark_names.names("ngap.Cause").items()) if g != "choice-Extensions"]
    assert tuple(f"ngap.{g}" for g in groups) == codes.NGAP_CAUSE_GROUPS
    assert set(codes.NGAP_CAUSE_GROUPS) <= wireshark_names.fields()


def test_the_transport_numbers_are_wireshark_s() -> None:
    # TS 38.412: NGAP over SCTP, destination port 38412 at the AMF; Wireshark registers NGAP on that port.
    assert codes.NGAP_SCTP_PORT == 38412
    assert codes.NGAP_SCTP_PORT in wireshark_names.decodes("ngap")["sctp.port"]
    assert codes.UNKNOWN_ASSOC_INDEX == 0xFFFF  # Wireshark's sctp.assoc_index for "no association found"


def test_the_ie_ids_are_wireshark_s() -> None:
    assert {
        "IE_AMF_UE_NGAP_ID": ie("id-AMF-UE-NGAP-ID"),
        "IE_RAN_UE_NGAP_ID": ie("id-RAN-UE-NGAP-ID"),
        "IE_UE_NGAP_IDS": ie("id-UE-NGAP-IDs"),
        "IE_SOURCE_AMF_UE_NGAP_ID": ie("id-SourceAMF-UE-NGAP-ID"),
        "IE_NEW_AMF_UE_NGAP_ID": ie("id-NewAMF-UE-NGAP-ID"),
        "IE_RESET_TYPE": ie("id-ResetType"),
        "IE_CONNECTION_LIST": ie("id-UE-associatedLogicalNG-connectionList"),
        "IE_FIVEG_S_TMSI": ie("id-FiveG-S-TMSI"),
        "IE_SOURCE_TO_TARGET_CONTAINER": ie("id-SourceToTarget-TransparentContainer"),
        "IE_RAN_NODE_NAME": ie("id-RANNodeName"),
        "IE_GLOBAL_RAN_NODE_ID": ie("id-GlobalRANNodeID"),
        "IE_UE_PAGING_IDENTITY": ie("id-UEPagingIdentity"),
        "IE_NAS_PDU": ie("id-NAS-PDU"),
    } == {name: getattr(codes, name) for name in (
        "IE_AMF_UE_NGAP_ID", "IE_RAN_UE_NGAP_ID", "IE_UE_NGAP_IDS", "IE_SOURCE_AMF_UE_NGAP_ID",
        "IE_NEW_AMF_UE_NGAP_ID", "IE_RESET_TYPE", "IE_CONNECTION_LIST", "IE_FIVEG_S_TMSI",
        "IE_SOURCE_TO_TARGET_CONTAINER", "IE_RAN_NODE_NAME", "IE_GLOBAL_RAN_NODE_ID", "IE_UE_PAGING_IDENTITY",
        "IE_NAS_PDU")}
    # The IEs that name a context other than the PDU's own one.
    assert {ie("id-SourceAMF-UE-NGAP-ID"), ie("id-NewAMF-UE-NGAP-ID"), ie("id-ResetType"),
            ie("id-UE-associatedLogicalNG-connectionList")} == codes.OTHER_CONTEXT_IES


def test_each_pdu_session_list_has_the_role_its_ie_name_says() -> None:
    """TS 38.413 9.3.1: the PDU session resource lists, by the IE names of their messages."""
    want = {
        "id-PDUSessionResourceSetupListSUReq": "setup-request",  # PDU SESSION RESOURCE SETUP REQUEST
        "id-PDUSessionResourceSetupListCxtReq": "setup-request",  # INITIAL CONTEXT SETUP REQUEST
        "id-PDUSessionResourceSetupListSURes": "setup-ok",
        "id-PDUSessionResourceSetupListCxtRes": "setup-ok",
        "id-PDUSessionResourceFailedToSetupListSURes": "setup-failed",
        "id-PDUSessionResourceFailedToSetupListCxtRes": "setup-failed",
        "id-PDUSessionResourceFailedToSetupListCxtFail": "setup-failed",  # INITIAL CONTEXT SETUP FAILURE
        "id-PDUSessionResourceFailedToModifyListModRes": "modify-failed",
        "id-PDUSessionResourceFailedToModifyListModCfm": "modify-failed",
        "id-PDUSessionResourceFailedToResumeListRESReq": "resume-failed",
        "id-PDUSessionResourceFailedToResumeListRESRes": "resume-failed",
        "id-PDUSessionResourceToReleaseListRelCmd": "release-command",
    }
    assert {ie(name): role for name, role in want.items()} == codes.SESSION_LIST_ROLES


def test_the_procedure_codes_are_wireshark_s() -> None:
    assert {
        "PROC_ERROR_INDICATION": proc("id-ErrorIndication"),
        "PROC_NAS_NON_DELIVERY": proc("id-NASNonDeliveryIndication"),
        "PROC_DOWNLINK_NAS_TRANSPORT": proc("id-DownlinkNASTransport"),
        "PROC_PAGING": proc("id-Paging"),
        "PROC_NG_RESET": proc("id-NGReset"),
        "PROC_NG_SETUP": proc("id-NGSetup"),
        "PROC_HANDOVER_PREPARATION": proc("id-HandoverPreparation"),
        "PROC_HANDOVER_RESOURCE_ALLOCATION": proc("id-HandoverResourceAllocation"),
        "PROC_INITIAL_CONTEXT_SETUP": proc("id-InitialContextSetup"),
        "PROC_INITIAL_UE_MESSAGE": proc("id-InitialUEMessage"),
        "PROC_PATH_SWITCH": proc("id-PathSwitchRequest"),
        "PROC_PDU_SESSION_RELEASE": proc("id-PDUSessionResourceRelease"),
        "PROC_PDU_SESSION_SETUP": proc("id-PDUSessionResourceSetup"),
        "PROC_UE_CONTEXT_RELEASE": proc("id-UEContextRelease"),
        "PROC_UE_CONTEXT_RELEASE_REQUEST": proc("id-UEContextReleaseRequest"),
    } == {name: getattr(codes, name) for name in dir(codes) if name.startswith("PROC_")}
    assert {proc("id-UEContextRelease"), proc("id-UEContextReleaseRequest"),
            proc("id-PDUSessionResourceRelease")} == codes.RELEASE_PROCEDURES
    # What the gNB sends (TS 38.413 8: INITIAL UE MESSAGE, NG SETUP REQUEST, UPLINK NAS TRANSPORT,
    # UE CONTEXT RELEASE REQUEST).
    assert {proc("id-InitialUEMessage"), proc("id-NGSetup"), proc("id-UplinkNASTransport"),
            proc("id-UEContextReleaseRequest")} == codes.GNB_SENDS


def test_class_1_procedures_are_those_with_a_response() -> None:
    """TS 38.413 table 8.1-1, typed by name; Wireshark registers a successfulOutcome for exactly these."""
    class1 = {"id-AMFConfigurationUpdate", "id-HandoverCancel", "id-HandoverPreparation",
              "id-HandoverResourceAllocation", "id-InitialContextSetup", "id-NGReset", "id-NGSetup",
              "id-PathSwitchRequest", "id-PDUSessionResourceModify", "id-PDUSessionResourceModifyIndication",
              "id-PDUSessionResourceRelease", "id-PDUSessionResourceSetup", "id-PWSCancel", "id-RANConfigurationUpdate",
              "id-UEContextModification", "id-UEContextRelease", "id-UERadioCapabilityCheck", "id-WriteReplaceWarning",
              "id-UEContextResume", "id-UEContextSuspend", "id-UERadioCapabilityIDMapping",
              "id-BroadcastSessionModification", "id-BroadcastSessionRelease", "id-BroadcastSessionSetup",
              "id-DistributionSetup", "id-DistributionRelease", "id-MulticastSessionActivation",
              "id-MulticastSessionDeactivation", "id-MulticastSessionUpdate"}
    assert {proc(name) for name in class1} == codes.CLASS1_PROCEDURES
    # Wireshark's successfulOutcome table, up to the last Rel-17 procedure code diagd knows (75; a later Wireshark
    # may know later procedures).
    assert {c for c in wireshark_names.decodes("ngap")["ngap.proc.sout"] if c <= 75} == codes.CLASS1_PROCEDURES
    # Class 2 (no response): what carries NAS, indications, paging.
    for name in ("id-InitialUEMessage", "id-UplinkNASTransport", "id-DownlinkNASTransport", "id-ErrorIndication",
                 "id-NASNonDeliveryIndication", "id-UEContextReleaseRequest", "id-Paging", "id-HandoverNotification"):
        assert proc(name) not in codes.CLASS1_PROCEDURES, name


def test_normal_ngap_causes_are_the_documented_ones_by_wireshark_s_names() -> None:
    """docs/5g.md: NGAP `nas: normal-release`/`deregister`, `radioNetwork: user-inactivity`, `successful-handover`,
    `release-due-to-…-generated-reason`, handover/redirection triggers, `misc: om-intervention` end things
    normally; `unspecified` and everything else do not. Each name must be one Wireshark decodes in that group."""
    want = {
        "radioNetwork": {"successful-handover", "release-due-to-ngran-generated-reason",
                         "release-due-to-5gc-generated-reason", "user-inactivity",
                         "ng-intra-system-handover-triggered", "ng-inter-system-handover-triggered",
                         "xn-handover-triggered", "ue-context-transfer",
                         "ims-voice-eps-fallback-or-rat-fallback-triggered", "redirection",
                         "release-due-to-cn-detected-mobility"},
        "nas": {"normal-release", "deregister"},
        "misc": {"om-intervention"},
    }
    assert want == codes.NORMAL_NGAP_CAUSES
    for group, normal in want.items():
        assert normal <= set(wireshark_names.names(f"ngap.{group}").values()), group
        assert "unspecified" not in normal


def test_nas_message_sets_are_the_spec_s_messages() -> None:
    """TS 24.501 table 9.7.1 / 9.7.2 message types, by Wireshark's names."""
    assert {
        mm("Registration reject"), mm("Service reject"), mm("Authentication reject"), mm("Authentication failure"),
        mm("Security mode reject"), mm("5GMM status"), sm("PDU session establishment reject"),
        sm("PDU session modification reject"), sm("PDU session modification command reject"),
        sm("PDU session release reject"), sm("5GSM status")} == codes.NAS_FAILURE_MESSAGES
    assert {sm("PDU session release request"), sm("PDU session release command")} == codes.NAS_RELEASES
    causes = wireshark_names.names("nas_5gs.sm.5gsm_cause")
    assert {causes[c] for c in codes.NORMAL_5GSM_RELEASE_CAUSES} == {"Regular deactivation", "Reactivation requested"}
    assert [mm("Registration request"), mm("Registration accept"), mm("Registration reject")] == [
        codes.NAS_REGISTRATION_REQUEST, codes.NAS_REGISTRATION_ACCEPT, codes.NAS_REGISTRATION_REJECT]
    assert [sm("PDU session establishment request"), sm("PDU session establishment accept"),
            sm("PDU session establishment reject")] == [
        codes.NAS_ESTABLISHMENT_REQUEST, codes.NAS_ESTABLISHMENT_ACCEPT, codes.NAS_ESTABLISHMENT_REJECT]
    # 5G-GUTI assignment: REGISTRATION ACCEPT (5.5.1.2.4) and CONFIGURATION UPDATE COMMAND (5.4.4).
    assert {mm("Registration accept"), mm("Configuration update command")} == codes.NAS_TMSI_ASSIGNERS
    assert {mm(f"Deregistration {kind} ({side})") for kind in ("request", "accept")
            for side in ("UE originating", "UE terminated")} == codes.NAS_DEREGISTRATIONS
    assert mm("DL NAS transport") == codes.NAS_DL_TRANSPORT


def test_every_field_named_is_one_wireshark_has() -> None:
    fields = wireshark_names.fields()
    named = {*codes.MESSAGE_TYPES, *codes.NAS_KEEP, *codes.INTEGER_FIELDS, *codes.ITEM_KEEP}
    assert named - fields == set()
    assert codes.MESSAGE_TYPES == {MM: "5GMM", SM: "5GSM"}
