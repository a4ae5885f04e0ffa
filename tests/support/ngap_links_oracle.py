"""The NG associations, UE contexts and 5G-TMSI links of `ngap_ue_sessions`, a second time from `tshark -T fields`.

It builds on the rows and context keys of tests/support/ngap_oracle.py (one row per NGAP PDU,
bundles split) and never imports diagd. What it computes is what docs/5g.md states:

- per association (numbered A1, A2, ... in the order their first PDU comes): its first frame, its
  NGAP PDU count, the AMF side (the endpoint on SCTP port 38412, TS 38.412) and the gNB side, and the
  PDUs of no UE context (frame, procedure, code, PDU type) in capture order;
- per UE context: its AMF ids (a New AMF UE NGAP ID adds one), its label
  `A<n>/amf-<AMF-UE-NGAP-ID>/ran-<RAN-UE-NGAP-ID>`, with `#<n>` for the n-th context of one association
  and id pair (n > 1), its PDUs (same four values) and how it ended, as
  tests/support/ngap_oracle.contexts decides: UEContextReleaseComplete, its RAN id reused by an
  InitialUEMessage, or its ids reused in another pair; or an NGReset of its association naming its AMF or
  RAN id, or of the whole interface, before that (the oracle raises on ids used again after an NGReset
  ended their context);
- the number of contexts without an InitialUEMessage, and of security-protected NAS PDUs that did not
  decode into a plain message (the warnings that say so);
- 5G-TMSI evidence, in capture order: a value assigned in one context (Registration Accept or
  Configuration Update Command) and presented later in another (any other NAS message with a
  5G-TMSI, or the NGAP FiveG-S-TMSI of a UE-associated PDU) links them; a value presented twice and
  never assigned before is refused;
- handover evidence: the same SourceToTarget-TransparentContainer in a HandoverRequired and a later
  HandoverRequest links their contexts;
- path switch evidence: a PathSwitchRequest's SourceAMF-UE-NGAP-ID links its context to the source: the
  context, on another association whose AMF side has the same IP address, that showed that AMF id and
  started last at or before the request's frame.
Contexts that identified with different SUCIs are never linked.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.ngap_oracle import Assoc, OracleCannotTell, UeKey, contexts, disk_cached, procedure, value_names

NGAP_PORT = ":38412"
TMSI_ASSIGNERS = {0x42, 0x54}  # Registration Accept, Configuration Update Command
INITIAL_UE_MESSAGE, NG_RESET, PATH_SWITCH_REQUEST = 15, 20, 25
HANDOVER_REQUIRED, HANDOVER_REQUEST = 12, 13  # procedure codes: HandoverPreparation, HandoverResourceAllocation
HANDOVER = "handover: the same SourceToTarget-TransparentContainer in HandoverRequired and HandoverRequest"
PATH_SWITCH = "path switch: SourceAMF-UE-NGAP-ID names the source context"


Link = tuple[str, str, str, tuple[int, ...]]  # UE label, label of the context it is linked to, evidence, frames
Refusal = tuple[str, str, str, tuple[int, ...], str]  # UE label, label it is not linked to, evidence, frames, why


@dataclass
class Structure:
    associations: dict[Assoc, dict[str, Any]]
    ues: dict[UeKey, dict[str, Any]]
    headless: int  # contexts with no InitialUEMessage
    links: set[Link] = field(default_factory=set)  # every pair the 5G-TMSI and handover rules link
    groups: list[set[str]] = field(default_factory=list)  # labels joined by the same SUCI or a link
    refused: set[Refusal] = field(default_factory=set)  # evidence refused, between contexts not joined
    listed: list[Link] = field(default_factory=list)  # the links listed: those joining contexts not yet joined
    undecoded: int = 0  # security-protected NAS PDUs with no plain message inside


def answer(path: Path) -> Structure:
    return disk_cached(path, "links", _answer)


def _answer(path: Path) -> Structure:
    rows, owners, ended = contexts(path)
    types = value_names("ngap.NGAP_PDU")
    associations: dict[Assoc, dict[str, Any]] = {}
    ues: dict[UeKey, dict[str, Any]] = {}
    sucis: dict[UeKey, set[str]] = {}
    for row, owner in zip(rows, owners, strict=True):
        a = associations.get(row.assoc)
        if a is None:
            amf_side = [end for end in row.assoc[:2] if end.endswith(NGAP_PORT)]
            if len(amf_side) != 1:
                raise OracleCannotTell(f"association {row.assoc}: not exactly one endpoint on port 38412")
            gnb = next(end for end in row.assoc[:2] if end != amf_side[0])
            a = associations[row.assoc] = {"label": f"A{len(associations) + 1}", "first_frame": row.frame,
                                           "ngap_pdus": 0, "amf": amf_side[0], "gnb": gnb, "procedures": []}
        a["ngap_pdus"] += 1
        step = (row.frame, procedure(row.proc), row.proc, types[row.pdu_type])
        if owner is None:
            a["procedures"].append(step)
            if row.proc == NG_RESET and row.pdu_type == 0:
                _reset(path, row, ues)
            continue
        reused = f"#{owner[5]}" if owner[5] > 1 else ""
        ue = ues.setdefault(owner, {"label": f"{a['label']}/amf-{_show(owner[3])}/ran-{_show(owner[4])}{reused}",
                                    "procedures": [], "ended": ended[owner], "amf_ids": [], "initial": False})
        if (ue["ended"] or "").startswith("NGReset"):
            raise OracleCannotTell(f"frame {row.frame}: ids of a context an NGReset ended are used again")
        ue["procedures"].append(step)
        ue["amf_ids"] += [i for i in (row.amf, row.new_amf) if i is not None and i not in ue["amf_ids"]]
        ue["initial"] = ue["initial"] or row.proc == INITIAL_UE_MESSAGE
        sucis.setdefault(owner, set()).update(_sucis(row))
    headless = sum(1 for u in ues.values() if not u.pop("initial"))
    label = {k: u["label"] for k, u in ues.items()}
    amf_sides = {a: x["amf"] for a, x in associations.items()}
    switches = {frames[0]: (source, target) for source, target, frames
                in _path_switches(rows, owners, amf_sides, {k: u["amf_ids"] for k, u in ues.items()})}
    links, refused, listed = _evidence(rows, owners, sucis, label, switches)
    edges = [(label[x], label[y]) for x in ues for y in ues if x != y and sucis.get(x, set()) & sucis.get(y, set())]
    groups = _components(edges + [(x, y) for y, x, _, _ in links])
    joined = {x: n for n, g in enumerate(groups) for x in g}
    kept = {r for r in refused if joined.get(r[0], -1) != joined.get(r[1], -2)}
    return Structure(associations, ues, headless, links, groups, kept, listed, _undecoded(path))


def _undecoded(path: Path) -> int:
    """Security-protected NAS PDUs that did not decode into a plain message (null_decipher on, as diagd reads).

    tshark lists each NAS-PDU's security header type, the protected one's outer value (1-4) and then its
    plain message's own (0): a non-zero value not followed by a 0 is a protected PDU with nothing decoded
    inside. (5GSM messages nested in a NAS transport have no security header type.)"""
    out = subprocess.run(["tshark", "-r", str(path), "-n", "-o", "nas-5gs.null_decipher:TRUE", "-Y", "ngap && nas-5gs",
                          "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=,",
                          "-e", "nas_5gs.security_header_type"], check=True, capture_output=True, text=True).stdout
    count = 0
    for line in out.split():
        types = line.split(",")
        count += sum(1 for n, t in enumerate(types) if t != "0" and types[n + 1:n + 2] != ["0"])
    return count


def _reset(path: Path, row: Any, ues: dict[UeKey, dict[str, Any]]) -> None:
    """An NGReset ends the contexts it covers on its association (TS 38.413 8.7.4): all of them (ResetType
    nG-Interface), or those whose AMF-UE-NGAP-ID or RAN-UE-NGAP-ID its partOfNG-Interface list names."""
    out = subprocess.run(["tshark", "-r", str(path), "-n", "-Y", f"frame.number == {row.frame}", "-T", "fields",
                          "-E", "occurrence=a", "-E", "aggregator=,", "-e", "ngap.ResetType"],
                         check=True, capture_output=True, text=True).stdout.split()
    if len(out) != 1 or out[0] not in ("0", "1"):
        raise OracleCannotTell(f"frame {row.frame}: not one NGReset with one ResetType ({out})")
    whole = out[0] == "0"
    amfs = {int(v) for v in row.values.get("ngap.AMF_UE_NGAP_ID", [])}
    rans = {int(v) for v in row.values.get("ngap.RAN_UE_NGAP_ID", [])}
    for key, ue in ues.items():
        if key[:3] != row.assoc or _ended_before(ue["ended"], row.frame):
            continue
        if whole:
            ue["ended"] = f"NGReset (whole interface) in frame {row.frame}"
        elif key[3] in amfs or key[4] in rans:
            ue["ended"] = f"NGReset in frame {row.frame}"


def _ended_before(ended: str | None, frame: int) -> bool:
    """Whether a context's end (ngap_oracle.contexts' words, "... in frame N") came before `frame`."""
    found = re.search(r"in frame (\d+)$", ended or "")
    return found is not None and int(found.group(1)) < frame


def _sucis(row: Any) -> set[str]:
    return {f"{msin}/{row.values.get('e212.mcc', [''])[0]}/{row.values.get('e212.mnc', [''])[0]}"
            for msin in row.values.get("nas_5gs.mm.suci.msin", [])}


def _show(value: int | None) -> str:
    return "?" if value is None else str(value)


def _components(edges: list[tuple[str, str]]) -> list[set[str]]:
    groups: list[set[str]] = []
    for x, y in edges:
        joined = [g for g in groups if g & {x, y}]
        groups = [g for g in groups if not g & {x, y}] + [{x, y}.union(*joined)]
    return groups


def _evidence(rows: list[Any], owners: list[UeKey | None], sucis: dict[UeKey, set[str]], label: dict[UeKey, str],
              switches: dict[int, tuple[UeKey, UeKey]]) -> tuple[set[Link], set[Refusal], list[Link]]:
    """5G-TMSI, handover and path switch (`switches`: frame -> (source, switched context)) evidence,
    read in capture order."""
    assigned: dict[int, tuple[UeKey, int]] = {}  # value -> latest assigning context and frame
    presented: dict[int, tuple[UeKey, int]] = {}  # value -> first presenting context, while never assigned
    containers: dict[str, tuple[UeKey, int]] = {}  # SourceToTarget container -> HandoverRequired's context, frame
    links: set[Link] = set()
    refused: set[Refusal] = set()
    two = "the two contexts identified with different SUCIs: two subscribers"
    # Contexts joined so far, in capture order (a SUCI seen again, or a link listed): evidence between two
    # contexts already joined adds no link to the list (and its refusal is dropped with the rest, at the end).
    parent: dict[UeKey, UeKey] = {}
    first_suci: dict[str, UeKey] = {}
    listed: list[Link] = []

    def root(x: UeKey) -> UeKey:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    def join(a: UeKey, b: UeKey, entry: Link | None) -> None:
        if root(a) != root(b):
            parent[root(b)] = root(a)
            if entry is not None:
                listed.append(entry)

    for row, owner in zip(rows, owners, strict=True):
        if owner is None:
            continue
        for suci in sorted(_sucis(row)):
            join(first_suci.setdefault(suci, owner), owner, None)
        nas = row.ints("nas_5gs.5g_tmsi")
        assigning = bool(TMSI_ASSIGNERS & set(row.ints("nas_5gs.mm.message_type")))
        for value in [*([] if assigning else nas), *row.ints("ngap.fiveG_TMSI")]:
            if value in assigned:
                other, frame = assigned[value]
                evidence = f"5G-TMSI assigned in frame {frame}, presented in frame {row.frame}"
                if other == owner:
                    continue
                if _two_subscribers(sucis, other, owner):
                    refused.add((label[owner], label[other], evidence, (frame, row.frame), two))
                else:
                    links.add((label[owner], label[other], evidence, (frame, row.frame)))
                    join(other, owner, (label[owner], label[other], evidence, (frame, row.frame)))
            elif value in presented:
                other, frame = presented[value]
                if other == owner:
                    continue
                why = ("the 5G-TMSI was presented by both and never assigned in this capture: a presentation alone "
                       "is no evidence") + ("; and " + two if _two_subscribers(sucis, other, owner) else "")
                refused.add((label[owner], label[other], f"5G-TMSI {value} presented in frames {frame} and {row.frame}",
                             (frame, row.frame), why))
            else:
                presented[value] = (owner, row.frame)
        for value in nas if assigning else []:
            assigned[value] = (owner, row.frame)
        container = row.values.get("ngap.SourceToTarget_TransparentContainer", [None])[0]
        if container is not None and row.pdu_type == 0 and row.proc == HANDOVER_REQUIRED:
            containers[container] = (owner, row.frame)
        elif container in containers and row.pdu_type == 0 and row.proc == HANDOVER_REQUEST:
            other, frame = containers[container]
            if other != owner:
                entry = (label[owner], label[other], HANDOVER, (frame, row.frame))
                if _two_subscribers(sucis, other, owner):
                    refused.add((*entry, two))
                else:
                    links.add(entry)
                    join(other, owner, entry)
        if row.frame in switches:
            source, target = switches[row.frame]
            entry = (label[target], label[source], PATH_SWITCH, (row.frame,))
            if _two_subscribers(sucis, source, target):
                refused.add((*entry, two))
            else:
                links.add(entry)
                join(source, target, entry)
    return links, refused, listed


def _two_subscribers(sucis: dict[UeKey, set[str]], a: UeKey, b: UeKey) -> bool:
    return bool(sucis.get(a) and sucis.get(b) and not sucis[a] & sucis[b])


def _path_switches(rows: list[Any], owners: list[UeKey | None], amf_side: dict[Assoc, str],
                   amf_ids: dict[UeKey, list[int]]) -> list[tuple[UeKey, UeKey, tuple[int, ...]]]:
    """(source context, switched context, (frame,)) of each PathSwitchRequest whose source is in the capture."""
    first: dict[UeKey, int] = {}  # in the order the contexts started
    for row, owner in zip(rows, owners, strict=True):
        if owner is not None:
            first.setdefault(owner, row.frame)
    found = []
    for row, owner in zip(rows, owners, strict=True):
        if owner is None or row.proc != PATH_SWITCH_REQUEST or row.pdu_type != 0 or row.source_amf is None:
            continue
        ip = amf_side[owner[:3]].rsplit(":", 1)[0]
        sources = [u for u in first if u[:3] != owner[:3] and amf_side[u[:3]].rsplit(":", 1)[0] == ip
                   and row.source_amf in amf_ids[u] and first[u] <= row.frame]
        if sources:
            found.append((sources[-1], owner, (row.frame,)))
    return found
