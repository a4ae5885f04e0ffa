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
from tests.support.built_captures import AUTH, INITUE, SANDBOX, Recipe, registration_as

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



def length(n: int) -> bytes:
    """An APER length determinant: one octet below 128, else two (10 then 14 bits)."""
    return bytes([n]) if n < 128 else bytes([0x80 | n >> 8, n & 0xFF])


def nas_pdu_ie(nas: bytes, criticality: str) -> bytes:
    """The NAS-PDU IE (38 = 0026): its open type holds the OCTET STRING, a length determinant then the octets."""
    value = length(len(nas)) + nas
    return bytes.fromhex("0026" + criticality) + length(len(value)) + value


def downlink_nas_transport(amf: int, ran: int, nas: bytes) -> bytes:
    """DOWNLINK NAS TRANSPORT (initiatingMessage 00, procedure 4, criticality ignore 40; TS 38.413 9.2.5.2): the
    two ids and the NAS-PDU (reject)."""
    value = bytes.fromhex("000003" + ids(amf, ran, "00")) + nas_pdu_ie(nas, "00")
    return bytes.fromhex("000440") + length(len(value)) + value


def nas_non_delivery_indication(amf: int, ran: int, nas: bytes) -> bytes:
    """NAS NON DELIVERY INDICATION (procedure 19 = 13, ignore; TS 38.413 9.2.5.5): the two ids, the NAS-PDU it
    could not deliver (ignore) and Cause radioNetwork radio-connection-with-ue-lost (0540, ignore)."""
    value = bytes.fromhex("000004" + ids(amf, ran, "00")) + nas_pdu_ie(nas, "40") + bytes.fromhex("000f40020540")
    return bytes.fromhex("001340") + length(len(value)) + value


# The NAS-PDUs of real frames, as the AMF sent them: UE 3's REGISTRATION ACCEPT (sandbox frame 36, inside an
# InitialContextSetupRequest, a new 5G-GUTI), the tester's SERVICE ACCEPT (INITUE frame 43, same), and UE 3's DL NAS
# TRANSPORT with its PDU SESSION ESTABLISHMENT ACCEPT (sandbox frame 41, the item's NAS-PDU of a
# PDUSessionResourceSetupRequest); each integrity protected, NEA0.
REGISTRATION_ACCEPT_3 = bytes.fromhex(
    "7e028afbed71017e0042010177000bf299f907020040c000062654074099f90700000115020101210201005e0192")
SERVICE_ACCEPT = bytes.fromhex("7e02bc5554dc047e004e5002020026020000")
ESTABLISHMENT_ACCEPT_3 = bytes.fromhex(
    "7e02966b5f0b037e00680100472e0101c211000901000631310101ff010603f42403f424290501c0a864102201017900060120410101"
    "097b000f80000d0408080808000d0408080404250908696e7465726e65741201")

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
    # Issue 42 round 2. The modify request of "pdu-resource-modify" answered by the gNB's ERROR INDICATION for ids 1/1
    # (sent as frame 43 was: uplink, TSN 22) instead of the response: the class-1 request fails.
    "n2-error-indication": Recipe(SANDBOX, grafts=(
        (41, SANDBOX, 41, 16, MODIFY_REQUEST), (43, SANDBOX, 43, 22, error_indication(1, 1)))),
    # UE 3's REGISTRATION ACCEPT sent in a DownlinkNASTransport (frame 36's payload) and returned by the gNB's NAS NON
    # DELIVERY INDICATION (sent as frame 35 was: uplink, TSN 18, frame 37 on dropped).
    "registration-accept-non-delivery": Recipe(SANDBOX, ("37-9999",), (
        (35, SANDBOX, 37, 18, nas_non_delivery_indication(3, 3, REGISTRATION_ACCEPT_3)),),
        payloads=((36, downlink_nas_transport(3, 3, REGISTRATION_ACCEPT_3)),)),
    # The tester's SERVICE ACCEPT sent in a DownlinkNASTransport (frame 43's payload, ids 13/9): it ends the service
    # request as delivered, until the NAS NON DELIVERY INDICATION returning it (sent as frame 35 was: uplink, TSN 3).
    "service-accept-non-delivery": Recipe(INITUE, ("44-9999",), (
        (35, INITUE, 44, 3, nas_non_delivery_indication(13, 9, SERVICE_ACCEPT)),),
        payloads=((43, downlink_nas_transport(13, 9, SERVICE_ACCEPT)),)),
    # UE 3's establishment accept sent in a DownlinkNASTransport (frame 41's payload), its setup response (frame 43)
    # dropped, and returned by a NAS NON DELIVERY INDICATION (sent as frame 39 was: uplink, TSN 21).
    "pdu-accept-non-delivery": Recipe(SANDBOX, ("43",), (
        (39, SANDBOX, 43, 21, nas_non_delivery_indication(3, 3, ESTABLISHMENT_ACCEPT_3)),),
        payloads=((41, downlink_nas_transport(3, 3, ESTABLISHMENT_ACCEPT_3)),)),
    # The tester's PAGING (frame 28) pages 5G-TMSI 0xc000061b instead of 0xc000061a: no UE presents it after.
    "paging-no-response": Recipe(INITUE, flips=((28, "00c000061a", "00c000061b"),)),
    # UE 1's REGISTRATION COMPLETE (frame 19) made a CONFIGURATION UPDATE COMPLETE (as "registration-complete-missing"),
    # then a new REGISTRATION REQUEST of UE 1 (the tester's, frame 31, as UE 1's): the first registration is
    # restarted after its accept (frame 16), its REGISTRATION COMPLETE missing.
    "registration-restarted-after-accept": Recipe(SANDBOX, grafts=(registration_as(1, 22),),
                                                  flips=((19, "7e0043", "7e0055"),)),
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
    "n2-error-indication": ("n2-error-indication",),
    "registration-accept-non-delivery": ("registration-accept-non-delivery",),
    "service-accept-non-delivery": ("service-accept-non-delivery",),
    "pdu-accept-non-delivery": ("pdu-accept-non-delivery",),
    "paging-no-response": ("paging-no-response",),
    "registration-restarted-after-accept": ("restarted",),
}


def built(name: str) -> Path:
    """The capture of recipe `name` (its path even when the corpus is missing: callers check exists())."""
    return built_captures.built(name, RECIPES)
