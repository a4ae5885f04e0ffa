"""Every field of the NGAP UE-context and PDU-session answers, computed a second time from `tshark -T fields`.

It builds on the rows and context keys of tests/support/ngap_oracle.py (one row per NGAP PDU,
bundles split) and never imports diagd. The meaning of each field is the README's and the tool
descriptions':

- per UE context: `frames`, every frame carrying one of its PDUs, in capture order, once each;
  `5g_tmsi`, the 5G-TMSI last assigned to it (Registration Accept or Configuration Update
  Command); `plmn`, the MCC/MNC of the first SUCI it presented.
- per PDU session establishment (UE context, PDU session id, n-th establishment, a new one at each
  Establishment Request): `dnn` accepted (else the one requested: the UL NAS transport's), `ue_ipv4` accepted, `s_nssai`
  of the N2 setup request (SST and SD, hex octets), else the first one a 5GSM message or the UL NAS
  Transport carrying it named (requested or accepted); `n3_uplink`
  (gNB-bound tunnel the N2 setup request gives) and `n3_downlink` (the one the setup response
  gives), each an IPv4 address and a TEID; `qfis` the QoS flows of the setup request; `release`,
  the frames of 5GSM release request/command/complete and the last cause with its name and
  whether it is a normal one (#36, #39).

Cause names come from `tshark -G values`. Where a row holds two values the field could take
(two tunnels, two TMSIs assigned in one PDU, ...), it raises OracleCannotTell instead of choosing.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.ngap_oracle import NORMAL_5GSM, OracleCannotTell, Row, UeKey, owned_rows

TMSI_ASSIGNERS = {0x42, 0x54}  # Registration Accept, Configuration Update Command
SM_REQUEST, SM_ACCEPT, SM_REJECT = 0xC1, 0xC2, 0xC3
SM_RELEASE_FRAMES = {0xD1: "request_frame", 0xD3: "command_frame", 0xD4: "complete_frame"}
DL_NAS_TRANSPORT = 0x68
N2_SETUP = {29, 14}  # PDUSessionResourceSetup, InitialContextSetup
SETUP_OK_LISTS = ("ngap.PDUSessionResourceSetupListSURes", "ngap.PDUSessionResourceSetupListCxtRes")


@dataclass
class Session:
    dnn: str | None = None
    ue_ipv4: str | None = None
    s_nssai: dict[str, str | None] | None = None
    n3_uplink: dict[str, str | None] | None = None
    n3_downlink: dict[str, str | None] | None = None
    qfis: list[int] = field(default_factory=list)
    release: dict[str, Any] | None = None
    requested: bool = False  # its Establishment Request was seen (then its DNN is the requested one)
    setup_request: bool = False
    setup_answered: bool = False


@dataclass
class Fields:
    ues: dict[UeKey, dict[str, Any]]
    sessions: dict[tuple[UeKey, int, int], Session]  # (UE, PDU session id, n-th establishment)


@functools.cache
def value_names(name: str) -> dict[int, str]:
    """{value: name} of a field's value string, as `tshark -G values` lists it."""
    out = subprocess.run(["tshark", "-G", "values"], check=True, capture_output=True, text=True).stdout
    names = {}
    for line in out.splitlines():
        cells = line.split("\t")
        if len(cells) == 4 and cells[0] == "V" and cells[1] == name:
            names[int(cells[2], 0)] = cells[3]
    return names


def single(row: Row, name: str) -> str | None:
    """The one distinct value of a field in this PDU, None if absent; two different ones: cannot tell."""
    got = sorted(set(row.values.get(name, [])))
    if len(got) > 1:
        raise OracleCannotTell(f"frame {row.frame}: {name} has several values {got}")
    return got[0] if got else None


def tunnel(row: Row) -> dict[str, str | None]:
    return {"address": single(row, "ngap.TransportLayerAddressIPv4"), "teid": single(row, "ngap.gTP_TEID")}


CACHE = Path(os.environ.get("DIAGD_TEST_TREE_CACHE", Path(tempfile.gettempdir()) / f"diagd-trees-{os.getuid()}"))


def answer(path: Path) -> Fields:
    """The oracle's answer, kept on disk per capture and oracle source (the mutation gate asks it often)."""
    support = Path(__file__).parent
    key = hashlib.sha256(repr((str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns,
                               *(f.read_bytes() for f in sorted(support.glob("*oracle.py"))),
                               (support / "pcapedit.py").read_bytes())).encode()).hexdigest()[:24]
    cached = CACHE / f"{path.name}.{key}.fields.pickle"
    if cached.exists():
        found: Fields = pickle.loads(cached.read_bytes())
        return found
    found = _answer(path)
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(pickle.dumps(found))
    tmp.replace(cached)
    return found


def _answer(path: Path) -> Fields:
    rows, owners = owned_rows(path)
    ues: dict[UeKey, dict[str, Any]] = {}
    for row, owner in zip(rows, owners, strict=True):
        if owner is None:
            continue
        ue = ues.setdefault(owner, {"frames": [], "5g_tmsi": None, "plmn": None})
        if row.frame not in ue["frames"]:
            ue["frames"].append(row.frame)
        if TMSI_ASSIGNERS & set(row.ints("nas_5gs.mm.message_type")) and (tmsi := row.one("nas_5gs.5g_tmsi")):
            ue["5g_tmsi"] = str(tmsi)
        if ue["plmn"] is None and single(row, "nas_5gs.mm.suci.msin") is not None:
            mcc, mnc = single(row, "e212.mcc"), single(row, "e212.mnc")
            if mcc is not None:
                ue["plmn"] = {"mcc": str(int(mcc)), "mnc": str(int(mnc)) if mnc is not None else None}
    return Fields(ues=ues, sessions=_sessions(rows, owners))


class _Book:
    """The current establishment of each (UE, PDU session id), and every establishment by its key."""

    def __init__(self) -> None:
        self.current: dict[tuple[UeKey, int], tuple[UeKey, int, int]] = {}
        self.count: dict[tuple[UeKey, int], int] = {}
        self.sessions: dict[tuple[UeKey, int, int], Session] = {}

    def get(self, owner: UeKey, psi: int, new: bool = False) -> Session:
        if new or (owner, psi) not in self.current:
            n = self.count[(owner, psi)] = self.count.get((owner, psi), 0) + 1
            self.current[(owner, psi)] = (owner, psi, n)
            self.sessions[(owner, psi, n)] = Session()
        return self.sessions[self.current[(owner, psi)]]

    def existing(self, owner: UeKey, psi: int) -> Session | None:
        key = self.current.get((owner, psi))
        return self.sessions[key] if key else None


def _sessions(rows: list[Row], owners: list[UeKey | None]) -> dict[tuple[UeKey, int, int], Session]:
    book = _Book()
    for row, owner in zip(rows, owners, strict=True):
        if owner is None:
            continue
        _nas(book, row, owner)
        psis = sorted(set(row.ints("ngap.pDUSessionID")))
        if row.proc in N2_SETUP and psis:
            if len(psis) > 1:
                raise OracleCannotTell(f"frame {row.frame}: several PDU sessions in one N2 setup")
            _n2(book, row, owner, psis[0])
    return book.sessions


def _nas(book: _Book, row: Row, owner: UeKey) -> None:
    sm = row.ints("nas_5gs.sm.message_type")
    psi = row.one("nas_5gs.pdu_session_id")
    if DL_NAS_TRANSPORT in row.ints("nas_5gs.mm.message_type") and row.one("nas_5gs.mm.5gmm_cause") is not None \
            and psi is not None:
        book.get(owner, psi)  # a 5GSM message returned unforwarded still names its session
    if not sm or psi is None:
        return
    if len(sm) > 1:
        raise OracleCannotTell(f"frame {row.frame}: several 5GSM messages in one PDU")
    s = book.get(owner, psi, new=sm[0] == SM_REQUEST)
    if sm[0] == SM_REQUEST:
        s.requested, s.dnn = True, single(row, "nas_5gs.cmn.dnn")
    elif sm[0] == SM_ACCEPT:
        s.ue_ipv4 = single(row, "nas_5gs.sm.pdu_addr_inf_ipv4")
        s.dnn = single(row, "nas_5gs.cmn.dnn") or s.dnn
    elif sm[0] in SM_RELEASE_FRAMES:
        release = s.release = s.release or {}
        release[SM_RELEASE_FRAMES[sm[0]]] = row.frame
        cause = row.one("nas_5gs.sm.5gsm_cause")
        if cause is not None:
            release.update(cause=cause, cause_text=value_names("nas_5gs.sm.5gsm_cause").get(cause),
                           normal=cause in NORMAL_5GSM)
    sst, sd = single(row, "nas_5gs.mm.sst"), single(row, "nas_5gs.mm.mm_sd")
    if sst is not None and s.s_nssai is None:
        s.s_nssai = {"sst": f"{int(sst, 0):02x}", "sd": f"{int(sd, 0):06x}" if sd is not None else None}


def _n2(book: _Book, row: Row, owner: UeKey, psi: int) -> None:
    if row.pdu_type == 0:
        s = book.get(owner, psi)
        if s.setup_request and s.setup_answered:
            return  # a later user-plane activation of an established session
        s.setup_request = True
        s.n3_uplink = tunnel(row)
        s.qfis = sorted(set(row.ints("ngap.qosFlowIdentifier")))
        if single(row, "ngap.sST") is not None:
            s.s_nssai = {"sst": single(row, "ngap.sST"), "sd": single(row, "ngap.sD")}
        return
    found = book.existing(owner, psi)
    if found is None or not found.setup_request or found.setup_answered:
        return  # answers no request seen in the capture
    found.setup_answered = True
    if any(row.ints(name) for name in SETUP_OK_LISTS):
        found.n3_downlink = tunnel(row)
