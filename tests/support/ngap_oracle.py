"""A second, independent answer to the NGAP summary tools, from `tshark -T fields` alone.

It shares no code with diagd.actors._pcap_ngap: it reads tshark's field rows (not sharkd's
trees), names causes by their codes (not Wireshark's labels), and keys contexts its own simple
way. Bundled SCTP chunks are first split one per frame (tests/support/pcapedit) so each row is
one NGAP PDU; frame numbers are mapped back to the original capture's. Whatever it cannot read
unambiguously from one row (two RAN ids, two 5GSM messages, ...) makes it raise instead of guess.

The rules it applies are the ones docs/5g.md states for the tools: a UE context is (SCTP
association, AMF-UE-NGAP-ID, RAN-UE-NGAP-ID), live from its first PDU until UEContextReleaseComplete,
an InitialUEMessage with its RAN id, or a PDU pairing one of its ids with another (later PDUs with
those ids are a new context, the n-th of that pair); a PathSwitchRequest's SourceAMF-UE-NGAP-ID
(told by its IE id) names the source context, not its own; failures are reject/failure/status NAS messages,
NGAP unsuccessful outcomes, ErrorIndication / NAS non-delivery, failed PDU session setups,
releases with an abnormal cause, and class-1 requests unanswered although the association went on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, TypeVar

from tests.support import pcap_oracle
from tests.support.capture_identity import content_id
from tests.support.pcapedit import PCAP_MAGICS, split_sctp_bundles

FIELDS = [
    "frame.number", "frame.time_epoch", "ip.src", "sctp.srcport", "ip.dst", "sctp.dstport", "sctp.assoc_index",
    "ngap.procedureCode", "ngap.NGAP_PDU", "ngap.RAN_UE_NGAP_ID", "ngap.AMF_UE_NGAP_ID", "ngap.Cause",
    "ngap.radioNetwork", "ngap.transport", "ngap.nas", "ngap.protocol", "ngap.misc",
    "nas_5gs.mm.message_type", "nas_5gs.sm.message_type", "nas_5gs.mm.5gmm_cause", "nas_5gs.sm.5gsm_cause",
    "nas_5gs.pdu_session_id", "ngap.pDUSessionID", "ngap.PDUSessionResourceSetupListSURes",
    "ngap.PDUSessionResourceSetupListCxtRes", "ngap.PDUSessionResourceFailedToSetupListSURes",
    "ngap.PDUSessionResourceFailedToSetupListCxtRes", "nas_5gs.mm.suci.msin", "e212.mcc", "e212.mnc",
    "nas_5gs.mm.switch_off",
    # read by the field-level and links oracles (tests/support/ngap_fields_oracle.py, ngap_links_oracle.py)
    "nas_5gs.5g_tmsi", "ngap.fiveG_TMSI", "ngap.sST", "ngap.sD", "nas_5gs.mm.sst", "nas_5gs.mm.mm_sd",
    "ngap.TransportLayerAddressIPv4", "ngap.gTP_TEID", "nas_5gs.cmn.dnn", "nas_5gs.sm.pdu_addr_inf_ipv4",
    "ngap.qosFlowIdentifier", "ngap.SourceToTarget_TransparentContainer",
    "ngap.id",  # the IE ids in order: which AMF-UE-NGAP-ID is a PathSwitchRequest's SourceAMF-UE-NGAP-ID
    # N3 tunnels: each address's raw bits (32, 128 or 160), and how many tunnels each tunnel list holds
    "ngap.transportLayerAddress", "ngap.UPTransportLayerInformationList", "ngap.additionalDLQosFlowPerTNLInformation",
    # read by the procedures oracle: 5G-S-TMSIs (a PAGING's, an InitialUEMessage's, a NAS 5GS mobile identity's) and
    # the NAS-PDU IE (a NAS NON DELIVERY INDICATION returns a DownlinkNASTransport's)
    "ngap.aMFSetID", "ngap.aMFPointer", "nas_5gs.amf_set_id", "nas_5gs.amf_pointer", "ngap.NAS_PDU",
]
CAUSE_GROUPS = ["ngap.radioNetwork", "ngap.transport", "ngap.nas", "ngap.protocol", "ngap.misc"]
# TS 38.413 cause values that end things normally, by ASN.1 enumeration index (group: values).
NORMAL_NGAP = {"ngap.radioNetwork": {2, 3, 4, 20, 31, 32, 33, 35, 36, 41, 44}, "ngap.nas": {0, 2}, "ngap.misc": {3}}
CLASS1 = {0, 10, 12, 13, 14, 20, 21, 25, 26, 27, 28, 29, 32, 35, 40, 41, 43, 51, 58, 59, 60, *range(66, 74)}
MM_FAILURES = {0x44, 0x4D, 0x58, 0x59, 0x5F, 0x64}
SM_FAILURES = {0xC3, 0xCA, 0xCD, 0xD2, 0xD6}
SM_RELEASES = {0xD1, 0xD3}
NORMAL_5GSM = {36, 39}

# TS 38.413 procedure codes and IE ids the context rule reads.
INITIAL_UE_MESSAGE, NG_RESET, PATH_SWITCH, UE_CONTEXT_MODIFICATION, UE_CONTEXT_RELEASE = 15, 20, 25, 40, 41
NAS_NON_DELIVERY = 19
IE_AMF_UE_NGAP_ID, IE_NEW_AMF_UE_NGAP_ID, IE_SOURCE_AMF_UE_NGAP_ID = 10, 40, 100
MM_DL_NAS_TRANSPORT, MM_REGISTRATION_REQUEST = 0x68, 0x41
MM_REGISTRATION_ENDS = {0x42, 0x44}  # Registration Accept / Reject
CACHE = Path(os.environ.get("DIAGD_TEST_TREE_CACHE", Path(tempfile.gettempdir()) / f"diagd-trees-{os.getuid()}"))

Assoc = tuple[str, str, int]
# endpoints, assoc index, AMF id, RAN id, n: the n-th context of that association and id pair (ids reused)
UeKey = tuple[str, str, int, int | None, int | None, int]
T = TypeVar("T")


class Failure(NamedTuple):
    """One failure as docs/5g.md defines it: where, which layer, the cause code and name, and why."""

    frame: int
    kind: str  # NGAP, 5GMM, 5GSM
    code: int | None
    cause: str | None
    why: str
    by: str  # the NAS message or NGAP procedure that reported it


class OracleCannotTell(AssertionError):
    """A row this simple reader cannot split into one PDU's facts."""


@dataclass
class Row:
    frame: int
    time: float
    assoc: Assoc
    proc: int
    pdu_type: int
    ran: int | None
    amf: int | None
    values: dict[str, list[str]]
    source_amf: int | None = None  # PathSwitchRequest: the SourceAMF-UE-NGAP-ID (the source context's)
    new_amf: int | None = None  # UEContextModificationRequest: the New AMF UE NGAP ID its context takes on

    def ints(self, name: str) -> list[int]:
        return [int(v, 0) for v in self.values.get(name, [])]

    def one(self, name: str) -> int | None:
        got = sorted(set(self.ints(name)))
        if len(got) > 1:
            raise OracleCannotTell(f"frame {self.frame}: {name} has several values {got}")
        return got[0] if got else None


@dataclass
class Answer:
    ngap_pdus: int
    associations: set[Assoc]
    ues: set[UeKey]
    failures: dict[UeKey, list[Failure]]
    established: set[tuple[UeKey, int, int]]  # (ue, psi, accept frame)
    rejected: set[tuple[UeKey, int, int]]  # (ue, psi, frame of the reject / failed setup)
    accepts_in_n2_setup: int
    suci_groups: list[set[UeKey]] = field(default_factory=list)
    non_ue_failures: dict[Assoc, list[Failure]] = field(default_factory=dict)
    open_requests: list[tuple[UeKey | None, Assoc, int, str]] = field(default_factory=list)  # (UE, assoc, frame, proc)


@functools.cache
def value_names(name: str) -> dict[int, str]:
    """{value: name} of a field's value string, as `tshark -G values` lists it."""
    def compute() -> str:  # the whole glossary is 90 MB: only this field's pairs are kept, in tshark's order
        out = subprocess.run(["tshark", "-G", "values"], check=True, capture_output=True, text=True).stdout
        names = {}
        for line in out.splitlines():
            cells = line.split("\t")
            if len(cells) == 4 and cells[0] == "V" and cells[1] == name:
                names[int(cells[2], 0)] = cells[3]
        return json.dumps(list(names.items()))
    key = ["tshark", "-G", "values", f"V lines of {name}", pcap_oracle.config_key()]
    return {value: label for value, label in json.loads(pcap_oracle.cached_tool_text(key, compute))}


def procedure(code: int) -> str:
    """An NGAP procedure's name as TS 38.413 spells it (Wireshark's `id-` prefix dropped)."""
    return value_names("ngap.procedureCode")[code].removeprefix("id-")


def message_name(layer: str, code: int) -> str:
    return value_names("nas_5gs.mm.message_type" if layer == "5GMM" else "nas_5gs.sm.message_type")[code]


def cause_name(field_name: str, code: int | None) -> str | None:
    """The name Wireshark gives a cause code (a code it has no name for prints as "Unknown")."""
    return None if code is None else value_names(field_name).get(code, "Unknown")


def disk_cached(path: Path, kind: str, compute: Callable[[Path], T]) -> T:
    """compute(path), kept on disk per capture and oracle source (the mutation gate asks it often)."""
    support = Path(__file__).parent
    key = hashlib.sha256(repr((content_id(path),
                               *(f.read_bytes() for f in sorted(support.glob("*oracle.py"))),
                               (support / "pcapedit.py").read_bytes())).encode()).hexdigest()[:24]
    cached = CACHE / f"{path.name}.{key}.{kind}.pickle"
    if cached.exists():
        found: T = pickle.loads(cached.read_bytes())
        return found
    found = compute(path)
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(pickle.dumps(found))
    tmp.replace(cached)
    return found


def tshark_rows(path: Path, tmp: Path) -> list[Row]:
    options = ["-n", "-o", "nas-5gs.null_decipher:TRUE", "-o", "sctp.association_index:TRUE", "-Y", "ngap && sctp",
               "-T", "fields", "-E", "separator=\t", "-E", "occurrence=a", "-E", "aggregator=,"]
    for name in FIELDS:
        options += ["-e", name]

    def run() -> str:  # tshark's rows of the split capture and the split's frame map, kept on disk
        pcap = path
        if path.read_bytes()[:4] not in PCAP_MAGICS:
            pcap = tmp / f"{path.stem}.classic.pcap"
            subprocess.run(["editcap", "-F", "pcap", str(path), str(pcap)], check=True, capture_output=True)
        split, origin = split_sctp_bundles(bytearray(pcap.read_bytes()))
        split_path = tmp / f"{path.stem}.split.pcap"
        split_path.write_bytes(bytes(split))
        out = subprocess.run(["tshark", "-r", str(split_path), *options], check=True, capture_output=True,
                             text=True).stdout
        return json.dumps([out, origin])
    # The key: the capture, how it is split (editcap to classic pcap if need be, then pcapedit's code), the options.
    split_by = hashlib.sha256((Path(__file__).parent / "pcapedit.py").read_bytes()).hexdigest()[:16]
    key = ["editcap", "-F", "pcap", str(path), "|", f"split_sctp_bundles {split_by}", "|", "tshark", "-r", "<split>",
           *options, pcap_oracle.config_key()]
    out, origin = json.loads(pcap_oracle.cached_text(path, key, run))
    rows = []
    for line in out.splitlines():
        cells = dict(zip(FIELDS, line.split("\t"), strict=True))
        values = {k: v.split(",") for k, v in cells.items() if v}
        if len(values.get("ngap.procedureCode", [])) != 1:
            raise OracleCannotTell(f"split frame {cells['frame.number']} still holds several NGAP PDUs")
        ends = sorted((f"{cells['ip.src']}:{cells['sctp.srcport']}", f"{cells['ip.dst']}:{cells['sctp.dstport']}"))
        row = Row(frame=origin[int(cells["frame.number"]) - 1], time=float(cells["frame.time_epoch"]),
                  assoc=(ends[0], ends[1], int(cells["sctp.assoc_index"])),
                  proc=int(cells["ngap.procedureCode"]), pdu_type=int(cells["ngap.NGAP_PDU"]),
                  ran=None, amf=None, values=values)
        if row.proc == NAS_NON_DELIVERY:
            # TS 38.413 8.6.4 / 9.2.5.5: its NAS-PDU is the downlink one the NG-RAN node could not deliver, returned
            # as it was sent: none of its NAS is a message of this PDU.
            row.values = {k: v for k, v in values.items() if not k.startswith(("nas_5gs.", "e212."))}
        if row.proc == NG_RESET:  # not UE-associated: its ids are the items of the list it resets
            rows.append(row)
            continue
        ies = row.ints("ngap.id")
        if IE_SOURCE_AMF_UE_NGAP_ID in ies:
            # TS 38.413 9.2.3.8: a PathSwitchRequest carries RAN-UE-NGAP-ID and SourceAMF-UE-NGAP-ID, whose type
            # is AMF-UE-NGAP-ID (tshark's one field for both); with no other AMF id IE, the one value is the source's.
            amf_values = row.ints("ngap.AMF_UE_NGAP_ID")
            if (row.proc, row.pdu_type) != (PATH_SWITCH, 0) or IE_AMF_UE_NGAP_ID in ies or len(amf_values) != 1:
                raise OracleCannotTell(f"frame {row.frame}: SourceAMF-UE-NGAP-ID (IE 100) in procedure {row.proc} "
                                       f"with IEs {ies} and AMF-UE-NGAP-ID values {amf_values}: which is which")
            row.ran, row.source_amf = row.one("ngap.RAN_UE_NGAP_ID"), amf_values[0]
        elif IE_NEW_AMF_UE_NGAP_ID in ies:
            # TS 38.413 9.2.2.7: AMF-UE-NGAP-ID (IE 10), then New AMF UE NGAP ID (IE 40): tshark lists both values
            # under the one field, in the order of their IEs.
            amf_values = row.ints("ngap.AMF_UE_NGAP_ID")
            order = [i for i in ies if i in (IE_AMF_UE_NGAP_ID, IE_NEW_AMF_UE_NGAP_ID)]
            if (row.proc, row.pdu_type) != (UE_CONTEXT_MODIFICATION, 0) or order != [10, 40] or len(amf_values) != 2:
                raise OracleCannotTell(f"frame {row.frame}: New AMF UE NGAP ID (IE 40) in procedure {row.proc} "
                                       f"with IEs {ies} and AMF-UE-NGAP-ID values {amf_values}: which is which")
            row.ran, (row.amf, row.new_amf) = row.one("ngap.RAN_UE_NGAP_ID"), amf_values
        else:
            row.ran, row.amf = row.one("ngap.RAN_UE_NGAP_ID"), row.one("ngap.AMF_UE_NGAP_ID")
        rows.append(row)
    return rows


def owned_rows(path: Path) -> tuple[list[Row], list[UeKey | None]]:
    """Every NGAP PDU's row, and the UE context each belongs to (None: not UE-associated)."""
    rows, owners, _ = contexts(path)
    return rows, owners


@dataclass
class _Context:
    """One UE context while the rows are read: the ids it has shown so far (AMF ids in the order it took them on),
    and what ended it."""

    assoc: Assoc
    ran: int | None
    amfs: list[int]
    ended: str | None = None


def contexts(path: Path) -> tuple[list[Row], list[UeKey | None], dict[UeKey, str | None]]:
    """The rows, each row's UE context, and how each context ended (None: still live at the capture's end).

    docs/5g.md: a context is (association, AMF id, RAN id) and ends with UEContextReleaseComplete, a new
    InitialUEMessage with its RAN id, or a PDU pairing one of its ids with another id than its own; later
    PDUs with those ids start a new context, keyed as the n-th of its pair (by its first AMF id). A PDU carrying
    one id, or an id its context has not shown yet, joins the live context showing the other; a New AMF UE NGAP
    ID (UEContextModificationRequest) is one more AMF id of the context it names. (An NGReset also ends the
    contexts it covers: not applied here; tests/support/ngap_links_oracle.py refuses such captures.)
    """
    with tempfile.TemporaryDirectory(prefix="ngap-oracle-") as tmp:
        rows = tshark_rows(path, Path(tmp))
    made: list[_Context] = []
    live: dict[Assoc, list[_Context]] = {}
    mine: list[_Context | None] = []

    def end(ctx: _Context, why: str) -> None:
        ctx.ended = ctx.ended or why
        live[ctx.assoc].remove(ctx)

    for row in rows:
        if row.ran is None and row.amf is None:
            mine.append(None)
            continue
        here = live.setdefault(row.assoc, [])
        if row.proc == INITIAL_UE_MESSAGE and row.pdu_type == 0:
            if row.amf is not None:
                raise OracleCannotTell(f"frame {row.frame}: an InitialUEMessage with an AMF-UE-NGAP-ID")
            for old in [c for c in here if c.ran == row.ran]:
                end(old, f"RAN-UE-NGAP-ID reused by InitialUEMessage in frame {row.frame}")
            owner = None
        else:
            named = [c for c in here if (row.ran is not None and c.ran == row.ran) or row.amf in c.amfs]
            fitting = [c for c in named if _agree(row.ran, c.ran) and (row.amf is None or row.amf in c.amfs
                                                                          or not c.amfs)]
            if len(fitting) > 1:
                raise OracleCannotTell(f"frame {row.frame}: its RAN id {row.ran} and AMF id {row.amf} each fit "
                                       "another live context (one without an AMF id, one without a RAN id)")
            owner = fitting[0] if fitting else None
            for old in named:
                if old is not owner:
                    end(old, f"ids reused by a different UE in frame {row.frame}")
        if owner is None:
            owner = _Context(row.assoc, row.ran, [])
            made.append(owner)
            here.append(owner)
        owner.ran = owner.ran if owner.ran is not None else row.ran
        for amf in (row.amf, row.new_amf):
            if amf is not None and amf not in owner.amfs:
                if any(amf in c.amfs for c in here):
                    raise OracleCannotTell(f"frame {row.frame}: New AMF UE NGAP ID {amf} is another live context's")
                owner.amfs.append(amf)
        mine.append(owner)
        if row.proc == UE_CONTEXT_RELEASE and row.pdu_type == 1:
            end(owner, f"UEContextReleaseComplete in frame {row.frame}")
    keys: dict[int, UeKey] = {}
    uses: dict[tuple[Assoc, int | None, int | None], int] = {}
    for ctx in made:  # numbered in the order they started
        pair = (ctx.assoc, ctx.amfs[0] if ctx.amfs else None, ctx.ran)
        uses[pair] = uses.get(pair, 0) + 1
        keys[id(ctx)] = (*pair[0], pair[1], pair[2], uses[pair])
    return rows, [None if c is None else keys[id(c)] for c in mine], {keys[id(c)]: c.ended for c in made}


def _agree(shown: int | None, known: int | None) -> bool:
    """A PDU's id agrees with a context's when either is absent or they are equal."""
    return shown is None or known is None or shown == known


def answer(path: Path) -> Answer:
    return disk_cached(path, "answer", _answer)


def in_order(failure: Failure) -> tuple[int, str]:
    """Capture order (then a fixed order among one frame's failures)."""
    return failure.frame, repr(failure)


def _row_failures(row: Row) -> list[Failure]:
    """The failures one PDU reports, with the cause name tshark gives its code and the reason docs/5g.md names."""
    found: list[Failure] = []
    ngap_codes = [(g, int(v)) for g in CAUSE_GROUPS for v in row.values.get(g, [])]
    proc = procedure(row.proc)

    def ngap(group_code: tuple[str, int] | None, why: str) -> Failure:
        group, code = group_code or ("", None)
        return Failure(row.frame, "NGAP", code, cause_name(group, code), why, proc)

    if row.pdu_type == 2:
        found.append(ngap(ngap_codes[0] if ngap_codes else None, f"{proc} failed (unsuccessfulOutcome)"))
    elif row.proc in (9, 19):
        found.append(ngap(ngap_codes[0] if ngap_codes else None, proc))
    elif row.proc in (41, 42, 28) and row.pdu_type == 0:
        found += [ngap((g, v), f"abnormal release cause in {proc}") for g, v in ngap_codes
                  if v not in NORMAL_NGAP.get(g, set())]
    failed_items = sum(row.ints("ngap.PDUSessionResourceFailedToSetupListSURes")
                       + row.ints("ngap.PDUSessionResourceFailedToSetupListCxtRes"))
    if failed_items:
        if failed_items > 1 or len(ngap_codes) > 1:
            raise OracleCannotTell(f"frame {row.frame}: several failed PDU session items")
        found.append(ngap(ngap_codes[0] if ngap_codes else None,
                          f"PDU session {row.one('ngap.pDUSessionID')}: setup failed in {proc}"))
    mm, sm = row.ints("nas_5gs.mm.message_type"), row.ints("nas_5gs.sm.message_type")
    mm_cause, sm_cause = row.one("nas_5gs.mm.5gmm_cause"), row.one("nas_5gs.sm.5gsm_cause")
    mm_failed = [t for t in mm if t in MM_FAILURES or (t == MM_DL_NAS_TRANSPORT and mm_cause is not None)]
    if len(mm_failed) > 1 or len(sm) > 1:
        raise OracleCannotTell(f"frame {row.frame}: several NAS failures in one PDU")
    mm_name = cause_name("nas_5gs.mm.5gmm_cause", mm_cause)
    found += [Failure(row.frame, "5GMM", mm_cause, mm_name, message_name("5GMM", t) if t != MM_DL_NAS_TRANSPORT
                      else "the AMF returned an unforwarded 5GSM message (DL NAS transport with a 5GMM cause)",
                      message_name("5GMM", t)) for t in mm_failed]
    sm_name = cause_name("nas_5gs.sm.5gsm_cause", sm_cause)
    found += [Failure(row.frame, "5GSM", sm_cause, sm_name, message_name("5GSM", t), message_name("5GSM", t))
              for t in sm if t in SM_FAILURES]
    found += [Failure(row.frame, "5GSM", sm_cause, sm_name, f"abnormal cause in {message_name('5GSM', t)}",
                      message_name("5GSM", t))
              for t in sm if t in SM_RELEASES and sm_cause is not None and sm_cause not in NORMAL_5GSM]
    return found


def _answer(path: Path) -> Answer:
    rows, owners = owned_rows(path)
    ues = {u for u in owners if u is not None}
    last = {row.assoc: row for row in rows}
    failures: dict[UeKey, list[Failure]] = {u: [] for u in ues}
    non_ue: dict[Assoc, list[Failure]] = {}
    pending: dict[tuple[UeKey | None, Assoc, int], list[Row]] = {}  # class-1 requests of a context / association
    waiting_registration: dict[UeKey, Row] = {}
    for row, owner in zip(rows, owners, strict=True):
        found = _row_failures(row)
        if owner is None:
            non_ue.setdefault(row.assoc, []).extend(found)
        else:
            failures[owner] += found
        if row.proc in CLASS1:
            if row.pdu_type == 0:
                pending.setdefault((owner, row.assoc, row.proc), []).append(row)
            elif pending.get((owner, row.assoc, row.proc)):
                pending[(owner, row.assoc, row.proc)].pop(0)
        mm = row.ints("nas_5gs.mm.message_type")
        if owner is not None and MM_REGISTRATION_REQUEST in mm:
            waiting_registration[owner] = row
        if owner is not None and MM_REGISTRATION_ENDS & set(mm):
            waiting_registration.pop(owner, None)
    open_requests: list[tuple[UeKey | None, Assoc, int, str]] = []  # at the capture's end: not failures
    for (owner, _assoc, proc), requests in pending.items():
        for row in requests:
            end = last[row.assoc]
            if end.frame > row.frame:
                why = (f"no response to {procedure(proc)} request (the association carried NGAP until frame "
                       f"{end.frame}, {round(end.time - row.time, 6)} s later)")
                got = Failure(row.frame, "NGAP", None, None, why, procedure(proc))
                if owner is not None:
                    failures[owner].append(got)
                else:
                    non_ue.setdefault(row.assoc, []).append(got)
            else:
                open_requests.append((owner, row.assoc, row.frame, procedure(proc)))
    for owner, row in waiting_registration.items():
        if last[row.assoc].frame > row.frame:
            failures[owner].append(Failure(row.frame, "5GMM", None, None, "registration request never accepted or "
                                           "rejected (the association carried later NGAP)",
                                           message_name("5GMM", MM_REGISTRATION_REQUEST)))
    established, rejected, accepts_in_n2 = _sessions(rows, owners)
    return Answer(ngap_pdus=len(rows), associations={r.assoc for r in rows}, ues=ues,
                  failures={u: sorted(f, key=in_order) for u, f in failures.items()}, established=established,
                  rejected=rejected, accepts_in_n2_setup=accepts_in_n2, suci_groups=_suci_groups(rows, owners),
                  non_ue_failures={a: sorted(f, key=in_order) for a, f in non_ue.items() if f},
                  open_requests=open_requests)


def _sessions(rows: list[Row], owners: list[UeKey | None]
              ) -> tuple[set[tuple[UeKey, int, int]], set[tuple[UeKey, int, int]], int]:
    current: dict[tuple[UeKey, int], dict[str, int | None]] = {}
    every: list[tuple[UeKey, int, dict[str, int | None]]] = []
    accepts_in_n2 = 0

    def get(owner: UeKey, psi: int, new: bool) -> dict[str, int | None]:
        if new or (owner, psi) not in current:
            current[(owner, psi)] = {"accept": None, "n2": None, "setup_req": None, "setup": None, "reject": None}
            every.append((owner, psi, current[(owner, psi)]))
        return current[(owner, psi)]

    for row, owner in zip(rows, owners, strict=True):
        if owner is None:
            continue
        sm, mm = row.ints("nas_5gs.sm.message_type"), row.ints("nas_5gs.mm.message_type")
        psi = row.one("nas_5gs.pdu_session_id")
        if 0x68 in mm and row.one("nas_5gs.mm.5gmm_cause") is not None and psi is not None:
            # Returned unforwarded by the AMF: the 5GSM message it carries is the UE's own (TS 24.501 5.4.5.2.5).
            get(owner, psi, new=False)["reject"] = row.frame
        elif sm and psi is not None:
            s = get(owner, psi, new=0xC1 in sm)
            if 0xC2 in sm:
                s["accept"] = row.frame
                if row.proc in (29, 14) and row.pdu_type == 0:
                    s["n2"] = 1
                    accepts_in_n2 += 1
            if 0xC3 in sm:
                s["reject"] = row.frame
        n2_psis = sorted(set(row.ints("ngap.pDUSessionID")))
        if row.proc in (29, 14) and n2_psis:
            if len(n2_psis) > 1:
                raise OracleCannotTell(f"frame {row.frame}: several PDU sessions in one N2 setup")
            s = get(owner, n2_psis[0], new=False)
            if row.pdu_type == 0 and not (s["setup_req"] and s["setup"]):
                s["setup_req"] = row.frame
            elif row.pdu_type != 0 and s["setup_req"] is not None and s["setup"] is None:
                ok = row.ints("ngap.PDUSessionResourceSetupListSURes") + row.ints(
                    "ngap.PDUSessionResourceSetupListCxtRes")
                s["setup"] = row.frame if ok else -row.frame  # negative: failed to set up
    established = {(o, p, int(s["accept"])) for o, p, s in every
                   if s["accept"] and s["n2"] and s["setup"] and s["setup"] > 0 and not s["reject"]}
    rejected = {(o, p, int(s["reject"] or -int(s["setup"] or 0))) for o, p, s in every
                if s["reject"] or (s["setup"] is not None and s["setup"] < 0)}
    return established, rejected, accepts_in_n2


def _suci_groups(rows: list[Row], owners: list[UeKey | None]) -> list[set[UeKey]]:
    """Contexts sharing a SUCI (MSIN + MCC + MNC), as connected groups of two or more."""
    by_suci: dict[tuple[str, ...], set[UeKey]] = {}
    for row, owner in zip(rows, owners, strict=True):
        msins = set(row.values.get("nas_5gs.mm.suci.msin", []))
        if owner is None or not msins:
            continue
        if len(msins) > 1:
            raise OracleCannotTell(f"frame {row.frame}: several SUCIs")
        suci = (msins.pop(), *row.values.get("e212.mcc", [])[:1], *row.values.get("e212.mnc", [])[:1])
        by_suci.setdefault(suci, set()).add(owner)
    groups: list[set[UeKey]] = []
    for members in by_suci.values():
        joined = [g for g in groups if g & members]
        merged = set(members).union(*joined)
        groups = [g for g in groups if not g & members] + [merged]
    return [g for g in groups if len(g) > 1]
