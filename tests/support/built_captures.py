"""Captures built from real corpus frames for cases the corpus never shows, written once beside the tree cache.

Each recipe takes a corpus capture, replaces bytes inside frames (each old byte string must occur once
in its frame) or a frame's whole NGAP payload with a hand-encoded one (tests/support/pcapedit.replace_payload),
drops frames with editcap and appends DATA chunks of real frames (tests/support/pcapedit.transplant) sent on
one of its associations, with the UE ids patched byte by byte (each old byte is checked) or a hand-encoded
payload. The path of a built capture is stable (named by its recipe), so the cached sharkd trees and oracle
answers of it stay valid. The same recipes feed the in-process procedures test and the e2e verdict test.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import NamedTuple

from tests.pcaps import PCAPS
from tests.support.ngap_oracle import CACHE
from tests.support.pcapedit import PCAP_MAGICS, packets, replace_payload, transplant

CORPORA = PCAPS.parent  # recipes name captures relative to it: "pcaps/x.pcap", "pcaps-extra/y.pcap"
SANDBOX, SLICE = "pcaps/adrian_sandbox_n2.pcap", "pcaps/adrian_pdu_session_reject_slice.pcap"
AUTH = "pcaps/adrian_auth_failure.pcap"
OAI = "pcaps-extra/oaifed_5gcn-basic-deployment-nrf.pcap"
HO = "pcaps-extra/ngtester_open5gs_ho_window_p21_p09_amf_ngap_nas_sbi.pcap"
INITUE = "pcaps-extra/ngtester_initue_open5gs_amf_ngap_nas_sbi.pcap"
# (frame sent as, donor capture, donor frame, TSN, {payload offset: (old byte, new byte)} or a whole new payload)
Graft = tuple[int, str, int, int, dict[int, tuple[int, int]] | bytes]


class Recipe(NamedTuple):
    """How one capture is built from `source`: flips and payloads first, then `drop` (editcap), then `grafts`
    appended 1 ms apart after the last kept frame."""

    source: str
    drop: tuple[str, ...] = ()
    grafts: tuple[Graft, ...] = ()
    flips: tuple[tuple[int, str, str], ...] = ()  # (frame, old bytes, new bytes), hex
    payloads: tuple[tuple[int, bytes], ...] = ()  # (frame, its new NGAP PDU)


# The auth-failure run's UEContextReleaseCommand (frame 13, cause nas/authentication-failure) and Complete
# (frame 15), its AMF/RAN UE NGAP ids 1/1 made 3/3: sent on the sandbox association as UE 3's.
RELEASE: tuple[Graft, Graft] = ((41, AUTH, 13, 16, {12: (0x01, 0x03), 14: (0x01, 0x03)}),
                                (39, AUTH, 15, 21, {12: (0x01, 0x03), 18: (0x01, 0x03)}))
# The slice-reject run's 5GMM STATUS (frame 37) as an UplinkNASTransport (procedure code 4 -> 46) of UE 3,
# cause #91 -> #101 (message not compatible with the protocol state); uplink TSN 21 (the release complete then 22).
STATUS: Graft = (39, SLICE, 37, 21, {1: (0x04, 0x2E), 12: (0x02, 0x03), 18: (0x02, 0x03), 34: (0x5B, 0x65)})

# Hand-encoded NGAP (APER, TS 38.413) and NAS (TS 24.501) pieces.
# UE 1 of the sandbox run (AMF/RAN UE NGAP ids 1/1): its PDU SESSION ESTABLISHMENT REQUEST (frame 19) as sent.
SANDBOX_REQUEST = bytes.fromhex("2e0101c1ffff91a12801007b000780000a00000d00")
# A PDUSessionResourceSetupResponse (procedure 29, successfulOutcome) for UE 1/1 whose only list is
# PDUSessionResourceFailedToSetupListSURes (IE 58, ignore): one item, PDU session 1, and its
# PDUSessionResourceSetupUnsuccessfulTransfer: preamble 000, Cause choice transport 001, enum 0 0 -> 0x04
# (transport-resource-unavailable).
SETUP_FAILED = bytes.fromhex("201d0018" "000003" "000a40020001" "005540020001" "003a4005" "00" "00" "01" "0104")
# A HandoverPreparationFailure (procedure 12, unsuccessfulOutcome) for the tester's context 1/1 with its
# Cause IE (15, ignore): choice radioNetwork 000, enum 0 + 000111 -> 01 c0
# (ho-failure-in-target-5GC-ngran-node-or-target-system).
HO_PREPARATION_FAILURE = bytes.fromhex("400c0015" "000003" "000a40020001" "005540020001" "000f400201c0")


def returned_request() -> bytes:
    """A DownlinkNASTransport (procedure 4) for UE 1/1 whose NAS-PDU (IE 38) is a DL NAS TRANSPORT handing back
    UE 1's establishment request: payload container type 1 (N1 SM), the container, PDU session ID IE (0x12) 1,
    5GMM cause IE (0x58) #90 payload was not forwarded; inside frame 22's security header (NEA0, MAC, SQN 3)."""
    plain = bytes.fromhex("7e006801") + len(SANDBOX_REQUEST).to_bytes(2, "big") + SANDBOX_REQUEST
    nas = bytes.fromhex("7e02646e446903") + plain + bytes.fromhex("1201" "585a")
    value = bytes([len(nas)]) + nas
    ies = bytes.fromhex("000003" "000a00020001" "005500020001" "002600") + bytes([len(value)]) + value
    return bytes.fromhex("000440") + bytes([len(ies)]) + ies


# The tester sent HandoverRequired (frame 11, ids 1/99) on the target gNB's association, where the target
# context (HandoverRequestAcknowledge, frame 13: ids 2/99) reuses RAN-UE-NGAP-ID 99, and the AMF answered
# with HandoverCommand (frame 14, ids 1/1) on the other association. Here the source context is 1/1 on the
# one association (frame 11's RAN id 99 -> 1), the capture ends after frame 13, and the AMF's answer is sent
# on it, downlink as frame 12 was (next TSN): frame 14 itself, or a hand-encoded HandoverPreparationFailure.
HO_SOURCE_1 = ((11, "005500020063", "005500020001"),)

# name -> recipe. UE 3 of the sandbox run: its PDU SESSION ESTABLISHMENT ACCEPT rides in frame 41's
# PDUSessionResourceSetupRequest; its PDUSessionResourceSetupResponse (frame 43, uplink TSN 21) is dropped.
RECIPES: dict[str, Recipe] = {
    # A UE context release command (with its NGAP cause) while the establishment still waits for N2.
    "released-before-n2-response": Recipe(SANDBOX, ("43",), RELEASE),
    # The UE answers the accept with 5GMM STATUS (no PDU session id): it ends the latest establishment.
    "5gmm-status-then-release": Recipe(SANDBOX, ("43",), (STATUS, RELEASE[0], (*RELEASE[1][:3], 22, RELEASE[1][4]))),
    # The capture ends on the N2 setup request carrying the accept: accepted, then no N2 setup response.
    "ends-on-n2-setup-with-accept": Recipe(SANDBOX, ("-r", "1-41")),
    # No accept and no setup response: the establishment request (frame 39) is left unanswered while the
    # UE context goes on (frame 40's downlink NAS transport).
    "no-accept-ue-goes-on": Recipe(SANDBOX, ("41", "43")),
    # UE 1's setup response (frame 25) is lost: its establishment, accepted in frame 22, waits while UE 1
    # falls silent and the association goes on with UE 2 and 3 until frame 43.
    "n2-response-lost-association-goes-on": Recipe(SANDBOX, ("25",)),
    # No Authentication is answered: UE 1's and UE 2's AUTHENTICATION RESPONSEs (frames 11, 17) are dropped and the
    # capture ends at UE 3's request (frame 26): the procedure's statistics row has no closed instance.
    "authentication-never-answered": Recipe(SANDBOX, ("11", "17", "27-9999")),
    # 5GMM STATUS twice: the first ends UE 3's waiting establishment, the second finds none (an orphan answer).
    "5gmm-status-twice": Recipe(SANDBOX, ("43",), (STATUS, (*STATUS[:3], 22, STATUS[4]))),
    # UE 3's accept rides in a DownlinkNASTransport, and its setup response (frame 43) still comes: the response
    # answers no N2 request that carried an accept, so it does not end the establishment.
    "pdu-accept-without-n2-then-response": Recipe(SANDBOX, flips=((41, "0000003c001d", "0000003c0004"),)),
    # The capture ends at UE 3's AUTHENTICATION REQUEST (frame 26, TSN 3935580792), then sent a second time.
    "restarted": Recipe(SANDBOX, ("27-9999",), ((26, SANDBOX, 26, 3935580793, {}),)),
    # UE 1's accept rides in frame 22's PDUSessionResourceSetupRequest, answered by frame 25: both become
    # InitialContextSetup (procedure code 29 -> 14), their lists the Cxt ones (74 -> 71, 75 -> 72), whose
    # items are encoded exactly like the SU ones (PDU session id, NAS-PDU, S-NSSAI, transfer).
    "pdu-initial-context-setup": Recipe(SANDBOX, flips=(
        (22, "0000003c001d", "0000003c000e"), (22, "004a0080", "00470080"),
        (25, "0000003c201d", "0000003c200e"), (25, "004b40", "004840"))),
    # Frame 25's setup response lists UE 1's session 1 as failed to set up instead.
    "pdu-setup-failed": Recipe(SANDBOX, payloads=((25, SETUP_FAILED),)),
    # Frame 22 hands UE 1's request back unforwarded; its setup response (frame 25) is dropped.
    "pdu-returned": Recipe(SANDBOX, ("25",), payloads=((22, returned_request()),)),
    # UE 3's accept rides in a DownlinkNASTransport (procedure code 29 -> 4) and its setup response is dropped.
    "pdu-accept-without-n2": Recipe(SANDBOX, ("43",), flips=((41, "0000003c001d", "0000003c0004"),)),
    # OAI's DEREGISTRATION REQUEST (frame 721, plain NAS inside an integrity-protected one): its type octet
    # 0x21 (normal) becomes 0x29 (switch off); the DEREGISTRATION ACCEPT (frame 722) is dropped.
    # A 5G-TMSI assigned in one context and presented in another: frame 31's REGISTRATION REQUEST (5G-GUTI,
    # inside an UplinkNASTransport of AMF/RAN UE NGAP ids 11/8, released in frame 33) sent again after frame 49
    # (uplink TSN 554122764) as ids 14/10, its 5G-TMSI 0xc000061a made 0xc0000621, the one the
    # CONFIGURATION UPDATE COMMAND of context 13/9 assigned in frame 45.
    "tmsi-assigned-then-presented": Recipe(INITUE, grafts=(
        (49, INITUE, 31, 554122764, {12: (0x0B, 0x0E), 18: (0x08, 0x0A), 47: (0x1A, 0x21)}),)),
    "deregistration-switch-off": Recipe(OAI, ("722",), flips=((721, "7e004521", "7e004529"),)),
    "handover-command": Recipe(HO, ("14-9999",), ((12, HO, 14, 975375287, {}),), flips=HO_SOURCE_1),
    "handover-preparation-failure": Recipe(HO, ("14-9999",), ((12, HO, 14, 975375287, HO_PREPARATION_FAILURE),),
                                           flips=HO_SOURCE_1),
}


def flip(data: bytearray, frame: int, old: str, new: str) -> None:
    """In place: the one occurrence of bytes `old` in frame `frame` replaced by `new` (hex, same length)."""
    packet = list(packets(data))[frame - 1]
    body = bytes(data[packet.offset:packet.offset + packet.caplen])
    assert body.count(bytes.fromhex(old)) == 1 and len(old) == len(new), (frame, old)
    at = packet.offset + body.index(bytes.fromhex(old))
    data[at:at + len(new) // 2] = bytes.fromhex(new)


def built(name: str, recipes: dict[str, Recipe] | None = None) -> Path:
    """The capture of recipe `name` of `recipes` (default RECIPES), its path even when the corpus is missing:
    callers check exists()."""
    recipe = (RECIPES if recipes is None else recipes)[name]
    digest = hashlib.sha256(repr(recipe).encode()).hexdigest()[:8]
    out = CACHE / f"built-{name}-{digest}.pcap"
    donors = {recipe.source, *(g[1] for g in recipe.grafts)}
    if out.exists() or not all((CORPORA / d).exists() for d in donors) or shutil.which("editcap") is None:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    data = bytearray((CORPORA / recipe.source).read_bytes())
    for frame, old, new in recipe.flips:
        flip(data, frame, old, new)
    for frame, payload in recipe.payloads:
        data = replace_payload(data, frame, payload)
    edited = out.with_suffix(f".{os.getpid()}.edited")
    edited.write_bytes(bytes(data))
    subprocess.run(["editcap", "-F", "pcap", str(edited), str(tmp), *recipe.drop], check=True, capture_output=True)
    edited.unlink()
    data = bytearray(tmp.read_bytes())
    last = list(packets(data))[-1]
    endian = PCAP_MAGICS[bytes(data[:4])]
    seconds, fraction = struct.unpack_from(endian + "II", data, last.header)
    nano = bytes(data[:4]) in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    end = seconds + fraction / (1e9 if nano else 1e6)
    for step, (like, donor, frame, tsn, patches) in enumerate(recipe.grafts, start=1):
        transplant(data, like, bytearray((CORPORA / donor).read_bytes()), frame, tsn=tsn, time=end + step / 1000,
                   **({"payload": patches} if isinstance(patches, bytes) else {"patches": patches}))
    tmp.write_bytes(bytes(data))
    tmp.replace(out)  # a stable path and mtime: the sharkd trees and oracle answers stay cached
    return out


SANDBOX_RUN = ("pcaps/adrian_sandbox_n2.pcap", "pcaps/adrian_sandbox_n4.pcap", "pcaps/adrian_sandbox_sbi.pcap")
# name -> (one run's N2, N4 and SBI views, merged by mergecap; the decode_as its SBI port needs; frames then
# dropped by editcap, numbered as in the merged capture).
MERGES: dict[str, tuple[tuple[str, ...], str | None, tuple[str, ...]]] = {
    "sandbox-n2-n4-sbi": (SANDBOX_RUN, "tcp.port==7777,http2", ()),
    "upf-timeout-n2-n4-sbi": (("pcaps/adrian_n4_upf_timeout.pcap", "pcaps/adrian_n4_upf_timeout_n4.pcap",
                               "pcaps/adrian_n4_upf_timeout_sbi.pcap"), "tcp.port==7777,http2", ()),
    # UE 2's PDUSessionResourceSetupResponse (frame 1052) is lost: its establishment, accepted in frame 1047,
    # stays unanswered and its window runs to the last NGAP frame (1234), over UE 3's whole establishment, so
    # UE 3's CreateSMContext (1143, 1146) falls in two windows: only the SUPI in its JSON body links it.
    "sandbox-n2-n4-sbi-ue2-response-lost": (SANDBOX_RUN, "tcp.port==7777,http2", ("1052",)),
}


def merged(name: str) -> Path:
    """The merged capture `name` of MERGES (its path even when the corpus is missing: callers check exists())."""
    parts, _, drop = MERGES[name]
    out = CACHE / f"merged-{name}-{hashlib.sha256(repr((parts, drop)).encode()).hexdigest()[:8]}.pcap"
    if out.exists() or not all((CORPORA / p).exists() for p in parts) or shutil.which("mergecap") is None:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    whole = out.with_suffix(f".{os.getpid()}.merged")
    subprocess.run(["mergecap", "-F", "pcap", "-w", str(whole), *(str(CORPORA / p) for p in parts)], check=True,
                   capture_output=True)
    subprocess.run(["editcap", "-F", "pcap", str(whole), str(tmp), *drop], check=True, capture_output=True)
    whole.unlink()
    tmp.replace(out)  # a stable path and mtime: the sharkd trees and oracle answers stay cached
    return out


# 5G-TMSI evidence between contexts of different subscribers, and evidence joining contexts already linked:
# the tester's REGISTRATION REQUEST (INITUE frame 31: an UplinkNASTransport with a 5G-GUTI, ids 11/8 at payload
# offsets 12 and 18, its 5G-TMSI 0xc000061a at 44-47) sent on the sandbox association as another context's.
# The sandbox's Registration Accepts assign UE 1 (SUCI msin 0000000002) 0xc00003e4 in frame 16, UE 2 (msin
# 0000000003) 0xc00004b5 in frame 24, UE 3 (msin 0000000001) 0xc0000626 in frame 36; uplink TSNs go on from 22,
# grafts are frames 45 on (the run ends on frame 44, an SCTP SACK).
def registration_as(ue: int, tsn: int, tmsi: tuple[int, int] = (0x06, 0x1A)) -> Graft:
    """INITUE frame 31 sent after the sandbox's frame 43 as UE `ue`'s (AMF and RAN ids `ue`), its 5G-TMSI's last
    two octets made `tmsi`."""
    return 43, INITUE, 31, tsn, {12: (0x0B, ue), 18: (0x08, ue), 46: (0x06, tmsi[0]), 47: (0x1A, tmsi[1])}


# T04's NGReset (frame 16, gNB to AMF): partOfNG-Interface, one item with AMF-UE-NGAP-ID 3 (payload offsets 18, 19:
# the item's preamble 0x40 = AMF id present, then the id). Preamble 0x20 is an item with the RAN-UE-NGAP-ID alone.
RESET = "pcaps-extra/ngtester_open5gs_T04_ng_reset_amf_ngap_nas_sbi.pcap"
# An NGReset (procedure 20, reject) with its Cause IE (misc om-intervention, as in T04) and ResetType (IE 88)
# nG-Interface (choice 0) reset-all (enum 0): one octet 0x00.
RESET_ALL = bytes.fromhex("0014000d" "000002" "000f400186" "0058000100")

RECIPES.update({
    # UE 2 presents UE 1's assigned 5G-TMSI (frame 45): refused, the two identified with different SUCIs; UE 3
    # (frame 46) and UE 2 (frame 47) present 0xc000061a, never assigned: refused, and two subscribers. UE 2's
    # context comes before UE 3's, so this also checks that the evidence is read in capture order.
    "tmsi-two-subscribers": Recipe(SANDBOX, grafts=(
        registration_as(2, 22, (0x03, 0xE4)), registration_as(3, 23), registration_as(2, 24))),
    # UE 2's 5G-TMSI (frame 24) made UE 1's (0xc00003e4): assigned twice; a new context 4/4 presents it (frame 45:
    # linked to UE 2, the latest assigner) and again (frame 46: already linked); 4/4 presents 0xc000061a first
    # (frame 47) and UE 2 after it (frame 48): a presentation between contexts already linked is no refusal.
    "tmsi-assigned-twice": Recipe(SANDBOX, grafts=(
        registration_as(4, 22, (0x03, 0xE4)), registration_as(4, 23, (0x03, 0xE4)), registration_as(4, 24),
        registration_as(2, 25)), flips=((24, "c00004b5", "c00003e4"),)),
    # NGReset of part of the interface: UE 3's context by its AMF id (frame 45), UE 2's by its RAN id (frame 46).
    "ng-reset-part": Recipe(SANDBOX, grafts=(
        (43, RESET, 16, 22, {}), (43, RESET, 16, 23, {18: (0x40, 0x20), 19: (0x03, 0x02)}))),
    # NGReset of the whole interface (frame 45): every live context of the association ends.
    "ng-reset-whole": Recipe(SANDBOX, grafts=((43, RESET, 16, 22, RESET_ALL),)),
    # The capture ends on UE 3's InitialUEMessage (frame 23): a context with no AMF-UE-NGAP-ID yet.
    "ends-on-initial-ue-message": Recipe(SANDBOX, ("24-9999",)),
})

# NAS left ciphered: UE 1's CONFIGURATION UPDATE COMMAND (frame 20, security header 2: integrity protected and
# ciphered, NEA0) has the inner message's protocol discriminator 0x7e made 0x00, so with null_decipher the
# protected NAS still decodes into no plain message, as one ciphered with a real algorithm does.
RECIPES["nas-left-ciphered"] = Recipe(SANDBOX, flips=((20, "7e02cdd2404c027e0054", "7e02cdd2404c02000054"),))

# Only what the AMF sent (the sandbox's SCTP handshake, its NGSetupResponse and two DownlinkNASTransports): no
# message only a gNB sends, so the sides come from the endpoint on port 38412 alone.
RECIPES["amf-sends-only"] = Recipe(SANDBOX, ("-r", "1-4", "7", "10", "12"))
