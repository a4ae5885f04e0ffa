"""Captures built from real corpus frames for the N2 verdicts the corpus never shows (issue 42): an accept lost
with its InitialContextSetup, a REGISTRATION COMPLETE that never came, a UE context release answered by an
ERROR INDICATION, a failed user-plane re-activation, and the PDU session resource modify / release procedures.

The recipes are tests/support/built_captures.py's (same Recipe, same builder): hand-encoded NGAP PDUs (APER,
TS 38.413, each spelled out below) replace a frame's payload or are grafted onto a real association with
pcapedit.transplant, sent as a real frame of the same direction was, with the next TSN of that direction.
"""

from __future__ import annotations

from pathlib import Path

from tests.support import built_captures
from tests.support.built_captures import AUTH, INITUE, SANDBOX, Recipe

CHAIN_OAI = "pcaps-extra/ngtester_chain_oai_initue_then_release_amf_ngap_nas_sbi.pcap"


def ids(amf: int, ran: int, criticality: str) -> str:
    """AMF-UE-NGAP-ID (IE 10) and RAN-UE-NGAP-ID (IE 85), each one octet long here, with their criticality
    (00 reject, 40 ignore)."""
    return f"000a{criticality}0200{amf:02x}" f"0055{criticality}0200{ran:02x}"


def initial_context_setup_failure(amf: int, ran: int) -> bytes:
    """INITIAL CONTEXT SETUP FAILURE (unsuccessfulOutcome 40, procedure 14 = 0e, criticality reject, 21 octets):
    the two ids and Cause (IE 15 = 000f, ignore): choice radioNetwork 000, enum extension 0, value 21 010101
    (radio-connection-with-ue-lost) -> 0540."""
    return bytes.fromhex("400e0015" "000003" + ids(amf, ran, "40") + "000f40020540")


def error_indication(amf: int, ran: int) -> bytes:
    """ERROR INDICATION (initiatingMessage 00, procedure 9, criticality ignore, 21 octets): the two ids and
    Cause radioNetwork 14 001110 (unknown-local-UE-NGAP-ID) -> 0380."""
    return bytes.fromhex("00094015" "000003" + ids(amf, ran, "40") + "000f40020380")


# PDU SESSION RESOURCE MODIFY REQUEST (procedure 26 = 1a, reject) for UE 1/1: the ids and
# PDUSessionResourceModifyListModReq (IE 64 = 0040, reject, 7 octets): one item (count - 1 = 00), its preamble
# (extension, NAS-PDU, iE-Extensions absent: 00), PDU session id 01, the transfer (3 octets: a
# PDUSessionResourceModifyRequestTransfer with an empty protocolIEs container 00 0000). Its RESPONSE: the ids alone.
MODIFY_REQUEST = bytes.fromhex("001a001a" "000003" + ids(1, 1, "00") + "0040000700000103000000")
MODIFY_RESPONSE = bytes.fromhex("201a000f" "000002" + ids(1, 1, "40"))
# PDU SESSION RESOURCE RELEASE COMMAND (procedure 28 = 1c, reject) for UE 1/1: the ids and
# PDUSessionResourceToReleaseListRelCmd (IE 79 = 004f, reject, 5 octets): one item, preamble 00, session 01, the
# transfer (1 octet: extension 0, iE-Extensions 0, Cause choice nas 010, enum 0 00 normal-release -> 10). Its
# RESPONSE: the ids and PDUSessionResourceReleasedListRelRes (IE 70 = 0046, ignore): session 01, an empty transfer.
RELEASE_COMMAND = bytes.fromhex("001c0018" "000003" + ids(1, 1, "00") + "004f00050000010110")
RELEASE_RESPONSE = bytes.fromhex("201c0018" "000003" + ids(1, 1, "40") + "004640050000010100")

RECIPES: dict[str, Recipe] = {
    # Issue 42 item 1. The sandbox run up to frame 26: UE 2's REGISTRATION ACCEPT (with a new 5G-GUTI) rides in
    # frame 24's InitialContextSetupRequest. Its response (frame 27) is replaced by an INITIAL CONTEXT SETUP FAILURE
    # (radio connection with UE lost, sent as frame 25 was: uplink, TSN 12), then the auth-failure run's
    # UEContextReleaseCommand / Complete (frames 13, 15) for ids 2/2 (downlink TSN 10, uplink TSN 13).
    "registration-accept-undelivered": Recipe(SANDBOX, ("27-9999",), (
        (25, SANDBOX, 27, 12, initial_context_setup_failure(2, 2)),
        (26, AUTH, 13, 10, {12: (0x01, 0x02), 14: (0x01, 0x02)}),
        (25, AUTH, 15, 13, {12: (0x01, 0x02), 18: (0x01, 0x02)}))),
    # UE 1's REGISTRATION ACCEPT (frame 16, inside an InitialContextSetupRequest) gives no new 5G-GUTI: its 5GS mobile
    # identity (IE 77, 11 octets) says type 000 "No identity" instead of 010 (f2 -> f0). The response (frame 19)
    # delivers it; the REGISTRATION COMPLETE beside it is then not due (an answer to no open request).
    "registration-accept": Recipe(SANDBOX, flips=((16, "77000bf2", "77000bf0"),)),
    # UE 1's accept rides in frame 22, made an InitialContextSetupRequest (procedure 29 -> 14, list 74 -> 71, as in
    # built_captures' pdu-initial-context-setup), and the response (frame 25) is an INITIAL CONTEXT SETUP FAILURE.
    "pdu-accept-undelivered": Recipe(SANDBOX, flips=((22, "0000003c001d", "0000003c000e"),
                                                     (22, "004a0080", "00470080")),
                                     payloads=((25, initial_context_setup_failure(1, 1)),)),
    # UE 1's REGISTRATION COMPLETE (frame 19: 7e 00 43) becomes a CONFIGURATION UPDATE COMPLETE (7e 00 55): the
    # accept gave a new 5G-GUTI and no REGISTRATION COMPLETE acknowledges it.
    "registration-complete-missing": Recipe(SANDBOX, flips=((19, "7e0043", "7e0055"),)),
    # The open5gs tester's Service Request path: frame 43's InitialContextSetupRequest carries the SERVICE ACCEPT
    # and PDU session 1's resources (a re-activation); its response (frame 44) becomes an INITIAL CONTEXT SETUP
    # FAILURE for ids 13/9, and what followed it (from frame 45) is dropped.
    "service-accept-undelivered": Recipe(INITUE, ("45-9999",), payloads=((44, initial_context_setup_failure(13, 9)),)),
    # Issue 42 item 4. The OAI tester's UEContextReleaseRequest (frame 31, ids 6/99) is answered by the AMF's
    # ERROR INDICATION for the same ids (sent as frame 10 was: downlink, TSN 2) instead of the command.
    "ue-context-release-error-indication": Recipe(CHAIN_OAI, ("32-9999",), (
        (10, CHAIN_OAI, 32, 2, error_indication(6, 99)),)),
    # The sandbox run, then UE 1's PDU session 1 modified and released on N2 (sent as frames 41 / 43 were:
    # downlink TSN 16, uplink TSN 22).
    "pdu-resource-modify": Recipe(SANDBOX, grafts=(
        (41, SANDBOX, 41, 16, MODIFY_REQUEST), (43, SANDBOX, 43, 22, MODIFY_RESPONSE))),
    "pdu-resource-release": Recipe(SANDBOX, grafts=(
        (41, SANDBOX, 41, 16, RELEASE_COMMAND), (43, SANDBOX, 43, 22, RELEASE_RESPONSE))),
}
# The row of rules.TABLE each recipe was built to show (the test finds it with procedures_oracle, never with
# rules.TABLE), and the rows the same capture shows beside it.
SHOWS: dict[str, tuple[str, ...]] = {
    "registration-accept-undelivered": ("registration-accept-undelivered", "initial-context-setup-failure"),
    "registration-complete-missing": ("registration-complete-missing",),
    "registration-accept": ("registration-accept",),
    "pdu-accept-undelivered": ("pdu-accept-undelivered",),
    "service-accept-undelivered": ("service-accept-undelivered", "reactivation-failed"),
    "ue-context-release-error-indication": ("ue-context-release-error-indication",),
    "pdu-resource-modify": ("pdu-resource-modify-response",),
    "pdu-resource-release": ("pdu-resource-release-response",),
}


def built(name: str) -> Path:
    """The capture of recipe `name` (its path even when the corpus is missing: callers check exists())."""
    return built_captures.built(name, RECIPES)
