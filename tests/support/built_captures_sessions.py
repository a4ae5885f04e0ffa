"""More captures built from real corpus frames, for PDU-session paths the corpus and built_captures.py lack.

The recipes and the way they are built are those of tests/support/built_captures.py (its Recipe, flips,
hand-encoded payloads, editcap drops and grafted DATA chunks); they live here so that module keeps its own
list. Each capture's path is stable (named by its recipe), so the cached sharkd trees and oracle answers stay
valid.
"""

from __future__ import annotations

from pathlib import Path

from tests.support import built_captures
from tests.support.built_captures import SANDBOX, SETUP_FAILED, Recipe, returned_request

# Frame 25's PDUSessionResourceSetupResponse made one whose only list is the failed-to-setup one
# (PDUSessionResourceFailedToSetupListSURes, IE 58) with an empty PDUSessionResourceSetupUnsuccessfulTransfer
# (an octet string of length 0): the item names PDU session 1 and no cause at all.
SETUP_FAILED_NO_CAUSE = bytes.fromhex("201d0017" "000003" "000a40020001" "005540020001" "003a4004" "00" "00" "01" "00")
# UE 1's PDUSessionResourceSetupRequest (frame 22, downlink TSN 7) sent again after the capture's last frame, as
# the next downlink chunk after frame 41 (TSN 3935580798): the same session asked to be set up a second time.
# (`like` numbers the frame after the drops: frame 41 is 40 once frame 25 is gone.)
AGAIN = (41, SANDBOX, 22, 3935580799, {})
AGAIN_AFTER_DROP = (40, *AGAIN[1:])

# N3 tunnels the corpus never shows (TS 38.413 9.3.2.2: a TransportLayerAddress is a BIT STRING of 32, 128 or 160
# bits; 160 is an IPv4 then an IPv6 address, TS 38.414 5.1). UE 1's PDUSessionResourceSetupRequest (frame 22) with
# its PDUSessionResourceSetupRequestTransfer (5 IEs instead of 4) made: UL-NGU-UP-TNLInformation (IE 139, APER:
# choice, extension and bit-string-extension bits, then the length 160 - 1 in 8 bits -> 09 f0; the 20 octets;
# TEID) dual stack 10.53.0.13 + 2001:db8:53::13, and AdditionalUL-NGU-UP-TNLInformation (IE 126) added: a
# one-item UPTransportLayerInformationList with an IPv6-only end (length 128 - 1 -> 00 7f) 2001:db8:53::14, TEID
# 0000dc51. The transfer's, IE 74's and the PDU's lengths follow (+42 octets); every other octet is frame 22's.
_FRAME_22_HEAD = ("001d0080d8" "000004" "000a00020001" "005500020001" "004a0080b6" "00" "40" "01"
                  "56" "7e02646e4469037e00680100472e0101c211000901000631310101ff010603f42403f424290501c0a8640e220101"
                  "7900060120410101097b000f80000d0408080808000d0408080404250908696e7465726e6574120100" "20")
DUAL_STACK_REQUEST = bytes.fromhex(
    _FRAME_22_HEAD + "59" "000005" "0082000a0c3b9aca00303b9aca00"
    "008b001a" "09f0" "0a35000d" "20010db8005300000000000000000013" "0000dc50"
    "007e0016" "007f" "20010db8005300000000000000000014" "0000dc51"
    "0086000100" "0088000700010000091c40" "006e400a0c3b9aca00303b9aca00")
# Its PDUSessionResourceSetupResponse (frame 25) made: dLQosFlowPerTNLInformation dual stack 10.53.0.20 +
# 2001:db8:53::20 (TEID 00000001), and additionalDLQosFlowPerTNLInformation (its presence bit: 40 13 e0) one item,
# IPv4 10.53.0.21, TEID 00000002, QoS flow 1.
DUAL_STACK_RESPONSE = bytes.fromhex(
    "201d0041" "000003" "000a40020001" "005540020001" "004b402e" "00" "0001" "2a"
    "4013e0" "0a350014" "20010db8005300000000000000000020" "00000001" "0001"
    "0007c0" "0a350015" "00000002" "0001")

RECIPES: dict[str, Recipe] = {
    "n3-dual-stack-and-additional-tunnels": Recipe(SANDBOX, payloads=((22, DUAL_STACK_REQUEST),
                                                                      (25, DUAL_STACK_RESPONSE))),
    "pdu-setup-failed-no-cause": Recipe(SANDBOX, payloads=((25, SETUP_FAILED_NO_CAUSE),)),
    # The session was set up (frame 25 answered frame 22): the later request is a user-plane (re)activation,
    # not its establishment (TS 23.502 4.2.3.2); its tunnel and QoS flows leave the establishment's as they were.
    "setup-request-after-setup": Recipe(SANDBOX, grafts=(AGAIN,)),
    # The answer (frame 25) is lost and the AMF asks again: the second request is the one the session waits on.
    "setup-request-again-unanswered": Recipe(SANDBOX, ("25",), (AGAIN_AFTER_DROP,)),
    # UE 3's PDU SESSION ESTABLISHMENT REQUEST (frame 39, with its REGISTRATION COMPLETE) is not in the capture:
    # its session is first seen in the N2 setup request carrying the accept (frame 41).
    "n2-setup-without-request": Recipe(SANDBOX, ("39",)),
    # ... and that accept rides in a DownlinkNASTransport (procedure code 29 -> 4), its setup response (frame 43)
    # dropped: the session is known from the accept alone.
    "accept-alone": Recipe(SANDBOX, ("39", "43"), flips=((41, "0000003c001d", "0000003c0004"),)),
    # UE 3's InitialUEMessage (frame 23, its REGISTRATION REQUEST) is not in the capture: the REGISTRATION ACCEPT
    # (frame 36) answers a request made before it, and still tells the context's registration state.
    "registration-request-outside": Recipe(SANDBOX, ("23",)),
    # The capture ends on UE 3's REGISTRATION REQUEST (frame 23): nothing after it could answer, not a failure;
    # and one PDU later (frame 24, UE 2's InitialContextSetupRequest): the association went on, a failure.
    "ends-on-registration-request": Recipe(SANDBOX, ("-r", "1-23")),
    "ends-after-registration-request": Recipe(SANDBOX, ("-r", "1-24")),
    # UE 1's establishment request (frame 19, with its InitialContextSetupResponse) is not in the capture, and
    # then: its N2 setup failed (frame 25 as in built_captures' pdu-setup-failed), its setup response is lost,
    # or the AMF hands the request back unforwarded (frame 22 as in pdu-returned): each status from what is seen.
    "setup-failed-without-request": Recipe(SANDBOX, ("19",), payloads=((25, SETUP_FAILED),)),
    "no-setup-response-without-request": Recipe(SANDBOX, ("19", "25")),
    "returned-without-request": Recipe(SANDBOX, ("19", "25"), payloads=((22, returned_request()),)),
}


def built(name: str) -> Path:
    """The capture of recipe `name` (its path even when the corpus is missing: callers check exists())."""
    return built_captures.built(name, RECIPES)
