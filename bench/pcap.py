"""pcap benchmark: diagd's warm sharkd worker against cold `tshark` per call and against the
early-stopping per-call tshark method ("peer"), on a >= 50 MB capture and a 1 GB one.

Run from the repository root:

    .venv/bin/python bench/pcap.py [--size-mb 50] [--big-mb 1024 | --no-big] [--json]

The captures. Built once from the real file magma_gx_gy_combined_04.pcapng (Diameter Gx/Gy/S6a,
S1AP, GTP-U; 2.9 MB) in the test corpus (tests/corpus.toml) and cached outside the repository (default
/tmp/diagd-bench-cache/, reused when present): N copies time-shifted with `editcap -t i*40` and
appended with `mergecap -a`, as the corpus' MANIFEST.md shows. One change to that recipe: each
copy's SCTP verification tag is XORed with a per-copy value (copy 0 is untouched). Without it every
copy after the first repeats the first one's SCTP associations with the same TSNs, tshark marks
them "Retransmitted TSN" and never dissects their Diameter or S1AP (1288 Diameter frames in the
whole file instead of N x 1288), which makes filters unrealistically cheap. The build checks that
the Diameter frame count is N times the source's. A second capture built the same way but shifted
by one day (same work, different sha256) serves the fresh-capture `pcap_info` and the two-client
measurements. The big capture (--big-mb, default 1024 MiB: 371 copies) is built the same way.
That is the control plane. Every row is measured again on the user plane (--planes; a run of its own,
on a daemon of its own): dense GTP-U captures of the same sizes, copies of the GTP-U frames of
5greplay_oai.pcap and oaifed_cotsue_core.pcap (TCP, TLS, HTTP, DNS, ICMP in the tunnel), their inner
IPv4 addresses changed per copy so each copy's TCP connections are new (else tshark marks them
retransmissions and never dissects their TLS; _pcap_tools.build_dense_capture); 104k frames at 53 MB,
all GTP-U, 9 in 10 TCP. Its queries (USER below): `tcp` for the packet lists, gtp.teid / ip.dst /
tcp.seq for the timeline, `Transmission Control Protocol` in `gtp` for the text search (in ~4 of 5
frames), new filters made of `tcp`.

The three columns, measured side by side in one run. diagd: wall time of an MCP SDK client call,
`Client(StdioServerParameters(diagd mcp --no-autostart), mode="legacy")` under trio, against an
isolated `diagd serve` with its own runtime/state dirs and config (default settings). cold: one
tshark process per call with its output read to the end, the way a plain wrapper works. peer: the
per-call tshark method of an MCP server that kills tshark once `limit` rows have arrived
(`tshark -n -l -r F -Y FILTER -T tabs` for packet lists, `-T fields -e ...` for timelines, `-V` for
frame trees and text), timed until the rows are in; where early stop does not apply, peer = cold.
"median" is over --cold-repeats cold runs and --repeats diagd calls. The ratio column is the better
of cold and peer divided by diagd (> 1: diagd is faster); every timed row must have it >= 1
(issue 12) besides its own target. Each section, each new filter of (b) and the new filter of (e)
begin once the daemon and its children are quiet (_proc.wait_until_quiet: a pass left running
after an early answer, a capture loading, standbys starting), as the tshark runs compared with them
run alone; `--only c,e,...` runs some sections (the first query, (f) and (a), always runs).

(a) repeated pcap_frames_by_filter (limit 500) and pcap_timeline (limit 200, same arguments):
    target >= 20x faster than cold.
(b) the first page (limit 20) of a new filter on the loaded capture, each repeat a filter string
    never used before (a constant that changes nothing, e.g. `frame.len != 100007`, so no cache
    answers), in three kinds: matches early (Diameter: the first 20 in the first frames), matches
    late (Diameter of the last copy only, `frame.time_relative >= ...`: the last ~5% of the file)
    and no match (a full pass for everyone). Cold: the same tshark command as the peer, read to the
    end. Target >= 1x the better of cold/peer ("never slower than one cold full pass" when late).
(c) pcap_frame_detail of one frame (not fetched before) vs `tshark -Y frame.number==N -V`: target
    >= 100x faster than cold; the peer stops once the frame's tree is in.
(d) pcap_info wall time, on a fresh capture (hash + load + analysis) and on a loaded one: target
    <= 2.5 s; cold column: `capinfos -H` + one tshark pass with `-z io,phs -z conv,...`.
(e) pcap_text_search over 200 frames (limit=200, a query that does not stop early; offsets 0 and
    200) of a filter the capture has counted (its sharkd pass over): target <= 2 s; cold: one
    `tshark -Y FILTER -V` pass, output read to the end, first 200 frames searched; the peer stops
    after 200 frames. A second row times the same search at once after a new filter's first page,
    while that filter's sharkd pass still runs.
(f) the first query on a fresh capture (the daemon never saw the file) vs cold tshark with the
    same filter: target <= 1.3x the cold time. The daemon is warmed up first with a call on a small
    capture (Wireshark's field catalogue is read once per daemon, not per capture).
(g) two clients on two different captures, a new filter each, concurrently vs one after the other:
    concurrent wall time / sequential sum (0.5 = fully parallel on >= 2 cores, 1.0 = serialized).
    Cold and peer columns: two tshark processes the same way. Reported: its target (<= 0.75) was
    retired by issue 24 (on 2 cores two dissection passes share the cores; (j) and (k) stay).
(h) sharkd RSS per loaded capture (`diagd_status` actor details `sharkd_rss_bytes`; a list of one
    per worker is summed) next to the peak RSS of one cold tshark run. No target: reported.
(i) two new filters on ONE capture from two clients, concurrently vs one after the other (matches
    early; no match): concurrent wall / sequential wall. Reported: its target (<= 0.6) was retired
    by issue 24, as (g)'s.
(j) pcap_frame_detail of a frame not fetched before, sent by a second client 0.3 s into a
    no-match new-filter pass on the same capture: its latency, target <= 50 ms.
(k) a burst of --burst-clients x --burst-calls (5 x 9 = 45) different new filters, all at once,
    from several MCP client sessions on one capture: how many were answered, refused BUSY (with or
    without `retry_after_s` in the error details), TIMEOUT or another error. Target: no TIMEOUT, no
    other error, every BUSY says when to retry.
(l) the 1 GB capture: the first answer on the fresh capture (the (f) query) vs one cold tshark
    pass (target <= 1.1x), sharkd load time (`load_s`), the first page of a new filter (matches
    early), sharkd RSS. A second table puts load time, first answer, new filter and sharkd RSS of
    the 55 MB and the 1 GB capture side by side: growth vs size factor, target at most linear.
(m) the daemon's own RSS (VmRSS of `diagd serve`, children not counted), idle with the clients
    connected before any pcap call (target <= 60 MB), after the 55 MB rows (a)-(j) and after all
    the pcap work, once the pcap actors are idle again (<= 90 MB both).

Pages may carry `total_exact`/`total_at_least` (a first page answered before the whole file was
filtered): both are optional here. Output: the tables, or with --json one JSON object with the same
rows plus the raw samples. Exit status 0 even when targets are missed.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from _daemon import isolated_daemon
from _pcap_tools import (
    DENSE_SOURCES,
    SHIFT_S,
    ColdRun,
    DiagdClient,
    FirstFramesSearch,
    PeerRun,
    build_capture,
    build_dense_capture,
    check_total,
    count_frames,
    dense_sources,
    diagd_client,
    first_numbers,
    log,
    packet_count,
    run_cold,
    run_peer,
    tabs_argv,
    tool_output,
    tshark_filter,
    vmrss_mb,
    warm_page_cache,
)
from _proc import wait_until_quiet

from tests.pcaps import PCAPS  # the test corpus' cache (_pcap_tools put the repository on sys.path)

T = TypeVar("T")
PCAPS_DIR = PCAPS
SOURCE = "magma_gx_gy_combined_04.pcapng"
WARMUP_SOURCE = "magma_gx_gy_combined_03.pcapng"
CACHE_DIR = Path("/var/tmp/diagd-bench-cache")  # the one pcap_fresh.py builds into: one set of big files

PAGE = 500  # frames_by_filter limit: the tool's default
NEW_PAGE = 20  # the first page of a new filter


@dataclass(frozen=True)
class Workload:
    """The queries of one kind of capture: realistic work on it."""

    plane: str  # "control" or "user"
    filter: str  # (f), (a), (c), (g), (l): a filter with many matches
    timeline_fields: tuple[str, ...]
    text_filter: str  # (e)
    text_query: str | None  # (e); None: the subscriber (IMSI...) of a Diameter Session-Id the timeline gave
    base: str  # the protocol the new filters of (b), (i), (j), (l) are made of
    burst_protos: tuple[str, ...]  # (k): early new filters of these
    source: str  # what the capture is copies of


CONTROL = Workload("control", "diameter.cmd.code == 272",  # Credit-Control (Gx + Gy)
                   ("diameter.Session-Id", "diameter.Result-Code", "diameter.CC-Request-Type"),
                   "diameter.flags.request == 0", None, "diameter",  # Diameter answers
                   ("diameter", "sctp", "s1ap", "gtp", "ip"), "SCTP-retagged copies of " + SOURCE)
# Dense user plane: every frame GTP-U, ~4 in 5 TCP inside; the text query is in most of them.
USER = Workload("user", "tcp", ("gtp.teid", "ip.dst", "tcp.seq"), "gtp", "Transmission Control Protocol", "tcp",
                ("tcp", "gtp", "ip", "udp", "tls"),
                "readdressed copies of the GTP-U frames of " + " + ".join(DENSE_SOURCES))
DETAIL_DELAY_S = 0.3  # (j): how far into the filter pass the frame-detail call is sent
LOAD_WAIT_S = 900.0  # (l): how long the 1 GB capture may take to load


# --------------------------------------------------------------------------- results


# The concurrency targets of (g) and (i), retired by issue 24: what stays is that cheap calls never
# wait behind a pass (j) and that no call times out under a burst (k).
RETIRED = "reported (target retired)"


@dataclass
class Row:
    key: str
    metric: str
    cold_s: float | None = None
    peer_s: float | None = None
    diagd_s: float | None = None
    ratio: float | None = None  # min(cold, peer) / diagd: > 1 means diagd is faster; None: not a time
    target: str = ""
    met: bool | None = None
    note: str = ""
    unit: str = "s"  # "s", "MB" or "ratio"
    diagd_text: str | None = None  # shown instead of diagd_s (an error, counts)
    peer_text: str | None = None  # shown instead of peer_s ("= cold" where early stop does not apply)


def median(values: list[float]) -> float:
    return statistics.median(values)


def sharkd_rss_mb(details: dict[str, Any]) -> float | None:
    """A capture's sharkd RSS in MiB from its actor details: `sharkd_rss_bytes` as one number, or a
    list/mapping of numbers (one per worker: summed)."""
    rss = details.get("sharkd_rss_bytes")
    if isinstance(rss, dict):
        rss = list(rss.values())
    if isinstance(rss, list):
        numbers = [v for v in rss if isinstance(v, int | float)]
        rss = sum(numbers) if numbers else None
    return None if not isinstance(rss, int | float) else rss / 2**20


def timed_row(key: str, metric: str, cold: float | None, peer: float | None, diagd: float | None, *,
              target: str = "", ok: bool | None = None, note: str = "", peer_is_cold: bool = False) -> Row:
    """A time row: the ratio against the better of cold and peer must be >= 1 (issue 12) and `ok`
    (the row's own target, written in `target`) must hold."""
    if peer_is_cold:
        peer = cold
    best = min((v for v in (cold, peer) if v is not None), default=None)
    ratio = best / diagd if best is not None and diagd else None
    met = ratio is not None and ratio >= 1.0 and ok is not False
    return Row(key, metric, cold, peer, diagd, ratio, "; ".join(t for t in (target, ">= 1x best") if t), met, note,
               peer_text="= cold" if peer_is_cold else None)


def error_row(key: str, metric: str, cold: float | None, peer: float | None, payload: dict[str, Any],
              took: float, target: str, note: str = "") -> Row:
    text = f"{payload.get('code', 'ERROR')} after {fmt_time(took)}"
    return Row(key, metric, cold, peer, None, None, target, False, note or str(payload.get("message", ""))[:200],
               diagd_text=text)


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1000
    if ms < 10:
        return f"{ms:.2f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    return f"{seconds:.2f} s"


def fmt_value(row: Row, value: float | None) -> str:
    if value is None:
        return "-"
    if row.unit == "ratio":
        return f"{value:.2f}"
    return f"{value:.0f} MB" if row.unit == "MB" else fmt_time(value)


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    if ratio >= 1:
        return f"{ratio:.0f}x faster" if ratio >= 100 else f"{ratio:.1f}x faster"
    return f"{1 / ratio:.2f}x slower"


def table(header: tuple[str, ...], cells: Sequence[tuple[str, ...]]) -> list[str]:
    rows = [header, *cells]
    widths = [max(len(c[i]) for c in rows) for i in range(len(header))]
    lines = []
    for i, row in enumerate(rows):
        lines.append(" | ".join([row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:],
                                                                                         strict=True))]))
        if i == 0:
            lines.append("-+-".join("-" * w for w in widths))
    return lines


def render_table(report: dict[str, Any]) -> str:
    cap = report["capture"]
    cfg = report["config"]
    rows = [Row(**r) for r in report["rows"]]
    cells = []
    for r in rows:
        met = "-" if r.met is None else ("yes" if r.met else "NO")
        cells.append((f"({r.key}) {r.metric}", fmt_value(r, r.cold_s), r.peer_text or fmt_value(r, r.peer_s),
                      r.diagd_text or fmt_value(r, r.diagd_s), fmt_ratio(r.ratio), r.target or "-", met))
    lines = [
        f"diagd pcap benchmark, {cfg.get('plane', 'control')} plane, on {cap['path']}",
        f"  {cap['size_mb']:.1f} MB, {cap['frames']} frames ({cap['copies']} time-shifted {cap['source']}), "
        f"{cap['base_frames']} {cap['base']} frames; filter {cfg['filter']!r} matches {cap['filter_matches']}",
        f"  cold = one tshark process per call, output read to the end (median of {cfg['cold_repeats']}); peer = "
        f"tshark per call, killed once `limit` rows are in; diagd = MCP SDK client -> diagd mcp -> daemon -> sharkd "
        f"(repeated: median of {cfg['repeats']}; new filters: median of {cfg['new_repeats']}); {os.cpu_count()} CPUs",
        "",
        *table(("metric", "cold tshark", "peer (early-stop)", "diagd", "vs better of cold/peer", "target", "met?"),
               cells),
        f"  run time {cfg.get('run_s', '?')} s; cached captures: {', '.join(cap['all_paths'])}"
        + (f" (built now: {len(cap['built_now'])})" if cap["built_now"] else " (reused)"),
    ]
    growth = report.get("growth") or []
    if growth:
        lines += ["", f"55 MB -> 1 GB: {growth[0]['small_label']} -> {growth[0]['big_label']}, size factor "
                      f"{growth[0]['size_factor']:.1f}x; target: every figure grows at most linearly", ""]
        g_cells = []
        for g in growth:
            def show(v: float | None, unit: str = g["unit"]) -> str:
                return "-" if v is None else (f"{v:.0f} MB" if unit == "MB" else fmt_time(v))

            met = "-" if g["met"] is None else ("yes" if g["met"] else "NO")
            g_cells.append((g["metric"], show(g["small"]), g.get("big_text") or show(g["big"]),
                            "-" if g["growth"] is None else f"{g['growth']:.1f}x",
                            f"<= {g['size_factor']:.1f}x" if g.get("target", True) else "-", met))
        lines += table(("figure", "55 MB", "1 GB", "growth", "target", "met?"), g_cells)
    notes = [r for r in rows if r.note]
    if notes:
        lines.append("")
        for r in notes:
            lines.append(f"  ({r.key}) {r.metric}: {r.note}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the run


@dataclass
class Captures:
    a: Path
    b: Path
    copies: int
    big: Path | None = None
    big_copies: int = 0
    built: list[str] = field(default_factory=list)


def copies_for(size_mb: float, src: Path) -> int:
    return max(1, math.ceil(size_mb * 1024 * 1024 / src.stat().st_size))


def prepare(args: argparse.Namespace, work: Workload = CONTROL) -> Captures:
    if work.plane == "user":
        return prepare_dense(args)
    src = args.pcaps_dir / SOURCE
    if not src.is_file():
        raise SystemExit(f"missing source capture {src}")
    copies = copies_for(args.size_mb, src)
    a, built_a = build_capture(src, copies, 0, args.cache_dir)
    b, built_b = build_capture(src, copies, 1, args.cache_dir)
    caps = Captures(a, b, copies, built=[str(p) for p, built in ((a, built_a), (b, built_b)) if built])
    if args.big_mb:
        caps.big_copies = copies_for(args.big_mb, src)
        caps.big, built_big = build_capture(src, caps.big_copies, 0, args.cache_dir)
        if built_big:
            caps.built.append(str(caps.big))
    for path in (a, b):
        warm_page_cache(path)
    return caps


def prepare_dense(args: argparse.Namespace) -> Captures:
    """The user-plane captures (_pcap_tools.build_dense_capture): the same sizes, the second shifted by a day."""
    sources = dense_sources()
    a, built_a = build_dense_capture(sources, args.size_mb, args.cache_dir)
    b, built_b = build_dense_capture(sources, args.size_mb, args.cache_dir, day=1)
    caps = Captures(a, b, copies_of(a), built=[str(p) for p, built in ((a, built_a), (b, built_b)) if built])
    if args.big_mb:
        caps.big, built_big = build_dense_capture(sources, args.big_mb, args.cache_dir)
        caps.big_copies = copies_of(caps.big)
        if built_big:
            caps.built.append(str(caps.big))
    for path in (a, b):
        warm_page_cache(path)
    return caps


def copies_of(path: Path) -> int:
    """How many SHIFT_S-apart copies a built capture holds (from its time span)."""
    span = re.search(r"Capture duration:\s+([\d.]+) seconds", tool_output(["capinfos", "-u", "-M", str(path)]))
    if not span:
        raise RuntimeError(f"capinfos gave no duration for {path}")
    return int(float(span.group(1)) // SHIFT_S) + 1


class Filters:
    """New filter strings, never used before in this run: a constant that changes nothing varies."""

    def __init__(self, copies: int, base: str = "diameter") -> None:
        self.n = itertools.count(100001)
        self.copies = copies
        self.base = base

    def early(self, proto: str | None = None) -> str:
        return f"{proto or self.base} && frame.len != {next(self.n)}"  # frame.len < 65536: always true

    def late(self, copies: int | None = None) -> str:
        last_copy_s = ((copies or self.copies) - 1) * SHIFT_S
        return f"{self.base} && frame.time_relative >= {last_copy_s} && frame.len != {next(self.n)}"

    def none(self) -> str:
        return f"{self.base} && frame.len == {next(self.n)}"  # never true


class PcapBench:
    """One run: the rows in the order they are measured, sharing the daemon and its clients."""

    def __init__(self, args: argparse.Namespace, caps: Captures, work: Workload = CONTROL) -> None:
        self.args, self.caps, self.work = args, caps, work
        self.A, self.B = caps.a, caps.b
        self.cold_n, self.warm_n, self.new_n = args.cold_repeats, args.repeats, args.new_repeats
        self.rows: list[Row] = []
        self.samples: dict[str, Any] = {}
        self.growth: list[dict[str, Any]] = []
        self.filters = Filters(caps.copies, work.base)
        self.clients: list[DiagdClient] = []
        self.daemon_pid = 0
        self.matched: list[int] = []
        self.cold_f = 0.0
        self.peer_frames = 0.0
        self.cold_detail = self.peer_detail = 0.0
        self.fresh_s: float | None = None
        self.new_early_s: float | None = None
        self.cold_runs_f: list[ColdRun] = []

    # -- helpers -------------------------------------------------------------------------------

    async def cold(self, argv: list[str], **kw: Any) -> ColdRun:
        import trio

        return await trio.to_thread.run_sync(lambda: run_cold(argv, **kw))

    async def peer(self, argv: list[str], limit: int, *, frames: bool = False) -> PeerRun:
        import trio

        return await trio.to_thread.run_sync(lambda: run_peer(argv, limit, frames=frames))

    async def cold_median(self, argv: list[str], n: int | None = None, **kw: Any) -> tuple[float, list[ColdRun]]:
        runs = [await self.cold(argv, **kw) for _ in range(n or self.cold_n)]
        self.samples.setdefault("cold", {})[" ".join(argv)] = [round(r.wall_s, 4) for r in runs]
        return median([r.wall_s for r in runs]), runs

    async def peer_median(self, argv: list[str], limit: int, n: int | None = None, *, frames: bool = False
                          ) -> tuple[float, list[PeerRun]]:
        runs = [await self.peer(argv, limit, frames=frames) for _ in range(n or self.cold_n)]
        self.samples.setdefault("peer", {})[f"{' '.join(argv)} (limit {limit})"] = [round(r.wall_s, 4) for r in runs]
        return median([r.wall_s for r in runs]), runs

    def frames_args(self, path: Path, display_filter: str, limit: int) -> dict[str, Any]:
        return {"pcap_path": str(path), "display_filter": display_filter, "limit": limit}

    async def status(self) -> dict[str, Any]:
        _, status, _ = await self.clients[0].call("diagd_status", {})
        return status

    async def actor_details(self) -> dict[str, dict[str, Any]]:
        status = await self.status()
        return {a["details"].get("path"): {**a["details"], "_actor": a} for a in status["actors"]
                if a.get("kind") == "pcap"}

    def daemon_rss_row(self, label: str, limit_mb: float) -> None:
        rss = vmrss_mb(self.daemon_pid)
        self.samples.setdefault("daemon_rss_mb", {})[label] = rss
        self.rows.append(Row("m", f"daemon RSS (diagd serve, no children), {label}", None, None, rss, None,
                             f"<= {limit_mb:g} MB", rss <= limit_mb, unit="MB"))

    # -- the sections --------------------------------------------------------------------------

    async def warm_up(self) -> None:
        log("warm-up: pcap_info on a small capture")
        warm_s, _, _ = await self.clients[0].call("pcap_info", {"pcap_path": str(self.args.pcaps_dir / WARMUP_SOURCE)})
        self.rows.append(Row("-", "daemon warm-up: first pcap call (catalogue + 0.1 MB capture)", diagd_s=warm_s,
                             note="once per daemon, excluded from (f)"))

    async def first_and_repeated(self) -> str:
        """(f) and (a); returns the query of (e) (the workload's, or the subscriber of a Diameter
        Session-Id the timeline gave)."""
        A, c1 = self.A, self.clients[0]
        log(f"(f) cold tshark -Y {self.work.filter!r} x{self.cold_n}, peer (limit {PAGE})")
        self.cold_f, self.cold_runs_f = await self.cold_median(tshark_filter(A, self.work.filter), keep=True)
        self.matched = [int(line.split()[0]) for line in self.cold_runs_f[-1].stdout.decode(errors="replace")
                        .splitlines() if line.strip()]
        self.peer_frames, peer_runs = await self.peer_median(tabs_argv(A, self.work.filter, flush=True), PAGE)
        if first_numbers(peer_runs[-1].rows) != self.matched[:PAGE]:
            raise RuntimeError("the peer's rows are not cold tshark's first rows")
        frames_args = self.frames_args(A, self.work.filter, PAGE)
        log("(f) diagd: first query on the fresh capture")
        fresh_s, first, meta = await self.clients[0].call("pcap_frames_by_filter", frames_args)
        check_total(first, len(self.matched), self.work.filter)
        self.fresh_s = fresh_s
        self.samples["fresh_first_query"] = {"client_s": fresh_s, "meta": meta,
                                             **{k: first.get(k) for k in ("total", "total_exact", "total_at_least",
                                                                          "served_by")}}
        self.rows.append(timed_row("f", f"first query on a fresh capture (frames_by_filter {self.work.filter}, "
                                        f"limit {PAGE})",
                                   self.cold_f, self.peer_frames, fresh_s, target="<= 1.3x cold",
                                   ok=fresh_s <= 1.3 * self.cold_f,
                                   note=f"{fresh_s / self.cold_f:.2f}x cold; sha256 + sharkd load + filter pass + "
                                        "page rows"))

        log(f"(a) repeated frames_by_filter x{self.warm_n}")
        warm = [(await c1.call("pcap_frames_by_filter", frames_args))[0] for _ in range(self.warm_n)]
        self.samples["repeated_frames_s"] = warm
        self.rows.append(timed_row("a", f"repeated frames_by_filter (limit={PAGE})", self.cold_f, self.peer_frames,
                                   median(warm), target=">= 20x cold", ok=self.cold_f / median(warm) >= 20))

        fields = list(self.work.timeline_fields)
        timeline_args = {"pcap_path": str(A), "display_filter": self.work.filter, "fields": fields, "limit": 200}
        field_args = ["-T", "fields", "-e", "frame.number", *(x for f in fields for x in ("-e", f))]
        log(f"(a) cold tshark -T fields x{self.cold_n}, peer (limit 200)")
        cold_t, _ = await self.cold_median([*tshark_filter(A, self.work.filter), *field_args])
        peer_t, _ = await self.peer_median(["tshark", "-n", "-l", "-r", str(A), "-Y", self.work.filter, *field_args],
                                           200)
        log("(a) timeline: first call, then repeated")
        first_t, timeline, _ = await c1.call("pcap_timeline", timeline_args)
        self.rows.append(timed_row("-", "timeline, first call (filter known, 200 rows)", cold_t, peer_t, first_t))
        warm = [(await c1.call("pcap_timeline", timeline_args))[0] for _ in range(self.warm_n)]
        self.samples["repeated_timeline_s"] = warm
        self.rows.append(timed_row("a", f"repeated timeline (limit=200, {', '.join(fields)})", cold_t, peer_t,
                                   median(warm), target=">= 20x cold", ok=cold_t / median(warm) >= 20))
        if self.work.text_query is not None:
            return self.work.text_query
        session_id = next(r["diameter.Session-Id"] for r in timeline["rows"] if r.get("diameter.Session-Id"))
        session_id = str(session_id[0] if isinstance(session_id, list) else session_id)
        return session_id.rsplit(";", 1)[-1]  # the subscriber (IMSI...) in that Session-Id

    def detail_argv(self, frame: int) -> list[str]:
        return [*tshark_filter(self.A, f"frame.number == {frame}"), "-V"]

    async def frame_detail(self) -> None:
        """(c): frames not fetched before (the last matches of self.work.filter)."""
        detail_frames = self.matched[-5:]
        log(f"(c) frame detail: cold -V x{self.cold_n}, peer x{self.cold_n}, diagd x{len(detail_frames)}")
        self.cold_detail = median([(await self.cold(self.detail_argv(n))).wall_s for n in detail_frames[:self.cold_n]])
        self.peer_detail = median([(await self.peer(["tshark", "-n", "-l", *self.detail_argv(n)[1:]], 1,
                                                    frames=True)).wall_s for n in detail_frames[:self.cold_n]])
        warm = [(await self.clients[0].call("pcap_frame_detail", {"pcap_path": str(self.A), "frame_numbers": [n]}))[0]
                for n in detail_frames]
        self.samples["frame_detail_s"] = warm
        self.rows.append(timed_row("c", "frame_detail, one frame (full tree)", self.cold_detail, self.peer_detail,
                                   median(warm), target=">= 100x cold", ok=self.cold_detail / median(warm) >= 100,
                                   note=f"frames {detail_frames}; the peer stops once the frame's tree is in"))

    async def text_search(self, query: str) -> None:
        """(e): over 200 frames of a filter the capture knows (applied first and counted: its sharkd
        pass over, untimed); then the same search at once after a new filter's first page (e2)."""
        import trio

        A, c1 = self.A, self.clients[0]
        for _ in range(600):  # a new filter's first page comes before its pass: wait for the count
            _, page, _ = await c1.call("pcap_frames_by_filter", self.frames_args(A, self.work.text_filter, PAGE))
            if page.get("total_exact", True):
                break
            await trio.sleep(0.1)
        await trio.sleep(1.5)  # the warm tshark a page used is replaced 1 s after it (standby.py)
        pattern = re.compile(re.escape(query), re.IGNORECASE)
        log(f"(e) text search {query!r} over 200 frames: cold -V x{self.cold_n}, peer, diagd x2")
        searches = []

        def searching() -> Callable[[bytes], None]:
            searches.append(FirstFramesSearch(200, pattern))
            return searches[-1]

        text_filter = self.work.text_filter
        cold_e = median([(await self.cold([*tshark_filter(A, text_filter), "-V"], consume=searching())).wall_s
                         for _ in range(self.cold_n)])
        for s in searches:
            s.finish()
        peer_e, peer_runs = await self.peer_median(["tshark", "-n", "-l", "-r", str(A), "-Y", text_filter, "-V"],
                                                   200, frames=True)
        peer_matches = sum(len(pattern.findall(r.decode(errors="replace"))) for r in peer_runs[-1].rows)
        warm_e = []
        for offset in (0, 200):
            took, found, _ = await c1.call("pcap_text_search", {
                "pcap_path": str(A), "display_filter": self.work.text_filter, "query": query, "limit": 200,
                "offset": offset, "max_matches": 1000})
            warm_e.append(took)
            self.samples.setdefault("text_search", []).append({
                "offset": offset, "client_s": took, "frames_scanned": found["frames_scanned"],
                "frames_ruled_out": found.get("frames_ruled_out", 0),
                "matches": found["match_count"], "truncated": found["truncated"]})
        scanned = [s["frames_scanned"] for s in self.samples["text_search"]]
        ruled = [s["frames_ruled_out"] for s in self.samples["text_search"]]
        self.rows.append(timed_row("e", "text_search over 200 frames (filter known)", cold_e, peer_e, median(warm_e),
                                   target="<= 2 s", ok=median(warm_e) <= 2.0,
                                   note=f"query {query!r} in {text_filter!r}, offsets 0 and 200, frames scanned "
                                        f"{scanned}, ruled out by a single pass {ruled}, cold searched "
                                        f"{searches[0].frames_searched} frames ({searches[0].matches} matches), "
                                        f"peer {len(peer_runs[-1].rows)} frames ({peer_matches} matches)"))
        # (e2): a filter new to the capture, its first page, then the search at once (the filter's
        # sharkd pass is still running); a constant that changes nothing makes the filter new.
        fresh_filter = f"{self.work.text_filter} && frame.len != 100099"
        await self.quiet()  # as for every figure: the searches above left no start-up of theirs running
        await c1.call("pcap_frames_by_filter", self.frames_args(A, fresh_filter, PAGE))
        took, _, _ = await c1.call("pcap_text_search", {
            "pcap_path": str(A), "display_filter": fresh_filter, "query": query, "limit": 200, "max_matches": 1000})
        self.rows.append(timed_row("-", "text_search over 200 frames, at once after a new filter's first page",
                                   cold_e, peer_e, took, note="one call; the filter's sharkd pass still runs"))

    async def info(self) -> None:
        """(d): capture A is loaded but not analysed yet; B was never seen."""
        A = self.A
        info_argv = ["tshark", "-r", str(A), "-q", "-z", "io,phs", "-z", "conv,sctp", "-z", "conv,ip",
                     "-z", "conv,udp", "-z", "conv,tcp"]
        log(f"(d) cold capinfos + tshark -z io,phs -z conv,... x{self.cold_n}")
        cold_d = median([(await self.cold(["capinfos", "-c", "-u", "-a", "-e", "-H", str(A)])).wall_s
                         + (await self.cold(info_argv)).wall_s for _ in range(self.cold_n)])
        log("(d) pcap_info on the loaded capture, then on a fresh one")
        info_loaded, info, _ = await self.clients[0].call("pcap_info", {"pcap_path": str(A)})
        info_fresh, _, _ = await self.clients[1].call("pcap_info", {"pcap_path": str(self.B)})
        self.samples["pcap_info"] = {"loaded_s": info_loaded, "fresh_s": info_fresh, "load_s": info.get("load_s"),
                                     "has_protocols": info.get("has_protocols")}
        for label, took in (("fresh capture: hash + load + analysis", info_fresh),
                            ("capture already loaded", info_loaded)):
            self.rows.append(timed_row("d", f"pcap_info, {label}", cold_d, None, took, target="<= 2.5 s",
                                       ok=took <= 2.5, peer_is_cold=True))

    async def new_filter_rows(self) -> None:
        """(b): the first page of filters never used before, matches early / late / never."""
        A, c1 = self.A, self.clients[0]
        kinds: list[tuple[str, Callable[[], str]]] = [("matches early", self.filters.early),
                                                      ("matches late (last copy only)", self.filters.late),
                                                      ("no match", self.filters.none)]
        for kind, make in kinds:
            colds: list[float] = []
            peers: list[float] = []
            diagds: list[float] = []
            errors: list[tuple[float, dict[str, Any]]] = []
            expected: list[int] = []
            flt = ""
            for i in range(self.new_n):
                flt = make()
                log(f"(b) new filter {i + 1}/{self.new_n}, {kind}: {flt!r}: cold, peer, diagd")
                await self.quiet()  # the last filter's pass, left running after its early page
                cold_run = await self.cold(tabs_argv(A, flt, flush=False), keep=True)
                expected = first_numbers(cold_run.stdout.splitlines())
                peer_run = await self.peer(tabs_argv(A, flt, flush=True), NEW_PAGE)
                if first_numbers(peer_run.rows) != expected[:NEW_PAGE]:
                    raise RuntimeError(f"the peer's rows for {flt!r} are not cold tshark's first rows")
                took, page, _ = await c1.call("pcap_frames_by_filter", self.frames_args(A, flt, NEW_PAGE),
                                              allow_error=True)
                colds.append(cold_run.wall_s)
                peers.append(peer_run.wall_s)
                self.samples.setdefault("new_filters", []).append({
                    "kind": kind, "filter": flt, "cold_s": cold_run.wall_s, "peer_s": peer_run.wall_s,
                    "diagd_s": took, "matches": len(expected),
                    **{k: page.get(k) for k in ("total", "total_exact", "total_at_least", "served_by", "code")}})
                if page.get("_is_error"):
                    errors.append((took, page))
                    continue
                check_total(page, len(expected), flt)
                if [f["number"] for f in page["frames"]] != expected[:NEW_PAGE]:
                    raise RuntimeError(f"diagd's first page for {flt!r} is not tshark's")
                diagds.append(took)
            where = (f"first match frame {expected[0]} of {self.samples['frames_total']}, {len(expected)} matches"
                     if expected else "no frame matches")
            metric = f"new filter, first page (limit {NEW_PAGE}), {kind}"
            note = f"e.g. {flt!r}: {where}" + (f"; {len(errors)} of {self.new_n} calls failed" if errors else "")
            if errors and not diagds:
                self.rows.append(error_row("b", metric, median(colds), median(peers), errors[0][1], errors[0][0],
                                           ">= 1x best", note))
                continue
            row = timed_row("b", metric, median(colds), median(peers), median(diagds), note=note)
            row.met = bool(row.met) and not errors
            self.rows.append(row)
            if kind == "matches early":
                self.new_early_s = median(diagds)

    async def two_captures(self) -> None:
        """(g): two clients, two captures, a new filter each: sequential vs concurrent."""
        A, B, (c1, c2) = self.A, self.B, self.clients[:2]
        log("(g) cold and peer: two tshark processes sequentially, then concurrently")
        seq_cold = sum([(await self.cold(tshark_filter(p, self.work.filter))).wall_s for p in (A, B)])
        conc_cold = await concurrently([lambda: self.cold(tshark_filter(A, self.work.filter)),
                                        lambda: self.cold(tshark_filter(B, self.work.filter))])
        peer_argv = [tabs_argv(p, self.work.filter, flush=True) for p in (A, B)]
        seq_peer = sum([(await self.peer(argv, PAGE)).wall_s for argv in peer_argv])
        conc_peer = await concurrently([lambda: self.peer(peer_argv[0], PAGE), lambda: self.peer(peer_argv[1], PAGE)])
        seq_warm, conc_warm = [], []
        for rnd in range(self.args.rounds):
            log(f"(g) diagd round {rnd + 1}/{self.args.rounds}: sequential, then concurrent")

            def frames_call(client: DiagdClient, path: Path, k: int) -> Callable[[], Awaitable[Any]]:
                flt = f"{self.work.filter} && frame.len > {k}"  # new to both captures, same work each time
                return lambda: client.call("pcap_frames_by_filter", self.frames_args(path, flt, PAGE))

            k = 4 * rnd
            start = time.perf_counter()
            await frames_call(c1, A, k + 1)()
            await frames_call(c2, B, k + 1)()
            seq_warm.append(time.perf_counter() - start)
            conc_warm.append(await concurrently([frames_call(c1, A, k + 2), frames_call(c2, B, k + 2)]))
        self.samples["two_clients"] = {"sequential_s": seq_warm, "concurrent_s": conc_warm,
                                       "cold_sequential_s": seq_cold, "cold_concurrent_s": conc_cold,
                                       "peer_sequential_s": seq_peer, "peer_concurrent_s": conc_peer}
        ratio = median(conc_warm) / median(seq_warm)
        self.rows.append(Row("g", "two clients, two captures: concurrent / sequential wall", conc_cold / seq_cold,
                             conc_peer / seq_peer, ratio, None, RETIRED, None, unit="ratio",
                             note=f"diagd sequential {fmt_time(median(seq_warm))}, concurrent "
                                  f"{fmt_time(median(conc_warm))}; cold tshark sequential {fmt_time(seq_cold)}, "
                                  f"concurrent {fmt_time(conc_cold)}; new filter "
                                  f"'{self.work.filter} && frame.len > k'"))

    async def one_capture_pairs(self) -> None:
        """(i): two new filters on ONE capture from two clients, sequential vs concurrent."""
        A, (c1, c2) = self.A, self.clients[:2]
        kinds: list[tuple[str, Callable[[], str], bool]] = [("matches early", self.filters.early, True),
                                                            ("no match", self.filters.none, False)]
        for kind, make, early_stops in kinds:
            log(f"(i) two new filters on one capture, {kind}: cold and peer, then diagd x{self.args.rounds}")
            cold_argv = [tabs_argv(A, make(), flush=False) for _ in range(4)]
            seq_cold = sum([(await self.cold(argv)).wall_s for argv in cold_argv[:2]])
            conc_cold = await concurrently([functools.partial(self.cold, argv) for argv in cold_argv[2:]])
            peer_ratio = None
            if early_stops:
                peer_argv = [tabs_argv(A, make(), flush=True) for _ in range(4)]
                seq_peer = sum([(await self.peer(argv, NEW_PAGE)).wall_s for argv in peer_argv[:2]])
                conc_peer = await concurrently([functools.partial(self.peer, argv, NEW_PAGE) for argv in peer_argv[2:]])
                peer_ratio = conc_peer / seq_peer
            seq, conc, ends_all = [], [], []
            for _ in range(self.args.rounds):
                start = time.perf_counter()
                for client in (c1, c2):
                    await client.call("pcap_frames_by_filter", self.frames_args(A, make(), NEW_PAGE))
                seq.append(time.perf_counter() - start)
                ends: list[float] = []
                start = time.perf_counter()

                def call(client: DiagdClient, flt: str, t0: float = start, out: list[float] = ends
                         ) -> Callable[[], Awaitable[None]]:
                    async def run() -> None:
                        await client.call("pcap_frames_by_filter", self.frames_args(A, flt, NEW_PAGE))
                        out.append(time.perf_counter() - t0)
                    return run

                conc.append(await concurrently([call(c1, make()), call(c2, make())]))
                ends_all.append(sorted(ends))
            self.samples.setdefault("one_capture_pairs", {})[kind] = {
                "sequential_s": seq, "concurrent_s": conc, "concurrent_ends_s": ends_all,
                "cold_sequential_s": seq_cold, "cold_concurrent_s": conc_cold}
            ratio = median(conc) / median(seq)
            ends_text = "; ".join(" and ".join(fmt_time(e) for e in pair) for pair in ends_all)
            self.rows.append(Row("i", f"two new filters, one capture ({kind}): concurrent / sequential",
                                 conc_cold / seq_cold, peer_ratio, ratio, None, RETIRED, None, unit="ratio",
                                 peer_text=None if early_stops else "= cold",
                                 note=f"diagd sequential {fmt_time(median(seq))}, concurrent {fmt_time(median(conc))} "
                                      f"(the two finished at {ends_text}); limit {NEW_PAGE}"))

    async def detail_during_pass(self) -> None:
        """(j): a frame-detail call sent while a new-filter pass runs on the same capture."""
        import trio

        A, (c1, c2) = self.A, self.clients[:2]
        frames = self.matched[-10:-5][:3]  # not fetched before: (c) fetched the last 5
        latencies, during = [], []
        log(f"(j) frame detail {DETAIL_DELAY_S} s into a no-match filter pass, x{len(frames)}")
        for n in frames:
            flt = self.filters.none()
            marks: dict[str, float] = {}
            t0 = time.perf_counter()

            async def filtering(flt: str = flt, marks: dict[str, float] = marks, t0: float = t0) -> None:
                await c1.call("pcap_frames_by_filter", self.frames_args(A, flt, NEW_PAGE))
                marks["filter_end"] = time.perf_counter() - t0

            async def detail(n: int = n, marks: dict[str, float] = marks, t0: float = t0) -> None:
                await trio.sleep(DETAIL_DELAY_S)
                marks["detail_start"] = time.perf_counter() - t0
                took, _, _ = await c2.call("pcap_frame_detail", {"pcap_path": str(A), "frame_numbers": [n]})
                marks["detail_s"] = took

            async with trio.open_nursery() as nursery:
                nursery.start_soon(filtering)
                nursery.start_soon(detail)
            latencies.append(marks["detail_s"])
            during.append(marks["filter_end"] > marks["detail_start"])
            self.samples.setdefault("detail_during_pass", []).append({"frame": n, "filter": flt, **marks})
        worst = max(latencies)
        self.rows.append(timed_row("j", f"frame_detail during a new-filter pass, same capture (worst of {len(frames)})",
                                   self.cold_detail, self.peer_detail, worst, target="<= 50 ms", ok=worst <= 0.05,
                                   note=f"frames {frames}, latencies {', '.join(fmt_time(x) for x in latencies)}; "
                                        f"sent {DETAIL_DELAY_S} s into the pass, the pass still running in "
                                        f"{sum(during)} of {len(during)}"))

    async def sharkd_memory(self) -> None:
        """(h): memory per loaded capture."""
        loaded = await self.actor_details()
        self.samples["loaded_captures"] = {p: {k: v for k, v in d.items() if k != "_actor"} for p, d in loaded.items()}
        tshark_rss_mb = max(r.maxrss_kb for r in self.cold_runs_f) / 1024
        small = self.args.pcaps_dir / WARMUP_SOURCE
        for label, path in (("A", self.A), ("B", self.B), ("baseline", small)):
            details = loaded.get(str(path), {})
            self.rows.append(Row("h", f"sharkd RSS, capture {label} ({path.stat().st_size / 1e6:.1f} MB)",
                                 tshark_rss_mb if path != small else None, None, sharkd_rss_mb(details), unit="MB",
                                 note=f"{details.get('frames')} frames, load_s {details.get('load_s')}"
                                      + ("; cold = peak RSS of one tshark -Y run on A (wait4), diagd = sharkd VmRSS"
                                         if label == "A" else "")))

    async def wait_loaded(self, path: Path) -> dict[str, Any]:
        """The actor details of `path` once sharkd has loaded it (load_s set)."""
        import trio

        deadline = time.monotonic() + LOAD_WAIT_S
        while time.monotonic() < deadline:
            details = (await self.actor_details()).get(str(path), {})
            if details.get("load_s") and details.get("frames"):
                return details
            await trio.sleep(0.5)
        raise RuntimeError(f"{path} did not load within {LOAD_WAIT_S} s")

    async def big_capture(self) -> None:
        """(l) and the growth table: the 1 GB capture next to the 55 MB one."""
        import trio

        BIG, c = self.caps.big, self.clients[2]
        assert BIG is not None
        size_factor = BIG.stat().st_size / self.A.stat().st_size
        n = self.args.big_cold_repeats
        log(f"(l) {BIG.name}: page cache, cold tshark -Y {self.work.filter!r} x{n}, peer")
        await trio.to_thread.run_sync(lambda: warm_page_cache(BIG))
        frames_big = await trio.to_thread.run_sync(lambda: packet_count(BIG))
        newlines = [0]

        def counting(data: bytes) -> None:
            newlines[0] += data.count(b"\n")

        cold_big, cold_runs = await self.cold_median(tshark_filter(BIG, self.work.filter), n=n, consume=counting)
        matches = newlines[0] // n
        peer_big, _ = await self.peer_median(tabs_argv(BIG, self.work.filter, flush=True), PAGE, n=n)
        log("(l) diagd: first query on the fresh 1 GB capture")
        took, page, _ = await c.call("pcap_frames_by_filter", self.frames_args(BIG, self.work.filter, PAGE),
                                     allow_error=True)
        metric = f"1 GB: first query on a fresh capture ({self.work.filter}, limit {PAGE})"
        first_big: float | None = None
        first_error = f"{page.get('code', 'ERROR')} after {fmt_time(took)}" if page.get("_is_error") else None
        if page.get("_is_error"):
            self.rows.append(error_row("l", metric, cold_big, peer_big, page, took, "<= 1.1x cold; >= 1x best"))
        else:
            check_total(page, matches, self.work.filter)
            first_big = took
            self.rows.append(timed_row("l", metric, cold_big, peer_big, took, target="<= 1.1x cold",
                                       ok=took <= 1.1 * cold_big,
                                       note=f"{took / cold_big:.2f}x cold; {frames_big} frames, {matches} matches, "
                                            f"served by {page.get('served_by')}"))
        log("(l) waiting for sharkd to load the 1 GB capture")
        details = await self.wait_loaded(BIG)
        load_big = float(details["load_s"])
        self.rows.append(Row("l", "1 GB: sharkd load time (load_s)", diagd_s=load_big,
                             note="diagd_status actor details; see the growth table"))

        colds: list[float] = []
        peers: list[float] = []
        diagds: list[float] = []
        errors: list[tuple[float, dict[str, Any]]] = []
        expected = 0
        for i in range(self.args.big_new_repeats):
            flt = self.filters.early()  # the same frames match every time
            log(f"(l) new filter {i + 1}/{self.args.big_new_repeats} {flt!r}: " + ("cold, " if i == 0 else "")
                + "peer, diagd")
            if i == 0:
                newlines[0] = 0
                colds.append((await self.cold(tabs_argv(BIG, flt, flush=False), consume=counting)).wall_s)
                expected = newlines[0]
            peer_run = await self.peer(tabs_argv(BIG, flt, flush=True), NEW_PAGE)
            peers.append(peer_run.wall_s)
            took, page, _ = await c.call("pcap_frames_by_filter", self.frames_args(BIG, flt, NEW_PAGE),
                                         allow_error=True)
            self.samples.setdefault("big_new_filters", []).append({
                "filter": flt, "peer_s": peer_run.wall_s, "diagd_s": took,
                **{k: page.get(k) for k in ("total", "total_exact", "total_at_least", "served_by", "code")}})
            if page.get("_is_error"):
                errors.append((took, page))
                continue
            check_total(page, expected, flt)
            if [f["number"] for f in page["frames"]] != first_numbers(peer_run.rows):
                raise RuntimeError(f"diagd's first page for {flt!r} on the 1 GB capture is not tshark's")
            diagds.append(took)
        metric = f"1 GB: new filter, first page (limit {NEW_PAGE}), matches early"
        new_big = median(diagds) if diagds else None
        if new_big is None:
            self.rows.append(error_row("l", metric, colds[0], median(peers), errors[0][1], errors[0][0], ">= 1x best"))
        else:
            row = timed_row("l", metric, colds[0], median(peers), new_big,
                            note=f"median of {len(diagds)}" + (f"; {len(errors)} calls failed" if errors else ""))
            row.met = bool(row.met) and not errors
            self.rows.append(row)

        loaded = await self.actor_details()
        big_rss = sharkd_rss_mb(loaded.get(str(BIG), {}))
        a_details = loaded.get(str(self.A), {})
        a_rss = sharkd_rss_mb(a_details)
        tshark_rss_big = max(r.maxrss_kb for r in cold_runs) / 1024
        self.rows.append(Row("l", "1 GB: sharkd RSS", tshark_rss_big, None, big_rss, unit="MB",
                             note="cold = peak RSS of one tshark -Y run on the 1 GB capture"))
        small_label = f"{self.A.stat().st_size / 1e6:.0f} MB"
        big_label = f"{BIG.stat().st_size / 1e6:.0f} MB"

        def growth(metric: str, small: float | None, big: float | None, unit: str = "s", target: bool = True,
                   big_text: str | None = None) -> None:
            """big_text: what the 1 GB call gave instead of a figure (an error): a miss."""
            g = big / small if small and big is not None else None
            met = None if not target else (False if big_text else (g <= size_factor if g else None))
            self.growth.append({"metric": metric, "small": small, "big": big, "big_text": big_text, "unit": unit,
                                "growth": g, "target": target, "size_factor": size_factor, "met": met,
                                "small_label": small_label, "big_label": big_label})

        growth("sharkd load time (load_s)", a_details.get("load_s"), load_big)
        growth(f"first answer, fresh capture ({self.work.filter})", self.fresh_s, first_big,
               big_text=first_error)
        growth(f"new filter, first page (limit {NEW_PAGE}), matches early", self.new_early_s, new_big,
               big_text=None if new_big is not None else str(errors[0][1].get("code", "ERROR")))
        growth("sharkd RSS", a_rss, big_rss, unit="MB")
        growth(f"(reference) cold tshark pass ({self.work.filter})", self.cold_f, cold_big, target=False)
        growth(f"(reference) peer, first {PAGE} rows ({self.work.filter})", self.peer_frames, peer_big, target=False)

    async def burst(self) -> None:
        """(k): many different new filters at once from several clients on one capture."""
        import trio

        n_clients, per = self.args.burst_clients, self.args.burst_calls
        clients = self.clients[:n_clients]
        makers: list[Callable[[], str]] = [*(functools.partial(self.filters.early, p)
                                             for p in self.work.burst_protos),
                                           self.filters.late, self.filters.none]
        jobs = [(clients[i % n_clients], makers[i % len(makers)]()) for i in range(n_clients * per)]
        outcomes: list[dict[str, Any]] = []

        async def one(client: DiagdClient, flt: str) -> None:
            start = time.perf_counter()
            try:
                took, payload, _ = await client.call("pcap_frames_by_filter", self.frames_args(self.A, flt, NEW_PAGE),
                                                     allow_error=True)
            except trio.TooSlowError:
                outcomes.append({"filter": flt, "outcome": "CLIENT_TIMEOUT", "s": time.perf_counter() - start})
                return
            details = payload.get("details") or {}
            outcomes.append({"filter": flt, "s": took, "outcome": payload.get("code", "ERROR")
                             if payload.get("_is_error") else "answered",
                             "retry_after_s": details.get("retry_after_s", payload.get("retry_after_s")),
                             "message": payload.get("message")})

        log(f"(k) burst: {n_clients} clients x {per} new filters at once on one capture")
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for client, flt in jobs:
                nursery.start_soon(one, client, flt)
        wall = time.perf_counter() - start
        self.samples["burst"] = {"wall_s": wall, "calls": outcomes}
        count = {k: sum(1 for o in outcomes if o["outcome"] == k) for k in ("answered", "BUSY", "TIMEOUT")}
        busy_hinted = sum(1 for o in outcomes if o["outcome"] == "BUSY" and o["retry_after_s"] is not None)
        other = len(outcomes) - sum(count.values())
        answered = sorted(o["s"] for o in outcomes if o["outcome"] == "answered")
        hints = sorted(o["retry_after_s"] for o in outcomes if o["retry_after_s"] is not None)
        others = sorted({o["outcome"] for o in outcomes} - set(count))
        self.rows.append(Row(
            "k", f"burst of {len(jobs)} new filters, {n_clients} clients, one capture", unit="count",
            diagd_text=f"{count['answered']} ok, {count['BUSY']} BUSY ({busy_hinted} with retry), "
                       f"{count['TIMEOUT']} TIMEOUT, {other} other",
            target="0 TIMEOUT; BUSY says retry_after_s",
            met=count["TIMEOUT"] == 0 and other == 0 and busy_hinted == count["BUSY"],
            note=f"all done in {fmt_time(wall)}; answered in {fmt_time(answered[0]) if answered else '-'} to "
                 f"{fmt_time(answered[-1]) if answered else '-'}"
                 + (f"; retry_after_s {hints[0]}..{hints[-1]}" if hints else "")
                 + (f"; other: {', '.join(others)}" if others else "")
                 + f"; filters: early ({'/'.join(self.work.burst_protos)}), late, no match, each string new"))

    async def settle(self, timeout_s: float = 300.0) -> None:
        """Until no pcap actor has work queued or running (the burst may leave some behind)."""
        import trio

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            actors = [a for a in (await self.status())["actors"] if a.get("kind") == "pcap"]
            if not any(a.get("inbox_depth") or a.get("current_op") for a in actors):
                return
            await trio.sleep(1)
        log(f"pcap actors still busy after {timeout_s} s")

    def wanted(self, section: str) -> bool:
        """Whether `--only` leaves this section in (all by default)."""
        return self.args.only is None or section in self.args.only

    async def quiet(self) -> None:
        """Wait until the daemon's background work (a pass after an early answer, a capture loading)
        is over: a figure is of its own call alone, as the tshark it is compared with runs alone."""
        await to_thread(lambda: wait_until_quiet(self.daemon_pid, limit_s=60.0))

    async def traced(self, section: str, work: Callable[[], Awaitable[T]]) -> T:
        """Runs one section once the daemon is quiet, then notes its RSS (samples.daemon_rss_trace)."""
        await self.quiet()
        result = await work()
        self.samples.setdefault("daemon_rss_trace", []).append({"after": section,
                                                                "rss_mb": round(vmrss_mb(self.daemon_pid), 1)})
        return result

    # -- the whole run -------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        args, A = self.args, self.A
        await self.cold(["tshark", "-r", str(args.pcaps_dir / WARMUP_SOURCE), "-c", "1"])  # libraries into the cache
        self.samples["frames_total"] = await to_thread(lambda: packet_count(A))
        base_total = await to_thread(lambda: count_frames(A, self.work.base))

        config = f"[daemon]\nallowed_dirs = {json.dumps([str(d) for d in (args.cache_dir, args.pcaps_dir)])}\n"
        with isolated_daemon("pcap", config=config, extra_env={"DIAGD_LOG_LEVEL": "info"}) as daemon:
            self.daemon_pid = daemon.proc.pid
            async with AsyncExitStack() as stack:
                for _ in range(max(3, args.burst_clients)):
                    self.clients.append(await stack.enter_async_context(diagd_client(daemon.env)))

                def stop_first(exc_type: type[BaseException] | None, *_: object) -> bool:
                    """On a failure or Ctrl-C, the daemon goes before the clients close: a client
                    interrupted mid-call otherwise waits for its shim, which waits for the daemon."""
                    if exc_type is not None:
                        daemon.proc.terminate()
                    return False

                stack.push(stop_first)
                self.daemon_rss_row(f"idle, {len(self.clients)} clients connected, before any pcap call", 60)
                await self.traced("warm_up", self.warm_up)
                query = await self.traced("f_a", self.first_and_repeated)  # always: (e) searches its query
                for section, work in (("c", self.frame_detail), ("e", functools.partial(self.text_search, query)),
                                      ("d", self.info), ("b", self.new_filter_rows), ("g", self.two_captures),
                                      ("i", self.one_capture_pairs), ("j", self.detail_during_pass),
                                      ("h", self.sharkd_memory)):
                    if self.wanted(section):
                        await self.traced(section, work)
                self.daemon_rss_row("after the 55 MB work, before the 1 GB case and the burst", 90)
                if self.caps.big is not None and self.wanted("l"):
                    await self.traced("l", self.big_capture)
                if self.wanted("k"):
                    await self.traced("k", self.burst)
                await self.settle()
                self.daemon_rss_row("after the pcap work", 90)

        caps = self.caps
        paths = [p for p in (A, caps.b, caps.big) if p is not None]
        return {
            "config": {"size_mb": args.size_mb, "big_mb": args.big_mb, "repeats": self.warm_n,
                       "cold_repeats": self.cold_n, "new_repeats": self.new_n, "rounds": args.rounds,
                       "page_limit": PAGE, "new_page_limit": NEW_PAGE, "filter": self.work.filter,
                       "timeline_fields": list(self.work.timeline_fields), "plane": self.work.plane,
                       "burst": [args.burst_clients, args.burst_calls],
                       "cpus": os.cpu_count(), "python": sys.version.split()[0],
                       "tshark": tool_output(["tshark", "-v"]).splitlines()[0]},
            "capture": {"path": str(A), "second_path": str(caps.b), "big_path": str(caps.big) if caps.big else None,
                        "all_paths": [str(p) for p in paths], "source": self.work.source, "copies": caps.copies,
                        "big_copies": caps.big_copies, "size_mb": A.stat().st_size / 1e6,
                        "big_size_mb": caps.big.stat().st_size / 1e6 if caps.big else None,
                        "frames": self.samples["frames_total"], "base": self.work.base, "base_frames": base_total,
                        "filter_matches": len(self.matched), "built_now": caps.built},
            "rows": [asdict(r) for r in self.rows],
            "growth": self.growth,
            "samples": self.samples,
        }


async def to_thread(fn: Callable[[], Any]) -> Any:
    import trio

    return await trio.to_thread.run_sync(fn)


async def concurrently(calls: list[Callable[[], Awaitable[Any]]]) -> float:
    """Wall time of running the given coroutine factories at the same time."""
    import trio

    async def run(call: Callable[[], Awaitable[Any]]) -> None:
        await call()

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for call in calls:
            nursery.start_soon(run, call)
    return time.perf_counter() - start


async def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """One run per kind of capture (a daemon of its own each): the report of each, by plane."""
    reports = {}
    for work in (w for w in (CONTROL, USER) if w.plane in args.planes):
        caps = await to_thread(lambda work=work: prepare(args, work))
        started = time.perf_counter()
        reports[work.plane] = await PcapBench(args, caps, work).run()
        reports[work.plane]["config"]["run_s"] = round(time.perf_counter() - started, 1)
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size-mb", type=float, default=50, help="minimum capture size in MiB (default 50)")
    parser.add_argument("--big-mb", type=float, default=1024, help="the big capture in MiB (default 1024)")
    parser.add_argument("--no-big", action="store_true", help="skip the big capture (l)")
    parser.add_argument("--repeats", type=int, default=20, help="repeated diagd calls per query (default 20)")
    parser.add_argument("--cold-repeats", type=int, default=3, help="cold/peer tshark runs per query (default 3)")
    parser.add_argument("--new-repeats", type=int, default=3, help="new filters per kind in (b) (default 3)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the two-client tests (default 2)")
    parser.add_argument("--big-cold-repeats", type=int, default=1, help="cold runs on the big capture (default 1)")
    parser.add_argument("--big-new-repeats", type=int, default=2, help="new filters on the big capture (default 2)")
    parser.add_argument("--burst-clients", type=int, default=5, help="client sessions in the burst (default 5)")
    parser.add_argument("--burst-calls", type=int, default=9, help="calls per client in the burst (default 9)")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help=f"built captures (default {CACHE_DIR})")
    parser.add_argument("--pcaps-dir", type=Path, default=PCAPS_DIR, help=f"real captures (default {PCAPS_DIR})")
    parser.add_argument("--planes", default="control,user", help="kinds of capture: control (Diameter), user "
                        "(dense GTP-U), or both (default: a run of each, one after the other)")
    parser.add_argument("--only", help="comma-separated sections to run (a, c, e, d, b, g, i, j, h, l, k; the "
                        "first query (f, a) always runs): a quick rerun of some rows")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    args.only = None if args.only is None else set(args.only.split(","))
    counts = (args.repeats, args.cold_repeats, args.new_repeats, args.rounds, args.big_cold_repeats,
              args.big_new_repeats, args.burst_clients, args.burst_calls)
    if min(counts) < 1 or args.size_mb <= 0 or args.big_mb <= 0:
        parser.error("sizes, repeats, rounds and burst sizes must be positive")
    args.planes = set(args.planes.split(","))
    if not args.planes or args.planes - {"control", "user"}:
        parser.error("--planes takes control, user or control,user")
    if args.no_big:
        args.big_mb = None
    args.cache_dir, args.pcaps_dir = args.cache_dir.resolve(), args.pcaps_dir.resolve()
    repo = Path(__file__).resolve().parent.parent
    if args.cache_dir == repo or repo in args.cache_dir.parents:
        parser.error("--cache-dir must be outside the repository (no captures in the repo)")

    import trio

    started = time.perf_counter()
    reports = trio.run(run_benchmark, args)
    log(f"whole run {time.perf_counter() - started:.0f} s")
    print(json.dumps(reports, indent=2, default=str) if args.json
          else "\n\n".join(render_table(report) for report in reports.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
