"""Fresh-capture bench: the first answer on a capture the daemon never saw, against `tshark | head`
and the early-stopping peer, on two kinds of capture, each at 55 MB and 1 GB: the control-plane
captures of bench/pcap.py (Diameter) and dense user-plane ones (GTP-U carrying TCP).

Run from the repository root:

    .venv/bin/python bench/pcap_fresh.py [--size-mb 50] [--big-mb 1024 | --no-big] [--json]

The control-plane captures are bench/pcap.py's (N time-shifted, SCTP-retagged copies of
magma_gx_gy_combined_04 merged with `mergecap -a`); the user-plane ones are N time-shifted copies of
the GTP-U frames of 5greplay_oai and oaifed_cotsue_core (inner addresses changed per copy, so each
copy's TCP connections are new: bench/_pcap_tools.py build_dense_capture), ~500 bytes a frame, every
frame GTP-U and most of them TCP. Both are built once and cached outside the repository (default
/var/tmp/diagd-bench-cache/). Each diagd figure is the median over --diagd-repeats daemons (3) of one
call on a daemon of its own that has never seen the capture (isolated `diagd serve`, warmed up with
a call on a small corpus capture, so the field catalogue is read and a warm tshark waits, then 2 s
idle): what a user of a running daemon waits for when asking first.

Rows, per capture (the control-plane query first, the user-plane one in brackets; both are in
CONTROL and USER below):
(F) pcap_frames_by_filter FILTER [tcp] limit 500: diagd (a single pass beside the sharkd load, rows
    marked provisional where a later frame may change them) vs `tshark -r F -Y FILTER | head -500`
    (plain tshark, block-buffered pipe) vs the peer (`tshark -l -T tabs`, killed once 500 rows are in).
(T) pcap_timeline of three Diameter fields [gtp.teid, ip.dst, tcp.seq of gtp], limit 200: diagd vs
    `tshark -T fields | head -200` vs the peer (`-l -T fields`, killed at 200 rows): the daemon has
    never run these fields (their timeline runs on the standby of any field list, fields_standby.py).
    (T2) the same on a daemon that has run a timeline of these fields before (on another small capture).
(S) pcap_text_search of a word over 200 Diameter answers [a word ~4 in 5 GTP-U frames hold]: diagd (the
    `tshark -V` text of a single pass beside the load, matches marked provisional where a second pass
    may read otherwise) vs `tshark -V | head` and the peer (`-l -V`, killed once 200 frames are in).
    (S2) the same on a daemon that has run a text search before (its warm tshark for `-V` waits).
(I) pcap_info (count and time span from capinfos; the protocols within 1 s or on a later call) vs
    capinfos alone.
The ratio is the better of the other two divided by diagd (> 1: diagd is faster).
(L) the load behind those first answers, on a daemon of its own: the first page's time, then how long
    until sharkd has loaded the capture (diagd_status polled every 0.25 s), sharkd's RSS and the
    daemon's own RSS (VmRSS of `diagd serve`) once loaded, next to one cold `tshark -r F -Y FILTER`
    pass. With `--huge` a ~5 GB control-plane capture (`--huge-mb`, built the same way: ~1,850
    copies, minutes to build once) is measured after the 1 GB one: growth past memory-sized captures.
--planes control or user measures one kind only.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _daemon import isolated_daemon
from _pcap_tools import (
    build_capture,
    build_dense_capture,
    dense_sources,
    diagd_client,
    log,
    run_cold,
    run_peer,
    vmrss_mb,
    warm_page_cache,
)
from _proc import wait_until_quiet

from tests.pcaps import PCAPS  # the test corpus' cache (_pcap_tools put the repository on sys.path)

PCAPS_DIR = PCAPS
SOURCE = "magma_gx_gy_combined_04.pcapng"
WARM_UP = "adrian_registration_reject.pcap"
CACHE_DIR = Path("/var/tmp/diagd-bench-cache")
PAGE, TIMELINE_PAGE, SEARCH_FRAMES = 500, 200, 200


@dataclass(frozen=True)
class Workload:
    """The queries of one kind of capture."""

    plane: str  # "control" or "user"
    filter: str  # (F)
    timeline_filter: str  # (T)
    timeline_fields: tuple[str, ...]
    seen_on: str  # (T2, S2): another (small) corpus capture the daemon ran the timeline and a search on
    search_filter: str  # (S)
    search_query: str


CONTROL = Workload("control", "diameter.cmd.code == 272", "diameter",
                   ("diameter.Session-Id", "diameter.Result-Code", "diameter.CC-Request-Type"),
                   "magma_gx_gy_combined_03.pcapng", "diameter.flags.request == 0", "Origin-Realm")
# Dense: every frame matches `gtp`, ~4 in 5 hold the query (their TCP layer's first line).
USER = Workload("user", "tcp", "gtp", ("gtp.teid", "ip.dst", "tcp.seq"), "5greplay_oai.pcap", "gtp",
                "Transmission Control Protocol")


def head_argv(path: Path, *args: str) -> list[str]:
    return ["tshark", "-n", "-r", str(path), *args]


def timed(fn: Callable[[], Any], n: int) -> float:
    runs = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


async def first_call(args: argparse.Namespace, work: Workload, tool: str, call_args: dict[str, Any], *,
                     seen_fields: bool = False, seen_search: bool = False) -> tuple[float, dict[str, Any]]:
    """The median over --diagd-repeats daemons of one call on a capture the daemon never saw (each daemon
    warmed up on a small one; with seen_fields, also by a timeline of the same fields on another small
    capture: a daemon in use that has run this field list before; seen_search, the same for a text search)."""
    import trio

    config = f"[daemon]\nallowed_dirs = {json.dumps([str(args.cache_dir), str(args.pcaps_dir)])}\n" \
             "call_timeout_s = 600\n"
    runs: list[tuple[float, dict[str, Any]]] = []
    for _ in range(args.diagd_repeats):
        with isolated_daemon("pcapfresh", config=config) as daemon:
            async with diagd_client(daemon.env) as client:
                await client.call("pcap_info", {"pcap_path": str(args.pcaps_dir / WARM_UP)})
                seen_on = str(args.pcaps_dir / work.seen_on)
                if seen_fields:
                    await client.call("pcap_timeline", {"pcap_path": seen_on, "display_filter": work.timeline_filter,
                                                        "fields": list(work.timeline_fields)})
                if seen_search:
                    await client.call("pcap_text_search", {"pcap_path": seen_on, "display_filter": work.search_filter,
                                                           "query": work.search_query, "limit": 20})
                # What a daemon in use has done: its background starts (standbys, the warm-up's load) are
                # over. A fixed 2 s was not enough on 2 cores: standbys were still starting.
                await trio.to_thread.run_sync(wait_until_quiet, daemon.proc.pid)
                took, payload, _ = await client.call(tool, call_args)
                runs.append((took, payload))
    runs.sort(key=lambda run: run[0])
    return runs[len(runs) // 2]


async def measure(args: argparse.Namespace, label: str, path: Path, work: Workload) -> list[dict[str, Any]]:
    warm_page_cache(path)
    rows: list[dict[str, Any]] = []

    def row(key: str, metric: str, head_s: float, peer_s: float | None, diagd_s: float, answer: dict[str, Any]
            ) -> None:
        best = min(v for v in (head_s, peer_s) if v is not None)
        rows.append({"capture": label, "plane": work.plane, "key": key, "metric": metric, "tshark_head_s": head_s,
                     "peer_s": peer_s, "diagd_s": diagd_s, "ratio": best / diagd_s,
                     "answer": {k: answer.get(k) for k in ("served_by", "total", "total_exact", "exact",
                                                           "protocols_ready", "packet_count")}})

    if "F" in args.rows:
        await frames_row(args, label, path, work, row)
    if "T" in args.rows:
        await timeline_rows(args, label, path, work, row)
    if "S" in args.rows:
        await search_rows(args, label, path, work, row)
    if "I" in args.rows:
        await info_row(args, label, path, work, row)
    if "L" in args.rows:
        rows.append(await load_row(args, label, path, work))
    return rows


Row = Callable[[str, str, float, float | None, float, dict[str, Any]], None]


async def frames_row(args: argparse.Namespace, label: str, path: Path, work: Workload, row: Row) -> None:
    import trio

    n = args.cold_repeats
    log(f"{label}: (F) frames_by_filter")
    head_s = await trio.to_thread.run_sync(lambda: timed(lambda: run_peer(head_argv(path, "-Y", work.filter), PAGE),
                                                         n))
    peer_s = await trio.to_thread.run_sync(lambda: timed(
        lambda: run_peer(head_argv(path, "-l", "-Y", work.filter, "-T", "tabs"), PAGE), n))
    diagd_s, answer = await first_call(args, work, "pcap_frames_by_filter",
                                       {"pcap_path": str(path), "display_filter": work.filter, "limit": PAGE})
    if len(answer["frames"]) != PAGE:
        raise RuntimeError(f"diagd gave {len(answer['frames'])} rows, not {PAGE}")
    row("F", f"first frames_by_filter {work.filter!r} (limit {PAGE})", head_s, peer_s, diagd_s, answer)


async def timeline_rows(args: argparse.Namespace, label: str, path: Path, work: Workload, row: Row) -> None:
    import trio

    n = args.cold_repeats
    log(f"{label}: (T) timeline")
    fields = [a for f in work.timeline_fields for a in ("-e", f)]
    head_s = await trio.to_thread.run_sync(lambda: timed(
        lambda: run_peer(head_argv(path, "-Y", work.timeline_filter, "-T", "fields", "-e", "frame.number", *fields),
                         TIMELINE_PAGE), n))
    peer_s = await trio.to_thread.run_sync(lambda: timed(
        lambda: run_peer(head_argv(path, "-l", "-Y", work.timeline_filter, "-T", "fields", "-e", "frame.number",
                                   *fields), TIMELINE_PAGE), n))
    timeline = {"pcap_path": str(path), "display_filter": work.timeline_filter, "fields": list(work.timeline_fields),
                "limit": TIMELINE_PAGE}
    diagd_s, answer = await first_call(args, work, "pcap_timeline", timeline)
    row("T", f"first timeline of 3 fields (limit {TIMELINE_PAGE})", head_s, peer_s, diagd_s, answer)
    diagd_s, answer = await first_call(args, work, "pcap_timeline", timeline, seen_fields=True)
    row("T2", "the same, fields timelined before on another capture", head_s, peer_s, diagd_s, answer)


async def search_rows(args: argparse.Namespace, label: str, path: Path, work: Workload, row: Row) -> None:
    import trio

    n = args.cold_repeats
    log(f"{label}: (S) text search")
    head_s = await trio.to_thread.run_sync(lambda: timed(
        lambda: run_peer(head_argv(path, "-Y", work.search_filter, "-V"), SEARCH_FRAMES, frames=True), n))
    peer_s = await trio.to_thread.run_sync(lambda: timed(
        lambda: run_peer(head_argv(path, "-l", "-Y", work.search_filter, "-V"), SEARCH_FRAMES, frames=True), n))
    search = {"pcap_path": str(path), "display_filter": work.search_filter, "query": work.search_query,
              "limit": SEARCH_FRAMES, "max_matches": 1000, "snippet_context_chars": 0, "max_bytes": 2 << 20}
    diagd_s, answer = await first_call(args, work, "pcap_text_search", search)
    if answer.get("frames_scanned") != SEARCH_FRAMES:
        raise RuntimeError(f"diagd searched {answer.get('frames_scanned')} frames, not {SEARCH_FRAMES}")
    row("S", f"first text_search over {SEARCH_FRAMES} frames ({answer.get('match_count')} matches)", head_s, peer_s,
        diagd_s, answer)
    diagd_s, answer = await first_call(args, work, "pcap_text_search", search, seen_search=True)
    row("S2", "the same, a text search run before on another capture", head_s, peer_s, diagd_s, answer)


async def info_row(args: argparse.Namespace, label: str, path: Path, work: Workload, row: Row) -> None:
    import trio

    n = args.cold_repeats
    log(f"{label}: (I) pcap_info")
    import subprocess

    capinfos_s = await trio.to_thread.run_sync(lambda: timed(lambda: subprocess.run(
        ["capinfos", "-M", "-T", "-r", "-c", "-a", "-e", str(path)], capture_output=True, check=True), n))
    diagd_s, answer = await first_call(args, work, "pcap_info", {"pcap_path": str(path)})
    row("I", "first pcap_info (capinfos count and span)", capinfos_s, None, diagd_s, answer)


async def load_row(args: argparse.Namespace, label: str, path: Path, work: Workload) -> dict[str, Any]:
    """(L): the first page, the whole load behind it, and what it holds once loaded."""
    import trio

    log(f"{label}: (L) load")
    cold_s = await trio.to_thread.run_sync(lambda: timed(lambda: run_cold(head_argv(path, "-Y", work.filter)), 1))
    config = f"[daemon]\nallowed_dirs = {json.dumps([str(args.cache_dir), str(args.pcaps_dir)])}\n" \
             "call_timeout_s = 600\n"
    with isolated_daemon("pcapload", config=config) as daemon:
        async with diagd_client(daemon.env) as client:
            await client.call("pcap_info", {"pcap_path": str(args.pcaps_dir / WARM_UP)})
            start = time.perf_counter()
            first_s, answer, _ = await client.call("pcap_frames_by_filter", {"pcap_path": str(path),
                                                                             "display_filter": work.filter,
                                                                             "limit": 20})
            details: dict[str, Any] = {}
            while True:
                _, status, _ = await client.call("diagd_status", {})
                actor = next((a for a in status["actors"] if a["kind"] == "pcap"
                              and a["details"].get("path") == str(path)), None)
                details = actor["details"] if actor else {}
                states = [w["state"] for w in details.get("workers", [])]
                if states and "loading" not in states:
                    break
                if time.perf_counter() - start > 3600:
                    raise RuntimeError(f"{path} did not load within an hour: {details}")
                await trio.sleep(0.25)
            loaded_s = time.perf_counter() - start
            daemon_mb = vmrss_mb(daemon.proc.pid)
    return {"capture": label, "plane": work.plane, "key": "L", "metric": "load: first page / loaded / sharkd load_s",
            "tshark_head_s": cold_s, "peer_s": None, "diagd_s": loaded_s, "ratio": cold_s / loaded_s,
            "first_page_s": first_s,
            "sharkd_load_s": details.get("load_s"), "sharkd_rss_mb": (details.get("sharkd_rss_bytes") or 0) / 2**20,
            "workers": [w["state"] for w in details.get("workers", [])], "daemon_rss_mb": daemon_mb,
            "answer": {"served_by": answer.get("served_by"), "total": answer.get("total"),
                       "total_exact": answer.get("total_exact")}}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import trio

    src = args.pcaps_dir / SOURCE
    captures: list[tuple[str, Path, Workload]] = []
    sizes = [("55 MB", args.size_mb), ("1 GB", args.big_mb), ("5 GB", args.huge_mb if args.huge else 0)]
    for label, mb in sizes:
        if not mb:
            continue
        if "control" in args.planes:
            copies = max(1, math.ceil(mb * 1024 * 1024 / src.stat().st_size))
            path, _ = await trio.to_thread.run_sync(lambda c=copies: build_capture(src, c, 0, args.cache_dir))
            captures.append((label, path, CONTROL))
        if "user" in args.planes and label != "5 GB":
            path, _ = await trio.to_thread.run_sync(lambda m=mb: build_dense_capture(dense_sources(), m,
                                                                                      args.cache_dir))
            captures.append((label, path, USER))
    rows = []
    for label, path, work in captures:
        rows += await measure(args, f"{label} ({path.stat().st_size / 1e6:.0f} MB)", path, work)
    return {"rows": rows, "config": {"workloads": {w.plane: w.__dict__ for w in (CONTROL, USER)}, "page": PAGE,
                                     "cold_repeats": args.cold_repeats, "diagd_repeats": args.diagd_repeats,
                                     "captures": {f"{w.plane} {label}": str(path) for label, path, w in captures}}}


def render(report: dict[str, Any]) -> str:
    """The rows of both kinds of capture side by side: a line per size and row."""
    by: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in report["rows"]:
        by.setdefault((r["capture"].split(" (")[0], r["key"]), {})[r["plane"]] = r
    lines = [f"{'size':<6} {'row':<5} {'plane':<8} {'capture':<9} {'metric':<52} {'tshark|head':>11} {'peer':>7} "
             f"{'diagd':>7} {'vs better':>9}  served_by"]
    for (size, key), planes in by.items():
        for plane in ("control", "user"):
            r = planes.get(plane)
            if r is None:
                continue
            size_mb = r["capture"].split(" (")[1].rstrip(")")
            head = f"{size:<6} ({key}){'':<{3 - len(key)}} {plane:<8} {size_mb:<9}"
            if key == "L":
                lines.append(f"{head} load: first page {r['first_page_s']:.2f}s, loaded after {r['diagd_s']:.2f}s "
                             f"(sharkd load_s {r['sharkd_load_s']}), cold pass {r['tshark_head_s']:.2f}s; sharkd "
                             f"RSS {r['sharkd_rss_mb']:.0f} MB {r['workers']}, daemon RSS {r['daemon_rss_mb']:.0f} MB")
                continue
            peer = f"{r['peer_s']:.2f}s" if r["peer_s"] is not None else "-"
            lines.append(f"{head} {r['metric']:<52} {r['tshark_head_s']:>10.2f}s {peer:>7} {r['diagd_s']:>6.2f}s "
                         f"{r['ratio']:>8.2f}x  {r['answer']['served_by']}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size-mb", type=float, default=50)
    parser.add_argument("--big-mb", type=float, default=1024)
    parser.add_argument("--no-big", action="store_true")
    parser.add_argument("--huge", action="store_true", help="also a ~5 GB capture (built once, minutes)")
    parser.add_argument("--huge-mb", type=float, default=5120)
    parser.add_argument("--cold-repeats", type=int, default=3)
    parser.add_argument("--diagd-repeats", type=int, default=3, help="fresh daemons per diagd figure (median)")
    parser.add_argument("--planes", default="control,user", help="kinds of capture: control (Diameter), user "
                        "(dense GTP-U), or both (default)")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument("--pcaps-dir", type=Path, default=PCAPS_DIR)
    parser.add_argument("--rows", default="FTSIL", help="rows to measure: F (first page), T (timelines), S (text "
                        "searches), I (pcap_info), L (load); all by default")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.no_big:
        args.big_mb = 0
    args.planes = set(args.planes.split(","))
    if not args.planes or args.planes - {"control", "user"}:
        parser.error("--planes takes control, user or control,user")
    repo = Path(__file__).resolve().parent.parent
    if args.cache_dir.resolve() == repo or repo in args.cache_dir.resolve().parents:
        parser.error("--cache-dir must be outside the repository (no captures in the repo)")
    import trio

    report = trio.run(run, args)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
