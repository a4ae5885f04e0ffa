"""Captures built from real corpus frames for cases the corpus never shows, written once beside the tree cache.

Each recipe takes a corpus capture, drops frames with editcap and appends DATA chunks of real frames
(tests/support/pcapedit.transplant) sent on one of its associations, with the UE ids patched byte by
byte (each old byte is checked). The path of a built capture is stable (named by its recipe), so the
cached sharkd trees and oracle answers of it stay valid.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
from pathlib import Path

from tests.pcaps import PCAPS
from tests.support.ngap_oracle import CACHE
from tests.support.pcapedit import PCAP_MAGICS, packets, transplant

SANDBOX, SLICE, AUTH = "adrian_sandbox_n2.pcap", "adrian_pdu_session_reject_slice.pcap", "adrian_auth_failure.pcap"
# (frame sent as, donor capture, donor frame, TSN, {payload offset: (old byte, new byte)})
Graft = tuple[int, str, int, int, dict[int, tuple[int, int]]]
# The auth-failure run's UEContextReleaseCommand (frame 13, cause nas/authentication-failure) and Complete
# (frame 15), its AMF/RAN UE NGAP ids 1/1 made 3/3: sent on the sandbox association as UE 3's.
RELEASE: list[Graft] = [(41, AUTH, 13, 16, {12: (0x01, 0x03), 14: (0x01, 0x03)}),
                        (39, AUTH, 15, 21, {12: (0x01, 0x03), 18: (0x01, 0x03)})]
# The slice-reject run's 5GMM STATUS (frame 37) as an UplinkNASTransport (procedure code 4 -> 46) of UE 3,
# cause #91 -> #101 (message not compatible with the protocol state); uplink TSN 21 (the release complete then 22).
STATUS: Graft = (39, SLICE, 37, 21, {1: (0x04, 0x2E), 12: (0x02, 0x03), 18: (0x02, 0x03), 34: (0x5B, 0x65)})
# name -> (source capture, frames dropped, grafts appended 1 ms apart after the source's last frame).
# UE 3 of the sandbox run: its PDU SESSION ESTABLISHMENT ACCEPT rides in frame 41's
# PDUSessionResourceSetupRequest; its PDUSessionResourceSetupResponse (frame 43, uplink TSN 21) is dropped.
RECIPES: dict[str, tuple[str, tuple[str, ...], list[Graft]]] = {
    # A UE context release command (with its NGAP cause) while the establishment still waits for N2.
    "released-before-n2-response": (SANDBOX, ("43",), RELEASE),
    # The UE answers the accept with 5GMM STATUS (no PDU session id): it ends the latest establishment.
    "5gmm-status-then-release": (SANDBOX, ("43",), [STATUS, RELEASE[0], (*RELEASE[1][:3], 22, RELEASE[1][4])]),
    # The capture ends on the N2 setup request carrying the accept: accepted, then no N2 setup response.
    "ends-on-n2-setup-with-accept": (SANDBOX, ("-r", "1-41"), []),
    # No accept and no setup response: the establishment request (frame 39) is left unanswered while the
    # UE context goes on (frame 40's downlink NAS transport).
    "no-accept-ue-goes-on": (SANDBOX, ("41", "43"), []),
    # The capture ends at UE 3's AUTHENTICATION REQUEST (frame 26, TSN 3935580792), then sent a second time.
    "restarted": (SANDBOX, ("27-9999",), [(26, SANDBOX, 26, 3935580793, {})]),
}


def built(name: str) -> Path:
    """The capture of recipe `name` (its path even when the corpus is missing: callers check exists())."""
    source, drop, grafts = RECIPES[name]
    digest = hashlib.sha256(repr(RECIPES[name]).encode()).hexdigest()[:8]
    out = CACHE / f"built-{name}-{digest}.pcap"
    donors = {source, *(g[1] for g in grafts)}
    if out.exists() or not all((PCAPS / d).exists() for d in donors) or shutil.which("editcap") is None:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    subprocess.run(["editcap", "-F", "pcap", str(PCAPS / source), str(tmp), *drop], check=True, capture_output=True)
    data = bytearray(tmp.read_bytes())
    last = list(packets(data))[-1]
    endian = PCAP_MAGICS[bytes(data[:4])]
    seconds, fraction = struct.unpack_from(endian + "II", data, last.header)
    nano = bytes(data[:4]) in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    end = seconds + fraction / (1e9 if nano else 1e6)
    for step, (like, donor, frame, tsn, patches) in enumerate(grafts, start=1):
        transplant(data, like, bytearray((PCAPS / donor).read_bytes()), frame, tsn=tsn, time=end + step / 1000,
                   patches=patches)
    tmp.write_bytes(bytes(data))
    tmp.replace(out)  # a stable path and mtime: the sharkd trees and oracle answers stay cached
    return out
