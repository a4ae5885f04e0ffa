"""Index bench: a capture's persistent index (pcap_index, actors/pcap/index/) at 55 MB and 1 GB, on the
control-plane and user-plane captures of bench/pcap_fresh.py (built once, cached outside the repository).

Run from the repository root:

    .venv/bin/python bench/pcap_index.py [--size-mb 50] [--big-mb 1024 | --no-big] [--planes control,user]
                                         [--copies 10 | --huge] [--only-copies]

A capture of --copies (10; --huge: 50) copies of the 1 GB user-plane capture (bench/_pcap_tools.py:
build_scaled_capture) is measured too, its index built in chunks ([pcap] index_chunk_mb). One two-pass
tshark read of it cannot run here (tshark's memory grows ~2.8 MB a MB of it: ~28 GB for 10 GB): its
reference (B) is one two-pass read of the 1 GB capture it copies, times the copies (the same frames,
readdressed); the build reads the same bytes.

Rows, per capture, each on a daemon of its own that has never seen it:
(B) the build: pcap_index(wait_s) until ready, against one two-pass tshark read of the same file
    (`tshark -r F -n -2 -T fields -e frame.number`, output read to the end); target <= 1.5x that pass.
(F) while it builds: the first page within the frames indexed so far (index/partial.py), seconds after
    pcap_index began, the page's own seconds and the frames indexed then; reported.
(M) peak memory while it builds and answers rows P, U and T: the daemon and all its children together
    (sum of PSS, each shared page counted once, sampled every 0.1 s; no other capture loaded: the
    warm-up reads the field catalogue only); target <= 1.5 GB.
(P) a page deep in the capture (pcap_frames_by_filter without a filter, limit 500, offsets spread over
    its second half): median of --repeats calls; target <= 0.1 s.
(U) UDP conversations (pcap_stats kind=conversations protocol=udp, from the index's tables): median of
    --repeats calls; target <= 0.1 s.
(T) a timeline of indexed fields (ip.src, udp.srcport, udp.dstport, the Info column; their own filter),
    a page at offsets spread over the capture: median of --repeats calls; target <= 0.1 s.
(I) I/O intervals of 1 s (pcap_stats kind=io, a page of 500), from the index: median of 5 calls; reported.
(R) after a restart (a new daemon on the same state directory): the first pcap_index and the first deep
    page together, then the first UDP conversations; target <= 1 s each.
(S) the index's size on disk against the capture's.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _daemon import isolated_daemon
from _pcap_tools import (
    build_capture,
    build_dense_capture,
    build_scaled_capture,
    dense_sources,
    diagd_client,
    log,
    packet_count,
    run_cold,
)
from _proc import children, rss_mb
from _report import finish_rows

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.pcaps import PCAPS

CACHE_DIR = Path("/var/tmp/diagd-bench-cache")
SOURCE = "magma_gx_gy_combined_04.pcapng"
PAGE = 500
TIMELINE_FIELDS = ["ip.src", "udp.srcport", "udp.dstport", "_ws.col.Info"]
IO_REPEATS = 5


def pss_mb(pid: int) -> float:
    """Proportional set size: the process's own pages plus its share of pages it shares (libwireshark,
    mapped by every tshark and sharkd): summed over processes it counts each page once, where VmRSS
    counted the ~100 MB library once per warm tshark."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return rss_mb(pid)


def tree_rss_mb(pid: int) -> float:
    """Memory of `pid` and every descendant (PSS)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += pss_mb(p)
            todo += [kid for kid, _, _ in children(p)]
        except (OSError, RuntimeError):
            continue
    return total


class PeakSampler:
    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, tree_rss_mb(self.pid))

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


async def measure(args: argparse.Namespace, label: str, path: Path, copied: tuple[Path, int] | None = None
                  ) -> list[dict[str, Any]]:
    """The rows of one capture; `copied`: it is copies of another (that capture, how many): the reference
    pass reads that one, times the copies."""
    import trio

    frames = await trio.to_thread.run_sync(lambda: packet_count(path))
    base, times = copied or (path, 1)
    repeats = 1 if copied else args.cold_repeats
    log(f"{label}: one two-pass tshark read of {base.name} x{repeats}")
    tshark_s = times * statistics.median(
        [(await trio.to_thread.run_sync(lambda: run_cold(["tshark", "-r", str(base), "-n", "-2", "-T", "fields",
                                                          "-e", "frame.number"]))).wall_s
         for _ in range(repeats)])
    dirs = json.dumps([str(args.cache_dir), str(args.pcaps_dir)])
    config = f"[daemon]\nallowed_dirs = {dirs}\ncall_timeout_s = 3600\n"
    offsets = [frames // 2 + (frames // 2 - PAGE) * i // max(1, args.repeats - 1) for i in range(args.repeats)]
    # One state directory for both daemons, outside isolated_daemon's own (removed when its daemon stops).
    state = tempfile.mkdtemp(prefix="diagd-bench-index-state-")
    try:
        return await _measure(args, label, path, frames, tshark_s, config, offsets, state, copied is not None)
    finally:
        shutil.rmtree(state, ignore_errors=True)


async def _measure(args: argparse.Namespace, label: str, path: Path, frames: int, tshark_s: float, config: str,
                   offsets: list[int], state: str, copied: bool) -> list[dict[str, Any]]:
    import trio

    with isolated_daemon("index", config=config, extra_env={"DIAGD_STATE_DIR": state}) as daemon:
        async with diagd_client(daemon.env) as client:
            # Warm-up: the field catalogue (what a first call of any daemon reads), no capture loaded: the
            # memory row is the daemon indexing and answering this capture, not another's sharkd beside it.
            await client.call("pcap_list_fields", {"query": "ip.src"})
            log(f"{label}: pcap_index until ready")
            with PeakSampler(daemon.proc.pid) as peak:
                start = time.perf_counter()
                first: tuple[float, float, int] | None = None  # a page while building: when, its seconds, frames
                while True:
                    _, built, _ = await client.call("pcap_index", {"pcap_path": str(path),
                                                                   "wait_s": 600 if first else 1}, timeout_s=700)
                    if built["state"] not in ("locating", "queued", "building"):
                        break
                    if first is None and (indexed := built.get("pages_from_frames")):
                        took, page, _ = await client.call("pcap_frames_by_filter", {
                            "pcap_path": str(path), "display_filter": "", "limit": PAGE, "offset": indexed - PAGE})
                        if page["served_by"] != "index (being built)":
                            raise RuntimeError(f"a page while building did not come from it: {page['served_by']}")
                        first = (time.perf_counter() - start, took, indexed)
                build_s = time.perf_counter() - start
                if built["state"] != "ready":
                    raise RuntimeError(f"the index was not built: {built}")
                pages, convs, timelines, intervals = await answers(client, path, offsets)
        log(f"{label}: a new daemon on the same state directory")
    with isolated_daemon("index2", config=config, extra_env={"DIAGD_STATE_DIR": state}) as again:
        async with diagd_client(again.env) as client:
            start = time.perf_counter()
            _, found, _ = await client.call("pcap_index", {"pcap_path": str(path)})
            _, page, _ = await client.call("pcap_frames_by_filter", {"pcap_path": str(path), "display_filter": "",
                                                                     "limit": PAGE, "offset": offsets[-1]})
            restart_s = time.perf_counter() - start
            if found["state"] != "ready" or page["served_by"] != "index":
                raise RuntimeError(f"after a restart the index was not found: {found}")
            restart_conv_s = await conversations(client, path)
    size = await trio.to_thread.run_sync(lambda: path.stat().st_size)
    return [
        {"row": "B", "capture": label, "what": "build, wall" + (" (reference: the copied 1 GB read, times the "
                                                                 "copies)" if copied else ""),
         "diagd_s": round(build_s, 2), "tshark_s": round(tshark_s, 2), "chunks": (built.get("chunked") or {}).get(
             "chunks"), "seam_frames": (built.get("chunked") or {}).get("seam_frames"),
         "ratio": round(build_s / tshark_s, 2), "target": "<= 1.5x one two-pass tshark read",
         "met": build_s <= 1.5 * tshark_s},
        {"row": "F", "capture": label, "what": "while building: the first page from the frames indexed so far "
                                               "(seconds after pcap_index; the page's seconds; frames indexed)",
         "diagd_s": round(first[0], 1) if first else None, "page_s": round(first[1], 4) if first else None,
         "frames": first[2] if first else None, "target": "reported"},
        {"row": "M", "capture": label, "what": "peak memory (PSS), daemon + children, building and answering",
         "mb": round(peak.peak), "target": "<= 1536 MB", "met": peak.peak <= 1536},
        {"row": "P", "capture": label, "what": f"deep page (limit {PAGE}), median of {len(pages)}",
         "diagd_s": round(statistics.median(pages), 4), "max_s": round(max(pages), 4), "target": "<= 0.1 s",
         "met": statistics.median(pages) <= 0.1},
        {"row": "U", "capture": label, "what": f"UDP conversations, median of {len(convs)}",
         "diagd_s": round(statistics.median(convs), 4), "max_s": round(max(convs), 4), "target": "<= 0.1 s",
         "met": statistics.median(convs) <= 0.1},
        {"row": "T", "capture": label, "what": f"timeline of indexed fields (limit {PAGE}), median of {len(timelines)}",
         "diagd_s": round(statistics.median(timelines), 4), "max_s": round(max(timelines), 4),
         "target": "<= 0.1 s", "met": statistics.median(timelines) <= 0.1},
        {"row": "I", "capture": label, "what": f"I/O intervals of 1 s (limit {PAGE}), median of {len(intervals)}",
         "diagd_s": round(statistics.median(intervals), 4), "max_s": round(max(intervals), 4),
         "target": "reported (a pass over every frame's time and length)"},
        {"row": "R", "capture": label, "what": "after a restart: pcap_index + first deep page",
         "diagd_s": round(restart_s, 3), "target": "<= 1 s", "met": restart_s <= 1.0},
        {"row": "R", "capture": label, "what": "after a restart: first UDP conversations",
         "diagd_s": round(restart_conv_s, 3), "target": "<= 1 s", "met": restart_conv_s <= 1.0},
        {"row": "S", "capture": label, "what": "index size", "mb": round(found["index_bytes"] / 1e6, 1),
         "capture_mb": round(size / 1e6, 1), "frames": frames},
    ]


async def answers(client: Any, path: Path, offsets: list[int]
                  ) -> tuple[list[float], list[float], list[float], list[float]]:
    """Seconds of each deep page, UDP conversations, timeline and I/O intervals call (rows P, U, T, I)."""
    pages = []
    for offset in offsets:
        took, page, _ = await client.call("pcap_frames_by_filter", {
            "pcap_path": str(path), "display_filter": "", "limit": PAGE, "offset": offset})
        if page["served_by"] != "index" or page["frames"][0]["number"] != offset + 1:
            raise RuntimeError(f"a deep page did not come from the index: {page['served_by']}")
        pages.append(took)
    convs = [await conversations(client, path) for _ in offsets]
    timelines = []
    for offset in offsets:
        took, page, _ = await client.call("pcap_timeline", {
            "pcap_path": str(path), "fields": TIMELINE_FIELDS, "limit": PAGE, "offset": offset // 2})
        if page.get("served_by") != "index":
            raise RuntimeError(f"a timeline did not come from the index: {page.get('served_by')}")
        timelines.append(took)
    intervals = []
    for offset in offsets[:IO_REPEATS]:  # one streamed pass over the frames each: seconds at 10 GB
        took, page, _ = await client.call("pcap_stats", {"pcap_path": str(path), "kind": "io", "interval_ms": 1000,
                                                         "limit": PAGE, "offset": offset % 1000})
        if not str(page.get("method", "")).startswith("index:"):
            raise RuntimeError(f"I/O intervals did not come from the index: {page.get('method')}")
        intervals.append(took)
    return pages, convs, timelines, intervals


async def conversations(client: Any, path: Path) -> float:
    """One pcap_stats UDP conversations call, which must come from the index: its seconds."""
    took, answer, _ = await client.call("pcap_stats", {"pcap_path": str(path), "kind": "conversations",
                                                       "protocol": "udp", "limit": 200})
    if not str(answer.get("method", "")).startswith("index:"):
        raise RuntimeError(f"UDP conversations did not come from the index: {answer.get('method')}")
    return float(took)


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import trio

    src = args.pcaps_dir / SOURCE
    captures: list[tuple[str, Path]] = []
    for label, mb in (("55 MB", args.size_mb), ("1 GB", 0 if args.no_big else args.big_mb)):
        if not mb:
            continue
        if "control" in args.planes:
            copies = max(1, math.ceil(mb * 1024 * 1024 / src.stat().st_size))
            path, _ = await trio.to_thread.run_sync(lambda c=copies: build_capture(src, c, 0, args.cache_dir))
            captures.append((f"control {label}", path))
        if "user" in args.planes:
            path, _ = await trio.to_thread.run_sync(
                lambda m=mb: build_dense_capture(dense_sources(), m, args.cache_dir))
            captures.append((f"user {label}", path))
    rows: list[dict[str, Any]] = []
    for label, path in [] if args.only_copies else captures:
        rows += await measure(args, label, path)
    copies = 50 if args.huge else args.copies
    if copies and "user" in args.planes:
        base, _ = await trio.to_thread.run_sync(lambda: build_dense_capture(dense_sources(), 1024, args.cache_dir))
        scaled, _ = await trio.to_thread.run_sync(lambda: build_scaled_capture(base, copies, args.cache_dir))
        rows += await measure(args, f"user {copies} GB", scaled, (base, copies))
    return rows


def main() -> int:
    import trio

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=50)
    parser.add_argument("--big-mb", type=float, default=1024)
    parser.add_argument("--no-big", action="store_true")
    parser.add_argument("--planes", default="control,user")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--cold-repeats", type=int, default=3)
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument("--pcaps-dir", type=Path, default=PCAPS)
    parser.add_argument("--copies", type=int, default=10, help="copies of the 1 GB user capture (0: none)")
    parser.add_argument("--huge", action="store_true", help="50 copies")
    parser.add_argument("--only-copies", action="store_true", help="measure the copies' capture alone")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    return finish_rows(trio.run(run, args), args.json)


if __name__ == "__main__":
    sys.exit(main())
