"""Narrowed-filter bench: a display filter the index does not translate, matched by tshark over only the
frames that can match, cut from the file by the capture's index (actors/pcap/index/narrowing.py), against
one two-pass tshark over the whole file with the same filter (what answers it otherwise when sharkd does
not hold the capture), side by side in one run, on the 1 GB captures of bench/pcap_index.py.

Run from the repository root:

    .venv/bin/python bench/pcap_narrowed.py [--big-mb 1024] [--planes control,user] [--repeats 20]

Rows, per capture and filter (the index built first by pcap_index on a daemon of its own):
(F) the filter's first page (limit 500) from the index: the cut and tshark's pass over it, against
    `tshark -r F -n -2 -Y FILTER -T fields -e frame.number` over the whole file; target >= 1x (faster).
(K) its next pages (offsets over its matches): median of --repeats calls; target <= 0.1 s.
(S) user plane: HTTP/1.1 response times (pcap_stats kind=srt) from the index (answers/index_srt.py: tshark
    over the frames cut carrying HTTP, paired), against the two-pass `tshark -T fields` read of the whole
    file the same pairing is made from (tests/support/srt_pairs.py); target >= 1x (faster).
Every answer must be the whole-file tshark's frames (the pairing of its fields), or the run fails.
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
from _pcap_tools import build_capture, build_dense_capture, dense_sources, diagd_client, log, run_cold
from _report import finish_rows

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.pcaps import PCAPS
from tests.support import srt_pairs

CACHE_DIR = Path("/var/tmp/diagd-bench-cache")
SOURCE = "magma_gx_gy_combined_04.pcapng"
PAGE = 500
FILTERS = {"control": "diameter && diameter.cmd.code == 272 && diameter.flags.request == 0",
           "user": 'dns && dns.qry.name contains "a"'}


async def measure(args: argparse.Namespace, plane: str, path: Path) -> list[dict[str, Any]]:
    import trio

    flt = FILTERS[plane]
    label = f"{plane} {args.big_mb / 1024:g} GB"
    log(f"{label}: tshark -2 -Y over the whole file")
    ran = await trio.to_thread.run_sync(lambda: run_cold(["tshark", "-r", str(path), "-n", "-2", "-Y", flt,
                                                          "-T", "fields", "-e", "frame.number"], keep=True))
    wanted = [int(n) for n in ran.stdout.split()]
    dirs = json.dumps([str(args.cache_dir), str(args.pcaps_dir)])
    config = f"[daemon]\nallowed_dirs = {dirs}\ncall_timeout_s = 3600\n"
    state = tempfile.mkdtemp(prefix="diagd-bench-narrowed-state-")
    try:
        with isolated_daemon("narrowed", config=config, extra_env={"DIAGD_STATE_DIR": state}) as daemon:
            async with diagd_client(daemon.env) as client:
                log(f"{label}: pcap_index until ready")
                while (await client.call("pcap_index", {"pcap_path": str(path), "wait_s": 600},
                                         timeout_s=700))[1]["state"] == "building":
                    pass
                call = {"pcap_path": str(path), "display_filter": flt, "limit": PAGE}
                log(f"{label}: {flt}")
                start = time.perf_counter()
                _, first, _ = await client.call("pcap_frames_by_filter", call, timeout_s=3600)
                first_s = time.perf_counter() - start
                if first.get("served_by") != "index" or first["total"] != len(wanted):
                    raise RuntimeError(f"not the whole file's {len(wanted)} matches from the index: {first}")
                got, pages = [f["number"] for f in first["frames"]], []
                offsets = [len(wanted) * i // args.repeats for i in range(args.repeats)]
                for offset in offsets:
                    took, page, _ = await client.call("pcap_frames_by_filter", {**call, "offset": offset})
                    pages.append(took)
                    if [f["number"] for f in page["frames"]] != wanted[offset:offset + PAGE]:
                        raise RuntimeError(f"page at {offset} is not tshark's")
                if got != wanted[:PAGE]:
                    raise RuntimeError("the first page is not tshark's")
                if plane == "user":
                    srt_row = await response_times(client, path, label)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return [*([srt_row] if plane == "user" else []),
        {"row": "F", "capture": label, "what": f"first page of {flt!r} ({len(wanted)} matches; "
                                               f"{first['note'].split(',')[0]})",
         "diagd_s": round(first_s, 2), "peer_s": round(ran.wall_s, 2), "ratio": round(ran.wall_s / first_s, 2),
         "target": ">= 1x", "met": first_s <= ran.wall_s},
        {"row": "K", "capture": label, "what": f"next pages, median of {len(pages)}",
         "diagd_s": round(statistics.median(pages), 4), "max_s": round(max(pages), 4), "target": "<= 0.1 s",
         "met": statistics.median(pages) <= 0.1},
    ]


async def response_times(client: Any, path: Path, label: str) -> dict[str, Any]:
    """Row S: the HTTP/1.1 response times from the index against the whole file's fields read."""
    import trio

    base, extra = srt_pairs.PROTOCOLS["http"]
    argv = ["tshark", "-r", str(path), "-n", "-2", "-Y", base, "-T", "fields", "-E", "occurrence=a", "-E",
            f"aggregator={srt_pairs.SEP}", *[a for f in srt_pairs.COMMON + extra for a in ("-e", f)]]
    log(f"{label}: HTTP response times, tshark -T fields over the whole file")
    peer = await trio.to_thread.run_sync(lambda: run_cold(argv))
    log(f"{label}: HTTP response times from the index")
    start = time.perf_counter()
    _, ours, _ = await client.call("pcap_stats", {"pcap_path": str(path), "kind": "srt", "protocol": "http",
                                                  "limit": 500}, timeout_s=3600)
    took = time.perf_counter() - start
    theirs = await trio.to_thread.run_sync(lambda: srt_pairs.pairing(path, "http").answer)
    if "cut from the file by its index" not in ours.get("method", "") or ours["rows"] != theirs["rows"] or any(
            ours[key] != value for key, value in theirs.items()):
        raise RuntimeError(f"HTTP response times from the index are not the pairing of tshark's fields: {ours}")
    return {"row": "S", "capture": label, "what": f"HTTP/1.1 response times ({theirs['requests']} requests; "
                                                  f"{ours['method'].split('; ')[-1].split(',')[0]})",
            "diagd_s": round(took, 2), "peer_s": round(peer.wall_s, 2), "ratio": round(peer.wall_s / took, 2),
            "target": ">= 1x", "met": took <= peer.wall_s}


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import trio

    rows: list[dict[str, Any]] = []
    src = args.pcaps_dir / SOURCE
    if "control" in args.planes:
        copies = max(1, math.ceil(args.big_mb * 1024 * 1024 / src.stat().st_size))  # as bench/pcap_index.py
        path, _ = await trio.to_thread.run_sync(lambda: build_capture(src, copies, 0, args.cache_dir))
        rows += await measure(args, "control", path)
    if "user" in args.planes:
        path, _ = await trio.to_thread.run_sync(lambda: build_dense_capture(dense_sources(), args.big_mb,
                                                                            args.cache_dir))
        rows += await measure(args, "user", path)
    return rows


def main() -> int:
    import trio

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big-mb", type=float, default=1024)
    parser.add_argument("--planes", default="control,user")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument("--pcaps-dir", type=Path, default=PCAPS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    return finish_rows(trio.run(run, args), args.json)


if __name__ == "__main__":
    sys.exit(main())
