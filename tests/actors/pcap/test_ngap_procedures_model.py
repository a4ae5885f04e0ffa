"""The procedures view of the NGAP model, in-process, against tshark -T fields on every corpus capture.

The model runs on the cached real sharkd trees (tests/support/sharkd_trees.py), so the mutation gate
(scripts/mutation.sh) can re-run it per mutant of procedures.py, associations.py and model.py; the
second answer is tests/support/procedures_oracle.py, which never imports diagd. The same comparison
runs through the daemon in tests/e2e/test_ngap_procedures.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from diagd.actors.pcap import ngap
from tests.actors.pcap.test_ngap_fields import CANNOT_TELL, CAPTURES, ue_keys
from tests.pcaps import PCAPS
from tests.support import ngap_oracle, procedures_oracle
from tests.support.sharkd_trees import ngap_trees

# Beyond the fields oracle's list: a capture whose NAS rows this oracle cannot split (a 5GMM type twice in one row).
PROCEDURES_CANNOT_TELL = {**CANNOT_TELL, "ngtester_initue_open5gs_amf_ngap_nas_sbi.pcap": "5GMM types .76, 76."}
MS = 0.0011  # durations are rounded to µs; sharkd's and tshark's frame times may differ in the last digit


def as_found(result: dict[str, Any], listed: list[dict[str, Any]] | None = None) -> list[procedures_oracle.Found]:
    """diagd's instances (all, or those `listed`) as the oracle writes them."""
    keys = ue_keys(result)
    every = listed if listed is not None else [p for u in result["ues"] for p in u["procedures"]]
    return [(keys[p["ue"]], p["procedure"], p.get("pdu_session_id"), p["first_frame"], p["last_frame"],
             p["duration_ms"], p["outcome"], p["cause"]["kind"] if p["cause"] else None,
             p["cause"]["code"] if p["cause"] else None) for p in every]


def same_instances(got: list[procedures_oracle.Found], want: list[procedures_oracle.Found]) -> None:
    """The same instances; durations equal to the µs they are rounded to."""
    def key(f: procedures_oracle.Found) -> str:
        return repr((*f[:5], *f[6:]))
    got, want = sorted(got, key=key), sorted(want, key=key)
    assert [key(g) for g in got] == [key(w) for w in want]
    assert [g[5] for g in got] == pytest.approx([w[5] for w in want], abs=MS)


def check(result: dict[str, Any], path: Path) -> list[procedures_oracle.Found]:
    """Every instance, the counts and the per-procedure statistics of a procedures answer against the oracle."""
    want = procedures_oracle.answer(path)
    same_instances(as_found(result), want)
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
    for u in result["ues"]:
        for p in u["procedures"]:
            assert p["start"].endswith("Z")
            assert p["frames"][0] == p["first_frame"] and p["frames"][-1] == p["last_frame"]
            assert (p["outcome"] == "incomplete") == (p["duration_ms"] is None) == ("why" in p), p
    return want


def procedures(path: Path) -> dict[str, Any]:
    pdus = [pdu for number, answer in sorted(ngap_trees(path).items())
            for pdu in ngap.pdus_in_frame(number, answer["tree"])]
    return ngap.procedures(ngap.build_model(pdus))


@pytest.mark.parametrize("path", CAPTURES or [PCAPS / "(no corpus)"], ids=lambda p: p.name)
def test_every_procedure_instance_agrees_with_tshark_fields(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"the shared capture corpus is not in {PCAPS}")
    if path.name in PROCEDURES_CANNOT_TELL:
        with pytest.raises(ngap_oracle.OracleCannotTell, match=PROCEDURES_CANNOT_TELL[path.name]):
            procedures_oracle.answer(path)
        return
    result = procedures(path)
    want = check(result, path)
    if not want:
        assert result["procedure_count"] == 0 and result["statistics"] == {} and "reason" in result
