"""pcap benchmark: diagd's warm sharkd worker against cold `tshark` per call, on a >= 50 MB capture.

Run from the repository root:

    .venv/bin/python bench/pcap.py [--size-mb 50] [--json]

The capture. Built once from the real file magma_gx_gy_combined_04.pcapng (Diameter Gx/Gy/S6a,
S1AP, GTP-U; 2.9 MB) in the shared corpus and cached outside the repository (default
/tmp/diagd-bench-cache/, reused when present): N copies time-shifted with `editcap -t i*40` and
appended with `mergecap -a`, as shared/pcaps/MANIFEST.md shows. One change to that recipe: each
copy's SCTP verification tag is XORed with a per-copy value (copy 0 is untouched). Without it every
copy after the first repeats the first one's SCTP associations with the same TSNs, tshark marks
them "Retransmitted TSN" and never dissects their Diameter or S1AP (1288 Diameter frames in the
whole file instead of N x 1288), which makes filters unrealistically cheap. The build checks that
the Diameter frame count is N times the source's. A second capture built the same way but shifted
by one day (same work, different sha256) serves the fresh-capture `pcap_info` and the two-client
measurements.

What is measured, side by side in one run (all diagd times are wall times measured by an MCP SDK
client, `Client(StdioServerParameters(diagd mcp --no-autostart), mode="legacy")` under trio,
against an isolated `diagd serve` with its own runtime/state dirs and config; cold times are wall
times of one tshark process per call with its output read to the end, the way a plain wrapper
works; "median" is over --cold-repeats cold runs and --repeats diagd calls):

(a) repeated pcap_frames_by_filter and pcap_timeline (same arguments) vs `tshark -r F -Y FILTER`
    and `tshark -r F -Y FILTER -T fields -e ...`: target >= 20x faster.
(b) a new filter on an already loaded capture (three Diameter/GTP filters never used before):
    target >= 2.5x faster.
(c) pcap_frame_detail of one frame (not fetched before) vs `tshark -r F -Y frame.number==N -V`:
    target >= 100x faster.
(d) pcap_info wall time, on a fresh capture (hash + load + analysis) and on a loaded one: target
    <= 2.5 s; cold column: `capinfos -H` + one tshark pass with `-z io,phs -z conv,...`.
(e) pcap_text_search over 200 frames (limit=200, a query that does not stop early): target <= 2 s;
    cold column: one `tshark -Y FILTER -V` pass, output read to the end, first 200 frames searched.
(f) the first query on a fresh capture (the daemon never saw the file) vs cold tshark with the
    same filter: target <= 1.3x the cold time. The daemon is warmed up first with a call on a small
    capture (Wireshark's field catalogue is read once per daemon, not per capture).
(g) two clients on two different captures, a new filter each, concurrently vs one after the other:
    concurrent wall time / sequential sum, target <= 0.75 (0.5 = fully parallel on >= 2 cores,
    1.0 = serialized). Cold column: two tshark processes the same way.
(h) sharkd RSS per loaded capture (`diagd_status` actor details `sharkd_rss_bytes`) next to the
    peak RSS of one cold tshark run. No target: reported.

Output: a table `metric | cold tshark | diagd | ratio | target | met?`, or with --json one JSON
object with the same rows plus the raw samples. Exit status 0 even when targets are missed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _daemon import isolated_daemon

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.support.pcapedit import retag_sctp  # noqa: E402  (shared with the NGAP tests)

VENV_BIN = Path(sys.executable).parent
DIAGD = str(VENV_BIN / "diagd")
PCAPS_DIR = Path("/work/shared/pcaps")
SOURCE = "magma_gx_gy_combined_04.pcapng"
WARMUP_SOURCE = "magma_gx_gy_combined_03.pcapng"
CACHE_DIR = Path("/tmp/diagd-bench-cache")
RECIPE = 1  # bump when the way the capture is built changes: the cache key includes it
SHIFT_S = 40  # the source spans 38.2 s: copies follow each other without overlap
CALL_TIMEOUT_S = 120.0

# The queries: realistic Diameter/GTP work on this file.
FILTER = "diameter.cmd.code == 272"  # Credit-Control (Gx + Gy)
TIMELINE_FIELDS = ["diameter.Session-Id", "diameter.Result-Code", "diameter.CC-Request-Type"]
PAGE = 500  # frames_by_filter limit: the tool's default
TEXT_FILTER = "diameter.flags.request == 0"  # Diameter answers


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the capture


def tool_output(argv: list[str]) -> str:
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode(errors='replace')[-800:]}")
    return done.stdout.decode(errors="replace")


def count_frames(path: Path, display_filter: str) -> int:
    return len(tool_output(["tshark", "-r", str(path), "-Y", display_filter, "-T", "fields",
                            "-e", "frame.number"]).split())


def packet_count(path: Path) -> int:
    m = re.search(r"Number of packets:\s+(\d+)", tool_output(["capinfos", "-c", "-M", str(path)]))
    if not m:
        raise RuntimeError(f"capinfos gave no packet count for {path}")
    return int(m.group(1))


def build_capture(src: Path, copies: int, day: int, cache: Path) -> tuple[Path, bool]:
    """The merged capture (path, built now?). Cached by source, copies, variant and recipe."""
    out = cache / f"{src.stem}-x{copies}-day{day}-r{RECIPE}.pcapng"
    if out.exists():
        return out, False
    cache.mkdir(parents=True, exist_ok=True)
    log(f"building {out} ({copies} copies of {src.name})")
    with tempfile.TemporaryDirectory(dir=cache, prefix="build-") as tmp_dir:
        tmp = Path(tmp_dir)
        parts = []
        for i in range(copies):
            shifted = tmp / f"shifted_{i:03d}.pcapng"
            tool_output(["editcap", "-t", str(day * 86400 + i * SHIFT_S), str(src), str(shifted)])
            part = tmp / f"part_{i:03d}.pcapng"
            changed = retag_sctp(shifted, part, (i * 0x01010101) & 0xFFFFFFFF)
            if i and not changed:
                raise RuntimeError(f"{src} has no Ethernet/IPv4/SCTP packet to retag")
            shifted.unlink()
            parts.append(str(part))
        merged = tmp / "merged.pcapng"
        tool_output(["mergecap", "-a", "-w", str(merged), *parts])
        want = copies * count_frames(src, "diameter")
        got = count_frames(merged, "diameter")
        if got != want:
            raise RuntimeError(f"merged capture has {got} Diameter frames, expected {want} ({copies} copies)")
        os.replace(merged, out)
    return out, True


# --------------------------------------------------------------------------- cold tshark


@dataclass
class ColdRun:
    wall_s: float
    maxrss_kb: int
    stdout: bytes = b""


def run_cold(argv: list[str], consume: Callable[[bytes], None] | None = None, keep: bool = False) -> ColdRun:
    """One process, output read to the end; wall time and the child's own peak RSS (wait4)."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        chunks: list[bytes] = []
        while data := proc.stdout.read(1 << 20):
            if consume is not None:
                consume(data)
            if keep:
                chunks.append(data)
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: "
                               f"{err.read().decode(errors='replace')[-800:]}")
    return ColdRun(wall, usage.ru_maxrss, b"".join(chunks))


def tshark_filter(path: Path, display_filter: str) -> list[str]:
    return ["tshark", "-r", str(path), "-Y", display_filter]


class FirstFramesSearch:
    """Consumes `tshark -V` output: keeps the first N frames' text and searches it (the rest is read
    and dropped, as a wrapper reading the whole output would)."""

    HEADER = re.compile(rb"(?m)^Frame \d+: ")

    def __init__(self, frames: int, pattern: re.Pattern[str]) -> None:
        self.frames, self.pattern = frames, pattern
        self.head = bytearray()
        self.done = False
        self.frames_searched = 0
        self.matches = 0

    def __call__(self, data: bytes) -> None:
        if self.done:
            return
        self.head += data
        starts = [m.start() for m in self.HEADER.finditer(self.head)]
        if len(starts) > self.frames:
            del self.head[starts[self.frames]:]
            self.finish()

    def finish(self) -> None:
        if not self.done:
            self.done = True
            text = self.head.decode(errors="replace")
            self.frames_searched = len(self.HEADER.findall(self.head))
            self.matches = sum(1 for _ in self.pattern.finditer(text))
            self.head = bytearray()


# --------------------------------------------------------------------------- MCP client


class DiagdClient:
    """One MCP SDK client session (its own `diagd mcp` shim); calls timed by the client."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def call(self, tool: str, args: dict[str, Any], *, allow_error: bool = False
                   ) -> tuple[float, dict[str, Any], dict[str, Any]]:
        """(wall seconds, payload, _meta). Raises on a tool error unless allow_error."""
        import trio

        start = time.perf_counter()
        with trio.fail_after(CALL_TIMEOUT_S):
            result = await self.client.call_tool(tool, args)
        took = time.perf_counter() - start
        text = result.content[0].text if result.content else "{}"
        payload: dict[str, Any] = result.structured_content or json.loads(text)
        if result.is_error:
            payload = json.loads(text) if text.startswith("{") else {"message": text}
            if not allow_error:
                raise RuntimeError(f"{tool}({args}) failed: {text[:800]}")
            payload["_is_error"] = True
        return took, payload, dict(result.meta or {})


@asynccontextmanager
async def diagd_client(env: dict[str, str]) -> AsyncIterator[DiagdClient]:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    # The SDK passes only a few "safe" variables to the child unless told: give it ours.
    diagd_env = {k: v for k, v in env.items() if k.startswith("DIAGD_")}
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=diagd_env)
    async with Client(params, mode="legacy") as client:
        yield DiagdClient(client)


# --------------------------------------------------------------------------- results


@dataclass
class Row:
    key: str
    metric: str
    cold_s: float | None = None
    diagd_s: float | None = None
    ratio: float | None = None
    ratio_kind: str = ""  # "cold/diagd" (speed-up), "diagd/cold", "concurrent/sequential"
    target: str = ""
    met: bool | None = None
    note: str = ""
    unit: str = "s"  # "s" or "MB"
    diagd_text: str | None = None  # shown instead of diagd_s (e.g. an error)


def median(values: list[float]) -> float:
    return statistics.median(values)


def speedup_row(key: str, metric: str, cold: float, diagd: float, minimum: float, note: str = "") -> Row:
    ratio = cold / diagd
    return Row(key, metric, cold, diagd, ratio, "cold/diagd", f">= {minimum:g}x", ratio >= minimum, note)


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


def fmt_ratio(row: Row) -> str:
    if row.ratio is None:
        return "-"
    if row.ratio_kind == "cold/diagd":
        return f"{row.ratio:.1f}x faster" if row.ratio >= 1 else f"{1 / row.ratio:.2f}x slower"
    if row.ratio_kind == "diagd/cold":
        return f"{row.ratio:.2f}x cold"
    return f"{row.ratio:.2f}"


def render_table(report: dict[str, Any]) -> str:
    cap = report["capture"]
    cfg = report["config"]
    rows = [Row(**r) for r in report["rows"]]
    header = ("metric", "cold tshark", "diagd", "ratio", "target", "met?")
    cells = [header]
    for r in rows:
        met = "-" if r.met is None else ("yes" if r.met else "NO")
        cells.append((f"({r.key}) {r.metric}", fmt_value(r, r.cold_s), r.diagd_text or fmt_value(r, r.diagd_s),
                      fmt_ratio(r), r.target or "-", met))
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = [
        f"diagd pcap benchmark on {cap['path']}",
        f"  {cap['size_mb']:.1f} MB, {cap['frames']} frames ({cap['copies']} SCTP-retagged, time-shifted copies of "
        f"{cap['source']}), {cap['diameter_frames']} Diameter frames; filter {FILTER!r} matches "
        f"{cap['filter_matches']}",
        f"  cold = one tshark process per call (median of {cfg['cold_repeats']}); diagd = MCP SDK client -> "
        f"diagd mcp -> daemon -> sharkd (repeated: median of {cfg['repeats']}); {os.cpu_count()} CPUs",
        "",
    ]
    for i, row in enumerate(cells):
        lines.append(" | ".join([row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:],
                                                                                         strict=True))]))
        if i == 0:
            lines.append("-+-".join("-" * w for w in widths))
    lines.append(f"  run time {cfg.get('run_s', '?')} s; cached captures: {cap['path']}, {cap['second_path']}"
                 + (f" (built now: {len(cap['built_now'])})" if cap["built_now"] else " (reused)"))
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
    built: list[str] = field(default_factory=list)


def prepare(size_mb: float, cache: Path, pcaps: Path) -> Captures:
    src = pcaps / SOURCE
    if not src.is_file():
        raise SystemExit(f"missing source capture {src}")
    copies = max(1, math.ceil(size_mb * 1024 * 1024 / src.stat().st_size))
    a, built_a = build_capture(src, copies, 0, cache)
    b, built_b = build_capture(src, copies, 1, cache)
    for path in (a, b):  # warm the page cache: cold and warm runs read the same cached pages
        with open(path, "rb") as f:
            while f.read(1 << 22):
                pass
    return Captures(a, b, copies, [str(p) for p, built in ((a, built_a), (b, built_b)) if built])


async def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    import trio

    caps = prepare(args.size_mb, args.cache_dir, args.pcaps_dir)
    A, B = caps.a, caps.b
    cold_n, warm_n = args.cold_repeats, args.repeats
    rows: list[Row] = []
    samples: dict[str, Any] = {}

    async def cold(argv: list[str], **kw: Any) -> ColdRun:
        return await trio.to_thread.run_sync(lambda: run_cold(argv, **kw))

    async def cold_median(argv: list[str], n: int = cold_n, **kw: Any) -> tuple[float, list[ColdRun]]:
        runs = [await cold(argv, **kw) for _ in range(n)]
        samples.setdefault("cold", {})[" ".join(argv)] = [round(r.wall_s, 4) for r in runs]
        return median([r.wall_s for r in runs]), runs

    await cold(["tshark", "-r", str(args.pcaps_dir / WARMUP_SOURCE), "-c", "1"])  # libraries into the page cache
    frames_total = await trio.to_thread.run_sync(lambda: packet_count(A))
    diameter_total = await trio.to_thread.run_sync(lambda: count_frames(A, "diameter"))

    config = f"[daemon]\nallowed_dirs = {json.dumps([str(d) for d in (args.cache_dir, args.pcaps_dir)])}\n"
    with isolated_daemon("pcap", config=config, extra_env={"DIAGD_LOG_LEVEL": "info"}) as bench:
        async with diagd_client(bench.env) as c1, diagd_client(bench.env) as c2:
            # Daemon warm-up: the first pcap call reads Wireshark's catalogue (tshark -G fields).
            log("warm-up: pcap_info on a small capture")
            warm_s, _, _ = await c1.call("pcap_info", {"pcap_path": str(args.pcaps_dir / WARMUP_SOURCE)})
            rows.append(Row("-", "daemon warm-up: first pcap call (catalogue + 0.1 MB capture)", None, warm_s,
                            note="once per daemon, excluded from (f)"))

            # (f) first query on a fresh capture, and the cold runs of the same filter.
            log(f"(f) cold tshark -Y {FILTER!r} x{cold_n}")
            cold_f, runs_f = await cold_median(tshark_filter(A, FILTER), keep=True)
            matched = [int(line.split()[0]) for line in runs_f[-1].stdout.decode(errors="replace").splitlines()
                       if line.strip()]
            frames_args = {"pcap_path": str(A), "display_filter": FILTER, "limit": PAGE}
            log("(f) diagd: first query on the fresh capture")
            fresh_s, first, meta = await c1.call("pcap_frames_by_filter", frames_args)
            if first["total"] != len(matched):
                raise RuntimeError(f"diagd found {first['total']} frames for {FILTER!r}, tshark {len(matched)}")
            samples["fresh_first_query"] = {"client_s": fresh_s, "meta": meta}
            ratio = fresh_s / cold_f
            rows.append(Row("f", f"first query on a fresh capture (frames_by_filter {FILTER})", cold_f, fresh_s,
                            ratio, "diagd/cold", "<= 1.3x", ratio <= 1.3,
                            note="sha256 + sharkd load + filter pass + page rows"))

            # (a) repeated frames_by_filter.
            log(f"(a) repeated frames_by_filter x{warm_n}")
            warm = [(await c1.call("pcap_frames_by_filter", frames_args))[0] for _ in range(warm_n)]
            samples["repeated_frames_s"] = warm
            rows.append(speedup_row("a", f"repeated frames_by_filter (limit={PAGE})", cold_f, median(warm), 20))

            # (a) timeline: first call on the loaded capture, then repeated.
            timeline_args = {"pcap_path": str(A), "display_filter": FILTER, "fields": TIMELINE_FIELDS,
                             "limit": 200}
            fields_argv = [*tshark_filter(A, FILTER), "-T", "fields", "-e", "frame.number",
                           *(x for f in TIMELINE_FIELDS for x in ("-e", f))]
            log(f"(a) cold tshark -T fields x{cold_n}")
            cold_t, _ = await cold_median(fields_argv)
            log("(a) timeline: first call, then repeated")
            first_t, timeline, _ = await c1.call("pcap_timeline", timeline_args)
            rows.append(speedup_row("-", "timeline, first call (filter known, 200 frame trees)", cold_t, first_t,
                                    1, note="not a target: the first page of a timeline"))
            rows[-1].target, rows[-1].met = "", None
            warm = [(await c1.call("pcap_timeline", timeline_args))[0] for _ in range(warm_n)]
            samples["repeated_timeline_s"] = warm
            rows.append(speedup_row("a", "repeated timeline (limit=200, 3 Diameter fields)", cold_t, median(warm),
                                    20))

            # (b) new filters on the loaded capture.
            session_id = next(r["diameter.Session-Id"] for r in timeline["rows"] if r.get("diameter.Session-Id"))
            session_id = session_id[0] if isinstance(session_id, list) else session_id
            new_filters = [TEXT_FILTER, "gtp.message == 0xff", f"diameter.Session-Id == {json.dumps(session_id)}"]
            cold_b, warm_b = [], []
            for flt in new_filters:
                log(f"(b) new filter {flt!r}: cold, then diagd")
                cold_b.append((await cold(tshark_filter(A, flt))).wall_s)
                took, page, _ = await c1.call("pcap_frames_by_filter", {"pcap_path": str(A), "display_filter": flt,
                                                                       "limit": PAGE})
                warm_b.append(took)
                samples.setdefault("new_filters", []).append({"filter": flt, "cold_s": cold_b[-1], "diagd_s": took,
                                                              "total": page["total"]})
            rows.append(speedup_row("b", "new filter on a loaded capture (3 filters, median)", median(cold_b),
                                    median(warm_b), 2.5, note="; ".join(new_filters)))

            # (c) frame detail of frames not fetched before (the last matches of FILTER).
            detail_frames = matched[-5:]
            log(f"(c) frame detail: cold -V x{cold_n}, diagd x{len(detail_frames)}")
            cold_c = median([(await cold([*tshark_filter(A, f"frame.number == {n}"), "-V"])).wall_s
                             for n in detail_frames[:cold_n]])
            warm_c = [(await c1.call("pcap_frame_detail", {"pcap_path": str(A), "frame_numbers": [n]}))[0]
                      for n in detail_frames]
            samples["frame_detail_s"] = warm_c
            rows.append(speedup_row("c", "frame_detail, one frame (full tree)", cold_c, median(warm_c), 100,
                                    note=f"frames {detail_frames}"))

            # (e) text search over 200 frames of a filter applied in (b).
            query = session_id.rsplit(";", 1)[-1]  # the subscriber (IMSI...) in that Session-Id
            pattern = re.compile(re.escape(query), re.IGNORECASE)
            log(f"(e) text search {query!r} over 200 frames: cold -V x{cold_n}, diagd x2")
            searches = []

            def searching() -> Callable[[bytes], None]:
                searches.append(FirstFramesSearch(200, pattern))
                return searches[-1]

            text_argv = [*tshark_filter(A, TEXT_FILTER), "-V"]
            cold_e = median([(await cold(text_argv, consume=searching())).wall_s for _ in range(cold_n)])
            for s in searches:
                s.finish()
            warm_e = []
            for offset in (0, 200):
                took, found, _ = await c1.call("pcap_text_search", {
                    "pcap_path": str(A), "display_filter": TEXT_FILTER, "query": query, "limit": 200,
                    "offset": offset, "max_matches": 1000})
                warm_e.append(took)
                samples.setdefault("text_search", []).append({"offset": offset, "client_s": took,
                                                              "frames_scanned": found["frames_scanned"],
                                                              "matches": found["match_count"],
                                                              "truncated": found["truncated"]})
            scanned = [s["frames_scanned"] for s in samples["text_search"]]
            rows.append(Row("e", "text_search over 200 frames (filter known)", cold_e, median(warm_e),
                            cold_e / median(warm_e), "cold/diagd", "<= 2 s", median(warm_e) <= 2.0,
                            note=f"query {query!r} in {TEXT_FILTER!r}, frames scanned {scanned}, cold searched "
                                 f"{searches[0].frames_searched} frames ({searches[0].matches} matches)"))

            # (d) pcap_info: capture A is loaded but not analysed yet; B was never seen.
            info_argv = ["tshark", "-r", str(A), "-q", "-z", "io,phs", "-z", "conv,sctp", "-z", "conv,ip",
                         "-z", "conv,udp", "-z", "conv,tcp"]
            log(f"(d) cold capinfos + tshark -z io,phs -z conv,... x{cold_n}")
            cold_d = median([(await cold(["capinfos", "-c", "-u", "-a", "-e", "-H", str(A)])).wall_s
                             + (await cold(info_argv)).wall_s for _ in range(cold_n)])
            log("(d) pcap_info on the loaded capture, then on a fresh one")
            info_loaded, info, _ = await c1.call("pcap_info", {"pcap_path": str(A)})
            info_fresh, _, _ = await c2.call("pcap_info", {"pcap_path": str(B)})
            samples["pcap_info"] = {"loaded_s": info_loaded, "fresh_s": info_fresh, "load_s": info.get("load_s"),
                                    "has_protocols": info.get("has_protocols")}
            for label, took in (("fresh capture: hash + load + analysis", info_fresh),
                                ("capture already loaded", info_loaded)):
                rows.append(Row("d", f"pcap_info, {label}", cold_d, took, cold_d / took, "cold/diagd", "<= 2.5 s",
                                took <= 2.5))

            # (g) two clients, two captures, a new filter each: sequential vs concurrent.
            log("(g) cold: two tshark processes sequentially, then concurrently")
            seq_cold = (await cold(tshark_filter(A, FILTER))).wall_s + (await cold(tshark_filter(B, FILTER))).wall_s
            conc_cold = await concurrently([lambda: cold(tshark_filter(A, FILTER)),
                                            lambda: cold(tshark_filter(B, FILTER))])
            seq_warm, conc_warm = [], []
            for rnd in range(args.rounds):
                log(f"(g) diagd round {rnd + 1}/{args.rounds}: sequential, then concurrent")

                def frames_call(client: DiagdClient, path: Path, k: int) -> Callable[[], Any]:
                    flt = f"{FILTER} && frame.len > {k}"  # new to both captures, same work each time
                    return lambda: client.call("pcap_frames_by_filter", {"pcap_path": str(path),
                                                                          "display_filter": flt, "limit": PAGE})

                k = 4 * rnd
                start = time.perf_counter()
                await frames_call(c1, A, k + 1)()
                await frames_call(c2, B, k + 1)()
                seq_warm.append(time.perf_counter() - start)
                conc_warm.append(await concurrently([frames_call(c1, A, k + 2), frames_call(c2, B, k + 2)]))
            samples["two_clients"] = {"sequential_s": seq_warm, "concurrent_s": conc_warm,
                                      "cold_sequential_s": seq_cold, "cold_concurrent_s": conc_cold}
            ratio = median(conc_warm) / median(seq_warm)
            rows.append(Row("g", "two clients, two captures: concurrent / sequential wall", conc_cold / seq_cold,
                            ratio, ratio, "concurrent/sequential", "<= 0.75", ratio <= 0.75, unit="ratio",
                            note=f"diagd sequential {fmt_time(median(seq_warm))}, concurrent "
                                 f"{fmt_time(median(conc_warm))}; cold tshark sequential {fmt_time(seq_cold)}, "
                                 f"concurrent {fmt_time(conc_cold)}; new filter '{FILTER} && frame.len > k'"))

            # (h) memory per loaded capture.
            _, status, _ = await c1.call("diagd_status", {})
            loaded = {a["details"].get("path"): a["details"] for a in status["actors"] if a.get("kind") == "pcap"}
            samples["loaded_captures"] = loaded
            tshark_rss_mb = max(r.maxrss_kb for r in runs_f) / 1024
            small = args.pcaps_dir / WARMUP_SOURCE
            for label, path in (("A", A), ("B", B), ("baseline", small)):
                details = loaded.get(str(path), {})
                rss = details.get("sharkd_rss_bytes")
                rows.append(Row("h", f"sharkd RSS, capture {label} ({path.stat().st_size / 1e6:.1f} MB)",
                                tshark_rss_mb if path != small else None,
                                None if rss is None else rss / 2**20, unit="MB",
                                note=f"{details.get('frames')} frames, load_s {details.get('load_s')}"
                                     + ("; cold = peak RSS of one tshark -Y run on A (wait4), diagd = sharkd VmRSS"
                                        if label == "A" else "")))


    return {
        "config": {"size_mb": args.size_mb, "repeats": warm_n, "cold_repeats": cold_n, "rounds": args.rounds,
                   "page_limit": PAGE, "filter": FILTER, "timeline_fields": TIMELINE_FIELDS,
                   "cpus": os.cpu_count(), "python": sys.version.split()[0],
                   "tshark": tool_output(["tshark", "-v"]).splitlines()[0]},
        "capture": {"path": str(A), "second_path": str(B), "source": SOURCE, "copies": caps.copies,
                    "size_mb": A.stat().st_size / 1e6, "frames": frames_total, "diameter_frames": diameter_total,
                    "filter_matches": len(matched), "built_now": caps.built},
        "rows": [asdict(r) for r in rows],
        "samples": samples,
    }


async def concurrently(calls: list[Callable[[], Any]]) -> float:
    """Wall time of running the given coroutine factories at the same time."""
    import trio

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for call in calls:
            nursery.start_soon(call)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size-mb", type=float, default=50, help="minimum capture size in MiB (default 50)")
    parser.add_argument("--repeats", type=int, default=20, help="repeated diagd calls per query (default 20)")
    parser.add_argument("--cold-repeats", type=int, default=3, help="cold tshark runs per query (default 3)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the two-client test (default 2)")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help=f"built captures (default {CACHE_DIR})")
    parser.add_argument("--pcaps-dir", type=Path, default=PCAPS_DIR, help=f"real captures (default {PCAPS_DIR})")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    if min(args.repeats, args.cold_repeats, args.rounds) < 1 or args.size_mb <= 0:
        parser.error("--size-mb, --repeats, --cold-repeats and --rounds must be positive")
    args.cache_dir, args.pcaps_dir = args.cache_dir.resolve(), args.pcaps_dir.resolve()
    repo = Path(__file__).resolve().parent.parent
    if args.cache_dir == repo or repo in args.cache_dir.parents:
        parser.error("--cache-dir must be outside the repository (no captures in the repo)")

    import trio

    started = time.perf_counter()
    report = trio.run(run_benchmark, args)
    report["config"]["run_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=2, default=str) if args.json else render_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
