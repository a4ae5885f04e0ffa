"""The procedures view of the NGAP model, in-process, against tshark -T fields on every corpus capture.

The model runs on the cached real sharkd trees (tests/support/sharkd_trees.py), so the mutation gate
(scripts/mutation.sh) can re-run it per mutant of procedures.py, associations.py and model.py; the
second answer is tests/support/procedures_oracle.py, which never imports diagd. The same comparison
runs through the daemon in tests/e2e/test_ngap_procedures.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from diagd.actors.pcap import ngap
from diagd.actors.pcap.ngap.core_links import CORE_FIELDS, CORE_FILTER
from diagd.actors.pcap.ngap.procedures import PROCEDURES, _p
from diagd.actors.pcap.ngap.procedures import percentile as ngap_procedures_percentile
from tests.actors.pcap.test_ngap_fields import CANNOT_TELL, CAPTURES, oracle_answer, ue_keys
from tests.pcaps import PCAPS
from tests.support import built_captures_n2, pcap_oracle, procedures_oracle
from tests.support.built_captures import MERGES, RECIPES, built, merged
from tests.support.sharkd_trees import ngap_trees

# Beyond the fields oracle's list: captures whose NAS rows this oracle cannot split (none left: a 5GMM type twice
# in one row is an initial message repeated in its own NAS message container, TS 24.501 4.4.6).
PROCEDURES_CANNOT_TELL = {**CANNOT_TELL}
MS = 0.0011  # durations are rounded to µs; sharkd's and tshark's frame times may differ in the last digit


Keys = tuple[dict[str, procedures_oracle.UeKey], dict[str, procedures_oracle.UeKey]]


def keys_of(result: dict[str, Any]) -> Keys:
    """({UE label: key}, {association label: the key of its non-UE-associated instances})."""
    assoc = {a["association"]: (a["endpoints"][0], a["endpoints"][1], a["sctp_assoc_index"])
             for a in result["associations"]}
    return ue_keys(result), {label: procedures_oracle.non_ue_key(a) for label, a in assoc.items()}


def every_instance(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each UE context's instances, then the non-UE-associated ones (NG Reset)."""
    return [*(p for u in result["ues"] for p in u["procedures"]), *result["non_ue_procedures"]]


def key_of(keys: Keys, p: dict[str, Any]) -> procedures_oracle.UeKey:
    return keys[1][p["association"]] if p["ue"] is None else keys[0][p["ue"]]


def as_found(result: dict[str, Any], listed: list[dict[str, Any]] | None = None) -> list[procedures_oracle.Found]:
    """diagd's instances (all, or those `listed`) as the oracle writes them."""
    keys = keys_of(result)
    every = listed if listed is not None else every_instance(result)
    return [(key_of(keys, p), p["procedure"], p.get("pdu_session_id"), p["first_frame"], p["last_frame"],
             p["duration_ms"], p["outcome"], p["cause"]["kind"] if p["cause"] else None,
             p["cause"]["code"] if p["cause"] else None) for p in every]


def same_instances(got: list[procedures_oracle.Found], want: list[procedures_oracle.Found]) -> None:
    """The same instances; durations equal to the µs they are rounded to."""
    def key(f: procedures_oracle.Found) -> str:
        return repr((*f[:5], *f[6:]))
    got, want = sorted(got, key=key), sorted(want, key=key)
    assert [key(g) for g in got] == [key(w) for w in want]
    assert [g[5] for g in got] == pytest.approx([w[5] for w in want], abs=MS)


def same_details(result: dict[str, Any], want: list[procedures_oracle.Detail]) -> None:
    """Each instance's cause (name from `tshark -G values`, NGAP group), rule, UE address and reason."""
    keys = keys_of(result)
    every = every_instance(result)

    def key(f: procedures_oracle.Found) -> str:
        return repr((*f[:5], *f[6:]))
    got = sorted(zip(as_found(result, every), every, strict=True), key=lambda pair: key(pair[0]))
    for (found, p), w in zip(got, sorted(want, key=lambda d: key(d.found)), strict=True):
        assert key(found) == key(w.found)
        where = (key_of(keys, p), p["procedure"], p["first_frame"])
        cause = p["cause"]
        if cause is not None:  # exactly the documented keys: NGAP causes name their group, NAS ones do not
            assert set(cause) == ({"kind", "group", "code", "name"} if cause["kind"] == "NGAP" else
                                  {"kind", "code", "name"}), (where, cause)
            cause = procedures_oracle.Cause(cause["kind"], cause["code"], cause["name"], cause.get("group"))
        assert (where, cause, p["rule_id"], p.get("ue_ipv4")) == (where, w.cause, w.rule_id, w.ue_ipv4)
        by = p.get("answered_by")  # a PAGING's: the oracle's UE context, and the frame that answered
        assert (keys[0][by["ue"]] if by else None, by["frame"] if by else None) == (
            w.by, w.found[4] if w.by else None), where
        assert p["rule"].startswith("TS ") and ": " in p["rule"], (where, p["rule"])  # "clause: what it says"
        why = p.get("why", "")
        for says in w.why_says:
            assert says in why, (where, says, why)
        if w.why_says:
            assert why.startswith(w.why_says[0]), (where, why)
            assert w.why_says[-1].endswith("(") or why.endswith(w.why_says[-1]), (where, why)


def check(result: dict[str, Any], path: Path, core: bool = True) -> list[procedures_oracle.Found]:
    """Every instance, the counts and the per-procedure statistics of a procedures answer against the oracle
    (core=False: the view was given no N4/SBI rows, so no establishment has links)."""
    detailed = procedures_oracle.details(path)
    want = [d.found for d in detailed]
    same_instances(as_found(result), want)
    same_details(result, detailed)
    assert result["procedure_count"] == len(want)
    assert result["incomplete"] == sum(1 for w in want if w[6] == "incomplete")
    # Statistics per procedure type, recomputed from the oracle's instances.
    stats: dict[str, Any] = {}
    for name in sorted({w[1] for w in want}):
        mine = [w for w in want if w[1] == name]
        durations = [w[5] for w in mine if w[5] is not None]
        stats[name] = {"count": len(mine), **{o: sum(1 for w in mine if w[6] == o)
                                              for o in ("success", "reject", "failure", "incomplete")},
                       "p50_ms": procedures_oracle.nearest_rank(durations, 50) if durations else None,
                       "p95_ms": procedures_oracle.nearest_rank(durations, 95) if durations else None,
                       "max_ms": max(durations) if durations else None}
    assert sorted(result["statistics"]) == list(stats)
    for name, row in stats.items():
        assert result["statistics"][name] == pytest.approx(row, abs=MS), name
    same_instances(as_found(result, result["failed"]), [w for w in want if w[6] in ("reject", "failure")])
    for u in [*result["ues"], {"procedures": result["non_ue_procedures"]}]:
        for p in u["procedures"]:
            assert p["start"].endswith("Z")
            assert p["frames"][0] == p["first_frame"] and p["frames"][-1] == p["last_frame"]
            assert (p["outcome"] == "incomplete") == (p["duration_ms"] is None) == ("why" in p), p
            assert p["duration_ms"] is None or round(p["duration_ms"], 3) == p["duration_ms"], p  # to the µs
            # Exactly the documented keys: a PDU session id for per-session procedures, a reason when incomplete,
            # the PDU address of an accepted establishment, an establishment's N4/SBI links (none without core rows).
            assert set(p) == {"procedure", "ue", "first_frame", "last_frame", "start", "duration_ms", "outcome",
                              "cause", "frames", "rule", "rule_id",
                              *(["pdu_session_id"] if p["procedure"] in procedures_oracle.PER_SESSION else []),
                              *(["why"] if p["outcome"] == "incomplete" else []), *(["ue_ipv4"] if "ue_ipv4" in p
                                                                                    else []),
                              *(["n4_sbi"] if p["procedure"] == "PDU Session Establishment" else []),
                              *(["association"] if p["ue"] is None else []),
                              # a PAGING: the paged 5G-S-TMSI, and the UE context that answered it, with evidence
                              *(["paged"] if p["procedure"] == "Paging" else []),
                              *(["answered_by"] if p["procedure"] == "Paging" and p["outcome"] == "success"
                                else [])}, p
            assert core or p.get("n4_sbi", []) == [], p  # no core rows given: nothing linked
    return want


def procedures(path: Path) -> dict[str, Any]:
    return procedures_and_orphans(path)[0]


def procedures_and_orphans(path: Path) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """The procedures view and the model's (UE label, procedure, rule id) of answers with no request captured."""
    pdus = [pdu for number, answer in sorted(ngap_trees(path).items())
            for pdu in ngap.pdus_in_frame(number, answer["tree"])]
    model = ngap.build_model(pdus)
    return ngap.procedures(model), [(ctx.label, *o) for (ctx, _), found in zip(model.by_context, model.orphans,
                                                                                strict=True) for o in found]


@pytest.mark.parametrize("path", (CAPTURES or [PCAPS / "(no corpus)"]) + [built(name) for name in RECIPES]
                         + [built_captures_n2.built(name) for name in built_captures_n2.RECIPES],
                         ids=lambda p: p.name)
def test_every_procedure_instance_agrees_with_tshark_fields(path: Path) -> None:
    if oracle_answer(path, procedures_oracle.answer, PROCEDURES_CANNOT_TELL) is None:
        return
    result, orphans = procedures_and_orphans(path)
    want = check(result, path, core=False)
    keys = ue_keys(result)  # answers to requests outside the capture: they count for the sessions view
    assert sorted((keys[u], *o) for u, *o in orphans) == sorted(procedures_oracle.orphans(path))
    if not want:
        assert result["procedure_count"] == 0 and result["statistics"] == {} and "reason" in result


def test_the_procedure_table_starts_each_procedure_by_the_oracle_s_start_messages() -> None:
    """Which message starts which procedure, and which are per PDU session: diagd's table against the oracle's,
    written separately from TS 24.501 / 38.413 message-type numbers (keys as diagd spells them)."""
    def key(event: tuple[int | str, ...]) -> str:
        if event[0] == "ngap":
            return f"NGAP {event[1]}/{event[2]}"
        return f"{'5GMM' if event[0] == 'mm' else '5GSM'} 0x{event[1]:02x}"
    want: dict[str, tuple[set[str], bool]] = {}
    for event, roles in procedures_oracle.TABLE.items():
        for name, role, _ in roles:
            if role == "start":
                want.setdefault(name, (set(), name in procedures_oracle.PER_SESSION))[0].add(key(event))
    assert {p.name: (set(p.start), p.per_session) for p in PROCEDURES} == want
    # The table is written as "key, key" strings, per session only when said so: the same notation gives the
    # same rows. (The table is built at import: mutmut's mutants of its helper only act when called here.)
    for p in PROCEDURES:
        assert _p(p.name, ", ".join(sorted(p.start)), *([True] if p.per_session else [])) == p


def core_rows(path: Path, decode_as: str | None) -> list[dict[str, str]]:
    """The PFCP and SBI rows the pcap actor hands the procedures view (its filter and fields, two passes)."""
    argv = ["tshark", "-r", str(path), "-n", "-2", *(["-d", decode_as] if decode_as else []), "-Y", CORE_FILTER,
            "-T", "fields", "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=,",
            *(a for f in CORE_FIELDS for a in ("-e", f))]
    def run() -> str:  # tshark's rows, kept on disk like the sharkd trees (tests/support/pcap_oracle.cached_text)
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    out = pcap_oracle.cached_text(path, [*argv, pcap_oracle.config_key()], run)
    return [dict(zip(CORE_FIELDS, line.split("\t"), strict=False)) for line in out.splitlines()]


@pytest.mark.parametrize("name", [*MERGES, "5greplay_oai.pcap"])
def test_each_establishment_carries_its_n4_and_sbi_requests_as_tshark_links_them(name: str) -> None:
    path, decode_as = (merged(name), MERGES[name][1]) if name in MERGES else (PCAPS / name, None)
    if not path.exists():
        pytest.skip(f"the shared capture corpus is not in {PCAPS}")
    pdus = [pdu for number, answer in sorted(ngap_trees(path).items())
            for pdu in ngap.pdus_in_frame(number, answer["tree"])]
    result = ngap.procedures(ngap.build_model(pdus), core_rows=core_rows(path, decode_as))
    check(result, path)
    requests, want = procedures_oracle.core_links(path, decode_as)
    keys = ue_keys(result)
    est = [p for u in result["ues"] for p in u["procedures"] if p["procedure"] == "PDU Session Establishment"]
    got = {(keys[p["ue"]], p["pdu_session_id"], p["first_frame"]): sorted(
        procedures_oracle.Link(m["interface"], m["frame"], m["response_frame"], next(
            by for by, says in (("UE IPv4", "UE IPv4 "), ("SUPI", "SUPI "), ("window", "timing window"))
            if m["linked_by"].startswith(says))) for m in p["n4_sbi"]) for p in est}
    assert got == {k: sorted(v) for k, v in want.items()}
    attached = sum(len(v) for v in want.values())
    assert attached and result["n4_sbi"] == {"n4_sbi_messages": requests, "unattached": requests - attached}
    # Every run reaches the SUPI links (a CreateSMContext's JSON body names the UE's SUPI and PDU session id); the
    # upf-timeout one has no PDU address (all rejected), so its PFCP requests go by the window.
    if name.endswith("response-lost"):  # an unanswered establishment's window runs to the last NGAP frame, over
        # UE 3's whole establishment: its CreateSMContext (1142, 1145 once 1052 is dropped) falls in two windows,
        # and the SUPI in its JSON links it
        assert any(p["outcome"] == "incomplete" for p in est)
        assert {(m.frame, m.by) for v in want.values() for m in v if m.frame in (1142, 1145)} == {
            (1142, "SUPI"), (1145, "SUPI")}
    assert {by for v in want.values() for _, _, _, by in v} == {"SUPI", "window" if "timeout" in name else "UE IPv4"}


def test_percentiles_are_the_oracle_s_nearest_rank() -> None:
    values = [float((7919 * i) % 1009) for i in range(1, 302)]  # fixed, unordered, with repeats past 1009
    for n in range(1, len(values) + 1):
        for p in (50, 95):
            assert ngap_procedures_percentile(values[:n], p) == procedures_oracle.nearest_rank(values[:n], p), (n, p)
