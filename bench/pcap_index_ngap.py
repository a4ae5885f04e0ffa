"""NGAP bench: the NGAP UE contexts, their procedures and PDU sessions of a big capture from its index
(actors/pcap/index/ngap_views.py: sharkd reads only the SCTP frames cut from the file, once, kept beside the
index) against the loaded capture (sharkd holds all of it), side by side in one run.

The capture is N2 inside N3: the dense user-plane capture of bench/pcap_fresh.py (--user-mb, 1 GiB by
default) merged with --copies copies of a corpus capture of NGAP (each copy time-shifted, its SCTP
verification tags changed: a new association), built once and cached outside the repository.

Run from the repository root:

    .venv/bin/python bench/pcap_index_ngap.py [--user-mb 1024] [--copies 200] [--repeats 20] [--limit 100]

Rows:
(L) the loaded capture: a daemon without an index, its first ngap_ue_sessions (sharkd loads the whole file).
(I) the index's build (pcap_index), then the first ngap_ue_sessions from it (the cut and sharkd's reading).
(P) the first procedures view from the index (its PFCP and SBI rows: tshark over the frames cut carrying
    them, index/core_rows.py), after the contexts view read the model.
(N) each view (ngap_ue_sessions contexts and procedures, ngap_pdu_session_summary) from the index: median of
    --repeats calls, at the client
    and in the daemon (its duration_ms: the rest is the answer's way through MCP); target <= 0.1 s. Every
    call asks for a page of --limit UEs (sessions): the counts and other lists whole (the tools' paging).
(R) after a restart (a new daemon on the same state directory): the first ngap_ue_sessions; target <= 1 s.
Every answer from the index must equal the loaded capture's (but where it came from), or the run fails.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _daemon import isolated_daemon
from _pcap_tools import build_capture, build_dense_capture, dense_sources, diagd_client, log, tool_output

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.pcaps import PCAPS, PCAPS_EXTRA

CACHE_DIR = Path("/var/tmp/diagd-bench-cache")
NGAP_SOURCE = "oaifed_5gcn-deployment-omec-gnbsim.pcapng"  # 120 NGAP frames: the most of the corpus
# The views of the one NGAP model: the tool and its arguments.
VIEWS: dict[str, tuple[str, dict[str, Any]]] = {
    "ngap_ue_sessions": ("ngap_ue_sessions", {}),
    "ngap_ue_sessions view=procedures": ("ngap_ue_sessions", {"view": "procedures"}),
    "ngap_pdu_session_summary": ("ngap_pdu_session_summary", {})}
PENDING = "is not known yet"  # the SBI check's warning while its pass runs (ngap_tools.ngap_summary)
FIRST_TIMEOUT_S = 1800.0  # a first answer reads the capture (the loaded one: all of it in sharkd)


def n2_in_n3(args: argparse.Namespace) -> Path:
    """The merged capture (cached by its parts' names)."""
    user, _ = build_dense_capture(dense_sources(), args.user_mb, args.cache_dir)
    ngap, _ = build_capture(PCAPS_EXTRA / NGAP_SOURCE, args.copies, 0, args.cache_dir)
    out = args.cache_dir / f"n2-in-n3-{user.stem}-{ngap.stem}.pcapng"
    if not out.exists():
        log(f"building {out}")
        partial = out.with_suffix(".partial")
        tool_output(["mergecap", "-w", str(partial), str(user), str(ngap)])
        partial.replace(out)
    return out


def compared(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k not in ("source", "served_by", "cached")}


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import trio

    path = await trio.to_thread.run_sync(n2_in_n3, args)
    dirs = json.dumps([str(args.cache_dir), str(PCAPS), str(PCAPS_EXTRA)])
    config = f"[daemon]\nallowed_dirs = {dirs}\ncall_timeout_s = 3600\n"
    call = {"pcap_path": str(path), "limit": args.limit}
    log("the loaded capture: a daemon without an index")
    with isolated_daemon("ngap-loaded", config=config) as daemon:
        async with diagd_client(daemon.env) as client:
            loaded_s, loaded, _ = await client.call("ngap_ue_sessions", call, timeout_s=FIRST_TIMEOUT_S)
            wanted = {view: (await client.call(tool, {**call, **extra}, timeout_s=FIRST_TIMEOUT_S))[1]
                      for view, (tool, extra) in VIEWS.items()}
    state = tempfile.mkdtemp(prefix="diagd-bench-ngap-state-")
    try:
        with isolated_daemon("ngap-index", config=config, extra_env={"DIAGD_STATE_DIR": state}) as daemon:
            async with diagd_client(daemon.env) as client:
                log("pcap_index until ready")
                start = time.perf_counter()
                index = {"pcap_path": str(path), "wait_s": 600}  # the tools' paging is not pcap_index's
                while (await client.call("pcap_index", index, timeout_s=FIRST_TIMEOUT_S))[1]["state"] == "building":
                    pass
                build_s = time.perf_counter() - start
                start = time.perf_counter()
                first_s, first, _ = await client.call("ngap_ue_sessions", call, timeout_s=FIRST_TIMEOUT_S)
                # Its warnings may say the SBI check (a pass over the whole file) is not done yet: until it is.
                while any(PENDING in w for w in first.get("warnings", [])):
                    await trio.sleep(1.0)
                    _, first, _ = await client.call("ngap_ue_sessions", call)
                complete_s = time.perf_counter() - start
                procedures_s, _, _ = await client.call("ngap_ue_sessions", {**call, "view": "procedures"},
                                                       timeout_s=FIRST_TIMEOUT_S)
                timings: dict[str, list[float]] = {view: [] for view in VIEWS}
                in_daemon: dict[str, list[float]] = {view: [] for view in VIEWS}
                for _ in range(args.repeats):
                    for view, (tool, extra) in VIEWS.items():
                        took, answer, meta = await client.call(tool, {**call, **extra})
                        in_daemon[view].append(float(meta.get("duration_ms", math.nan)) / 1000)
                        if (not answer.get("served_by", "").startswith("index")
                                or compared(answer) != compared(wanted[view])):
                            raise RuntimeError(f"{view} from the index is not the loaded capture's")
                        timings[view].append(took)
        log("a new daemon on the same state directory")
        with isolated_daemon("ngap-index2", config=config, extra_env={"DIAGD_STATE_DIR": state}) as again:
            async with diagd_client(again.env) as client:
                restart_s, after, _ = await client.call("ngap_ue_sessions", call)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    for answer in (first, after):
        if not answer.get("served_by", "").startswith("index") or compared(answer) != compared(loaded):
            raise RuntimeError("ngap_ue_sessions from the index is not the loaded capture's")
    size_mb = round(path.stat().st_size / 2**20)
    rows = [
        {"row": "L", "what": f"loaded capture ({size_mb} MiB), first ngap_ue_sessions", "diagd_s": round(loaded_s, 2),
         "ues": loaded["ue_count"], "ngap_pdus": loaded["ngap_pdus"],
         "answer_kb": round(len(json.dumps(loaded)) / 1024)},
        {"row": "I", "what": "index build; then first ngap_ue_sessions from it", "build_s": round(build_s, 2),
         "diagd_s": round(first_s, 2), "vs_loaded": round(loaded_s / first_s, 1),
         "with_sbi_check_s": round(complete_s, 2)},
        {"row": "P", "what": "first procedures view from the index (PFCP and SBI rows from a cut)",
         "diagd_s": round(procedures_s, 2)},
    ]
    for view, took in timings.items():
        median = statistics.median(took)
        rows.append({"row": "N", "what": f"{view} from the index (pages of {args.limit}), median of {len(took)}",
                     "diagd_s": round(median, 4), "max_s": round(max(took), 4),
                     "in_daemon_s": round(statistics.median(in_daemon[view]), 4), "target": "<= 0.1 s",
                     "met": median <= 0.1})
    rows.append({"row": "R", "what": "after a restart: first ngap_ue_sessions", "diagd_s": round(restart_s, 3),
                 "target": "<= 1 s", "met": restart_s <= 1.0})
    return rows


def main() -> int:
    import trio

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--user-mb", type=float, default=1024)
    parser.add_argument("--copies", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--limit", type=int, default=100, help="UEs (sessions) a page")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = trio.run(run, args)
    for row in rows:
        print(json.dumps(row) if args.json else " | ".join(f"{k}={v}" for k, v in row.items()))
    return 0 if all(r.get("met", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
