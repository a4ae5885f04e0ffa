"""Captures for path switches and reused UE ids, built from real corpus frames (tests/support/built_captures.py
explains the recipes). The corpus has one PathSwitchRequest (free5GC, frame 13) and its source context is not
in that capture; these give it a second switch on the same gNB and source contexts on other gNBs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

from tests.support.built_captures import CORPORA, HO, Recipe, built, flip
from tests.support.ngap_oracle import CACHE
from tests.support.pcapedit import keep_sctp_only, readdress_sctp, shift_pcap, to_ethernet

PATH_SWITCH = "pcaps-extra/ngtester_chain_free5gc_pathswitch_then_release_amf_ngap_nas_sbi.pcap"
OAI_INITUE = "pcaps-extra/ngtester_chain_oai_initue_then_release_amf_ngap_nas_sbi.pcap"
DAY = 86400

# A UEContextModificationRequest (procedure 40, initiating, reject) for AMF/RAN UE NGAP ids 2/98 whose New AMF UE
# NGAP ID (IE 40, reject) is 5 (TS 38.413 9.2.2.7): APER, each id one octet after its length octet.
NEW_AMF_ID = bytes.fromhex("00280015" "000003" "000a00020002" "005500020062" "002800020005")

# name -> recipe. The path switch capture's uplink TSNs run 0-3 and downlink 0-2 (frame 33 retransmits TSN 1).
RECIPES: dict[str, Recipe] = {
    # After the release (frame 58), the PathSwitchRequest (frame 13) and its Acknowledge (frame 30) again: the ids
    # 4/99 of a released context, so a new one (#2), whose SourceAMF-UE-NGAP-ID 4 names the released context of
    # the same association, which is not a source (a path switch comes from another gNB).
    "path-switch-again-same-gnb": Recipe(PATH_SWITCH, grafts=((13, PATH_SWITCH, 13, 4, {}),
                                                              (30, PATH_SWITCH, 30, 3, {}))),
    # The handover run ends with context 2/99 (#2) live on the target gNB's association (A1; uplink TSNs 0-4,
    # downlink 0-2). Then, on it: its HandoverNotify (frame 20) with RAN-UE-NGAP-ID 99 -> 98 (offset 18): AMF id 2
    # in another pair, a new context 2/98 ending 2/99; a UEContextModificationRequest giving it AMF id 5; the
    # HandoverNotify again as 5/98 (offsets 12, 18), the same context; OAI's InitialUEMessage (frame 9 of its run)
    # with RAN id 99 -> 98 (offset 12), ending it; and the HandoverRequest (frame 12: AMF id 2 alone), a new
    # context 2/?.
    "ids-reused-then-initial-ue-and-handover-request": Recipe(HO, grafts=(
        (20, HO, 20, 5, {18: (0x63, 0x62)}), (18, HO, 18, 3, NEW_AMF_ID),
        (20, HO, 20, 6, {12: (2, 5), 18: (0x63, 0x62)}), (20, OAI_INITUE, 9, 7, {12: (0x63, 0x62)}),
        (18, HO, 12, 4, {}))),
}


class Part(NamedTuple):
    """One corpus capture in a merge: its SCTP packets only (as Ethernet), frames flipped first (as
    built_captures.flip), moved by whole days, its IPv4 addresses and SCTP ports mapped, verification tags XORed."""

    source: str
    days: int = 0
    addresses: tuple[tuple[str, str], ...] = ()
    ports: tuple[tuple[int, int], ...] = ()
    salt: int = 0
    flips: tuple[tuple[int, str, str], ...] = ()


# A copy of the Open5GS handover run three days earlier at another AMF address (172.30.0.12, port 38412 still),
# the run itself (2026-07-22; AMF 172.30.0.10: contexts with AMF-UE-NGAP-ID 1 on both its gNBs, the last one
# amf-1/ran-99#2 on the target gNB), a copy of it three days later at another AMF address (172.30.0.11), the
# free5GC path switch (2026-07-30) with its SourceAMF-UE-NGAP-ID 4 made 1 (frame 13, IE 100), and a copy of
# the handover run nine days later at the first AMF, after the switch. The source is the latest context with
# AMF id 1 at 172.30.0.10 started before the switch: the copies' are at other AMFs (before and after the run's),
# or start after it.
MERGES: dict[str, tuple[Part, ...]] = {
    "path-switch-from-other-gnb": (
        Part(HO, -3, (("172.30.0.10", "172.30.0.12"), ("172.30.200.4", "172.30.203.4"),
                      ("172.30.200.2", "172.30.203.2")), ((44533, 44536), (53621, 53624)), 0x33333333),
        Part(HO),
        Part(HO, 3, (("172.30.0.10", "172.30.0.11"), ("172.30.200.4", "172.30.201.4"),
                     ("172.30.200.2", "172.30.201.2")), ((44533, 44534), (53621, 53622)), 0x11111111),
        Part(PATH_SWITCH, flips=((13, "00640002000400", "00640002000100"),)),
        Part(HO, 9, (("172.30.200.4", "172.30.202.4"), ("172.30.200.2", "172.30.202.2")),
             ((44533, 44535), (53621, 53623)), 0x22222222),
    ),
}


def built_reuse(name: str) -> Path:
    """The capture of recipe `name` (RECIPES) or merge `name` (MERGES); its path even when the corpus is missing."""
    if name in RECIPES:
        return built(name, RECIPES)
    parts = MERGES[name]
    out = CACHE / f"merged-{name}-{hashlib.sha256(repr(parts).encode()).hexdigest()[:8]}.pcap"
    if out.exists() or not all((CORPORA / p.source).exists() for p in parts) or shutil.which("mergecap") is None:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="built-reuse-") as tmp:
        files = []
        for n, part in enumerate(parts):
            data = bytearray((CORPORA / part.source).read_bytes())
            for frame, old, new in part.flips:
                flip(data, frame, old, new)
            cooked, ethernet = Path(tmp) / f"{n}.sll.pcap", Path(tmp) / f"{n}.pcap"
            cooked.write_bytes(bytes(data))
            to_ethernet(cooked, ethernet)
            data = keep_sctp_only(bytearray(ethernet.read_bytes()))
            shift_pcap(data, part.days * DAY)
            readdress_sctp(data, salt=part.salt, addresses=dict(part.addresses), ports=dict(part.ports))
            ethernet.write_bytes(bytes(data))
            files.append(str(ethernet))
        whole = out.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run(["mergecap", "-F", "pcap", "-w", str(whole), *files], check=True, capture_output=True)
        whole.replace(out)  # a stable path and mtime: the sharkd trees and oracle answers stay cached
    return out


NAMES = [*RECIPES, *MERGES]
