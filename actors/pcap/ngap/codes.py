"""NGAP and 5G NAS numbers the summaries go by: IE ids, procedure codes, causes and message types
(TS 38.413, TS 24.501), as Wireshark decodes them."""

from __future__ import annotations

PDU_TYPES = {"0": "initiatingMessage", "1": "successfulOutcome", "2": "unsuccessfulOutcome"}
NGAP_CAUSE_GROUPS = ("ngap.radioNetwork", "ngap.transport", "ngap.nas", "ngap.protocol", "ngap.misc")
NGAP_SCTP_PORT = 38412  # the AMF listens on it (TS 38.412)
UNKNOWN_ASSOC_INDEX = 65535  # what sctp.assoc_index says when Wireshark could not number the association

# NGAP ProtocolIE ids (TS 38.413 / Wireshark's ngap.id) whose contents decide which UE a PDU is about.
IE_AMF_UE_NGAP_ID = 10
IE_RAN_UE_NGAP_ID = 85
IE_UE_NGAP_IDS = 114  # UEContextReleaseCommand: the pair, or the AMF id alone
IE_SOURCE_AMF_UE_NGAP_ID = 100  # PathSwitchRequest: the *source* context's AMF id, not this one's
IE_NEW_AMF_UE_NGAP_ID = 40  # UEContextModificationRequest: the AMF id this context uses from now on
IE_RESET_TYPE = 88  # NGReset: the whole interface, or a list of contexts
IE_CONNECTION_LIST = 111  # NGResetAcknowledge: the contexts reset
IE_FIVEG_S_TMSI = 26  # InitialUEMessage: the 5G-S-TMSI the UE presented
IE_UE_PAGING_IDENTITY = 115  # Paging: the paged UE's 5G-S-TMSI
IE_NAS_PDU = 38
IE_SOURCE_TO_TARGET_CONTAINER = 101
IE_RAN_NODE_NAME = 82
IE_GLOBAL_RAN_NODE_ID = 27
OTHER_CONTEXT_IES = {IE_SOURCE_AMF_UE_NGAP_ID, IE_NEW_AMF_UE_NGAP_ID, IE_RESET_TYPE, IE_CONNECTION_LIST}

# PDU session resource lists: the role of their items.
SESSION_LIST_ROLES = {
    74: "setup-request", 71: "setup-request",  # PDUSessionResourceSetupListSUReq / ...CxtReq
    75: "setup-ok", 72: "setup-ok",  # ...SetupListSURes / ...CxtRes
    58: "setup-failed", 55: "setup-failed", 132: "setup-failed",  # FailedToSetupListSURes / CxtRes / CxtFail
    54: "modify-failed", 131: "modify-failed",  # FailedToModifyListModRes / ModCfm
    229: "resume-failed", 230: "resume-failed",
    79: "release-command",  # PDUSessionResourceToReleaseListRelCmd
}

# Class 1 procedures (TS 38.413 table 8.1-1): the initiating message is answered by a successful or
# unsuccessful outcome. An answer that never comes is a failure.
CLASS1_PROCEDURES = {0, 10, 12, 13, 14, 20, 21, 25, 26, 27, 28, 29, 32, 35, 40, 41, 43, 51, 58, 59, 60,
                     66, 67, 68, 69, 70, 71, 72, 73}
PROC_ERROR_INDICATION = 9
PROC_NAS_NON_DELIVERY = 19
PROC_DOWNLINK_NAS_TRANSPORT = 4
PROC_PAGING = 24
PROC_NG_RESET = 20
PROC_NG_SETUP = 21
PROC_HANDOVER_PREPARATION = 12
PROC_HANDOVER_RESOURCE_ALLOCATION = 13
PROC_INITIAL_CONTEXT_SETUP = 14
PROC_INITIAL_UE_MESSAGE = 15
PROC_PATH_SWITCH = 25
PROC_PDU_SESSION_RELEASE = 28
PROC_PDU_SESSION_SETUP = 29
PROC_UE_CONTEXT_RELEASE = 41
PROC_UE_CONTEXT_RELEASE_REQUEST = 42
RELEASE_PROCEDURES = {PROC_UE_CONTEXT_RELEASE, PROC_UE_CONTEXT_RELEASE_REQUEST, PROC_PDU_SESSION_RELEASE}
GNB_SENDS = {PROC_INITIAL_UE_MESSAGE, PROC_NG_SETUP, 46, PROC_UE_CONTEXT_RELEASE_REQUEST}  # 46 UplinkNASTransport

# NGAP causes that end things normally (names as Wireshark prints them). Anything else in a
# release is abnormal; "unspecified" is not normal: it hides the reason.
NORMAL_NGAP_CAUSES = {
    "radioNetwork": {"successful-handover", "release-due-to-ngran-generated-reason",
                     "release-due-to-5gc-generated-reason", "user-inactivity", "ng-intra-system-handover-triggered",
                     "ng-inter-system-handover-triggered", "xn-handover-triggered", "ue-context-transfer",
                     "ims-voice-eps-fallback-or-rat-fallback-triggered", "redirection",
                     "release-due-to-cn-detected-mobility"},
    "nas": {"normal-release", "deregister"},
    "misc": {"om-intervention"},  # an operator's deliberate action, not a fault
}

# NAS messages that are failures in themselves (TS 24.501 message types).
NAS_FAILURE_MESSAGES = {
    "0x44",  # Registration reject
    "0x4d",  # Service reject
    "0x58",  # Authentication reject
    "0x59",  # Authentication failure
    "0x5f",  # Security mode reject
    "0x64",  # 5GMM status
    "0xc3",  # PDU session establishment reject
    "0xca",  # PDU session modification reject
    "0xcd",  # PDU session modification command reject
    "0xd2",  # PDU session release reject
    "0xd6",  # 5GSM status
}
NAS_RELEASES = {"0xd1", "0xd3"}  # PDU session release request / command: abnormal only by cause
NORMAL_5GSM_RELEASE_CAUSES = {36, 39}  # regular deactivation, reactivation requested
NAS_REGISTRATION_REQUEST, NAS_REGISTRATION_ACCEPT, NAS_REGISTRATION_REJECT = "0x41", "0x42", "0x44"
NAS_ESTABLISHMENT_REQUEST, NAS_ESTABLISHMENT_ACCEPT, NAS_ESTABLISHMENT_REJECT = "0xc1", "0xc2", "0xc3"
NAS_TMSI_ASSIGNERS = {"0x42", "0x54"}  # Registration accept, Configuration update command
NAS_DEREGISTRATIONS = {"0x45", "0x46", "0x47", "0x48"}
NAS_DL_TRANSPORT = "0x68"  # with a 5GMM cause it carries back a 5GSM message the AMF could not forward

MESSAGE_TYPES = {"nas_5gs.mm.message_type": "5GMM", "nas_5gs.sm.message_type": "5GSM"}
NAS_KEEP = {"nas_5gs.pdu_session_id", "nas_5gs.mm.switch_off", "nas_5gs.cmn.dnn",
            "nas_5gs.sm.pdu_addr_inf_ipv4", "nas_5gs.mm.sst", "nas_5gs.mm.mm_sd",
            "nas_5gs.5g_tmsi", "e212.mcc", "e212.mnc", "nas_5gs.mm.type_id", "nas_5gs.amf_set_id",
            "nas_5gs.amf_pointer"}
INTEGER_FIELDS = {"ngap.AMF_UE_NGAP_ID", "ngap.RAN_UE_NGAP_ID", "ngap.pDUSessionID", "ngap.qosFlowIdentifier",
                   "nas_5gs.pdu_session_id", "nas_5gs.5g_tmsi", "nas_5gs.amf_set_id", "nas_5gs.amf_pointer"}
ITEM_KEEP = {"ngap.TransportLayerAddressIPv4", "ngap.gTP_TEID", "ngap.qosFlowIdentifier", "ngap.sST", "ngap.sD"}
