"""Tools of bench/pcap.py: the merged captures, cold and early-stopping ("peer") tshark runs, the MCP
client, process RSS. See bench/pcap.py's docstring for what is measured with them."""

from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.support.pcapedit import packets, retag_sctp  # noqa: E402  (shared with the NGAP tests)

VENV_BIN = Path(sys.executable).parent
DIAGD = str(VENV_BIN / "diagd")
RECIPE = 1  # bump when the way the capture is built changes: the cache key includes it
SHIFT_S = 40  # the source spans 38.2 s: copies follow each other without overlap
CALL_TIMEOUT_S = 120.0  # client side; the daemon's own call timeout (30 s by default) comes first


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


# The dense user-plane capture: the GTP-U frames of the corpus' two captures of user traffic over
# GTP-U (TCP, TLS, HTTP, DNS, ICMP inside the tunnel), merged into one unit of 496 frames (the second
# capture's frames shifted to begin DENSE_OFFSET_S after the first's), repeated like the Diameter
# capture. Each copy after the first has its inner IPv4 addresses changed (see readdress_gtpu): else
# every copy repeats the first one's TCP connections with the same sequence numbers, tshark marks them
# retransmissions and never dissects their TLS or HTTP (the build checks the TLS frame count).
DENSE_SOURCES = ("5greplay_oai.pcap", "oaifed_cotsue_core.pcap")  # in the corpus' pcaps/, pcaps-extra/
DENSE_OFFSET_S = 1.5
DENSE_RECIPE = 1
GTPU_PORT = 2152
LINKTYPE_ETHERNET, LINKTYPE_LINUX_SLL = 1, 113


def _ipv4_header_checksum(data: bytearray, ip: int) -> None:
    length = (data[ip] & 0x0F) * 4
    struct.pack_into(">H", data, ip + 10, 0)
    total = sum(struct.unpack_from(f">{length // 2}H", data, ip))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    struct.pack_into(">H", data, ip + 10, ~total & 0xFFFF)


def _gtpu_inner_ipv4(data: bytearray, offset: int, caplen: int, linktype: int) -> int | None:
    """Offset (into the file's bytes) of the inner IPv4 header of an Ethernet or Linux cooked / IPv4 /
    UDP 2152 / GTP-U T-PDU packet, or None."""
    end = offset + caplen
    if linktype == LINKTYPE_ETHERNET:
        off, ethertype = 14, struct.unpack_from(">H", data, offset + 12)[0] if caplen >= 14 else 0
        while ethertype in (0x8100, 0x88A8) and caplen >= off + 4:
            ethertype = struct.unpack_from(">H", data, offset + off + 2)[0]
            off += 4
    elif linktype == LINKTYPE_LINUX_SLL and caplen >= 16:
        off, ethertype = 16, struct.unpack_from(">H", data, offset + 14)[0]
    else:
        return None
    ip = offset + off
    if ethertype != 0x0800 or ip + 28 > end or data[ip + 9] != 17 or struct.unpack_from(">H", data, ip + 6)[0] & 0x3FFF:
        return None  # not UDP, or a fragment
    udp = ip + (data[ip] & 0x0F) * 4
    if udp + 16 > end or GTPU_PORT not in struct.unpack_from(">HH", data, udp):
        return None
    gtp = udp + 8
    flags, message = data[gtp], data[gtp + 1]
    if flags >> 5 != 1 or message != 0xFF:  # GTPv1, T-PDU
        return None
    inner = gtp + 8
    if flags & 0x07:  # sequence number, N-PDU number, next extension header type
        if inner + 4 > end:
            return None
        next_type = data[inner + 3]
        inner += 4
        while next_type:  # extension headers: a length in 4-byte units, the next type last
            if inner >= end or not data[inner]:
                return None
            inner += data[inner] * 4
            if inner > end:
                return None
            next_type = data[inner - 1]
    return inner if inner + 20 <= end and data[inner] >> 4 == 4 else None


def readdress_gtpu(src: Path, dst: Path, salt: int, at: int = 1) -> int:
    """Copy a capture, XORing two bytes of both inner IPv4 addresses of every GTP-U T-PDU (from byte
    `at`: the second and third by default) with `salt` (16 bits), the inner IPv4 checksum recomputed.
    Returns how many packets changed.
    Checksums over the addresses (inner TCP/UDP, outer UDP) are left: tshark does not check them by
    default, as with the SCTP retag."""
    data = bytearray(src.read_bytes())
    changed = 0
    if salt:
        for packet in list(packets(data)):
            ip = _gtpu_inner_ipv4(data, packet.offset, packet.caplen, packet.linktype)
            if ip is None:
                continue
            for address in (ip + 12, ip + 16):
                struct.pack_into(">H", data, address + at, struct.unpack_from(">H", data, address + at)[0] ^ salt)
            _ipv4_header_checksum(data, ip)
            changed += 1
    dst.write_bytes(bytes(data))
    return changed


def dense_sources() -> list[Path]:
    """DENSE_SOURCES in the test corpus' cache (tests/pcaps.py)."""
    from tests.pcaps import PCAPS, PCAPS_EXTRA

    sources = [PCAPS / DENSE_SOURCES[0], PCAPS_EXTRA / DENSE_SOURCES[1]]
    for source in sources:
        if not source.is_file():
            raise SystemExit(f"missing source capture {source}")
    return sources


def dense_unit(sources: list[Path], tmp: Path) -> Path:
    """One copy: the GTP-U T-PDU frames of `sources`, each after the first shifted to begin
    DENSE_OFFSET_S after the one before it began, merged in time order."""
    parts = []
    first_s: float | None = None
    for i, source in enumerate(sources):
        part = tmp / f"unit_{i}.pcapng"
        tool_output(["tshark", "-r", str(source), "-Y", "gtp.message == 0xff", "-F", "pcapng", "-w", str(part)])
        start = float(re.findall(r"First packet time:\s+(\S+)",
                                 tool_output(["capinfos", "-a", "-S", str(part)]))[0])
        if first_s is None:
            first_s = start
        else:
            shifted = tmp / f"unit_{i}_shifted.pcapng"
            tool_output(["editcap", "-t", f"{first_s + DENSE_OFFSET_S * i - start:.6f}", str(part), str(shifted)])
            part = shifted
        parts.append(str(part))
    unit = tmp / "unit.pcapng"
    tool_output(["mergecap", "-w", str(unit), *parts])
    return unit


MERGE_BATCH = 200  # mergecap opens every input at once: a 1 GB build merges in batches
SCALED_RECIPE = 1


def build_scaled_capture(base: Path, copies: int, cache: Path) -> tuple[Path, bool]:
    """`copies` of the dense capture `base` one after the other (path, built now?): each shifted past
    the end of the one before and, after the first, its inner IPv4 addresses' first octet XORed with
    0x40 + its place (build_dense_capture's copies differ in the second and third), so no two copies
    share a UE's flows. For the 10 GB rows: ten copies of the 1 GB capture. Cached."""
    out = cache / f"{base.stem}-x{copies}-r{SCALED_RECIPE}.pcapng"
    if out.exists():
        return out, False
    span_s = float(re.findall(r"Capture duration:\s+(\S+)", tool_output(["capinfos", "-u", str(base)]))[0])
    shift_s = math.ceil(span_s) + SHIFT_S
    with tempfile.TemporaryDirectory(dir=cache, prefix="build-") as tmp_dir:
        tmp = Path(tmp_dir)
        parts = []
        for j in range(copies):
            log(f"building {out}: copy {j + 1} of {copies}")
            shifted = tmp / f"shifted_{j}.pcapng"
            tool_output(["editcap", "-t", str(j * shift_s), str(base), str(shifted)])
            if j:
                part = tmp / f"part_{j}.pcapng"
                readdress_gtpu(shifted, part, (0x40 + j) << 8, at=0)
                shifted.unlink()
                shifted = part
            parts.append(str(shifted))
        merged = tmp / "merged.pcapng"
        tool_output(["mergecap", "-a", "-w", str(merged), *parts])
        os.replace(merged, out)
    return out, True


def build_dense_capture(sources: list[Path], size_mb: float, cache: Path, day: int = 0) -> tuple[Path, bool]:
    """The dense user-plane capture of at least `size_mb` MiB (path, built now?): time-shifted,
    readdressed copies of dense_unit, appended; `day` shifts it all by days (the same work, another
    file). Cached by size, day and recipe."""
    out = cache / f"dense_gtpu-{size_mb:g}MiB{f'-day{day}' if day else ''}-r{DENSE_RECIPE}.pcapng"
    if out.exists():
        return out, False
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="build-") as tmp_dir:
        tmp = Path(tmp_dir)
        unit = dense_unit(sources, tmp)
        copies = max(1, math.ceil(size_mb * 2**20 / unit.stat().st_size))
        log(f"building {out} ({copies} copies of the GTP-U frames of {', '.join(s.name for s in sources)})")
        unit_tls = count_frames(unit, "tls")
        batches: list[str] = []
        parts: list[str] = []

        def merge_parts() -> None:
            batch = tmp / f"batch_{len(batches):04d}.pcapng"
            tool_output(["mergecap", "-a", "-w", str(batch), *parts])
            for part in parts:
                Path(part).unlink()
            parts.clear()
            batches.append(str(batch))

        for i in range(copies):
            shifted = tmp / f"shifted_{i:05d}.pcapng"
            tool_output(["editcap", "-t", str(day * 86400 + i * SHIFT_S), str(unit), str(shifted)])
            part = tmp / f"part_{i:05d}.pcapng"
            if readdress_gtpu(shifted, part, i & 0xFFFF) == 0 and i:
                raise RuntimeError("the dense unit has no GTP-U packet with inner IPv4 to readdress")
            shifted.unlink()
            parts.append(str(part))
            if len(parts) == MERGE_BATCH:
                merge_parts()
        if parts:
            merge_parts()
        merged = tmp / "merged.pcapng"
        if len(batches) == 1:
            os.replace(batches[0], merged)
        else:
            tool_output(["mergecap", "-a", "-w", str(merged), *batches])
        want = copies * unit_tls
        got = count_frames(merged, "tls")
        if got != want:
            raise RuntimeError(f"dense capture has {got} TLS frames, expected {want} ({copies} copies)")
        os.replace(merged, out)
    return out, True


def warm_page_cache(path: Path) -> None:
    """Cold, peer and diagd runs read the same cached pages."""
    with open(path, "rb") as f:
        while f.read(1 << 22):
            pass


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


@dataclass
class PeerRun:
    wall_s: float  # start to the moment `limit` rows had arrived (or tshark ended by itself)
    rows: list[bytes]
    stopped_early: bool  # killed once the rows had arrived (False: tshark read the whole file)


def run_peer(argv: list[str], limit: int, *, frames: bool = False) -> PeerRun:
    """The per-call tshark method with early stop: read stdout until `limit` rows have arrived (lines;
    with frames=True, `-V` frames, each ended by a blank line), then kill tshark. The argv should
    carry `-l` (flush after each packet), so rows arrive as they are found."""
    sep = b"\n\n" if frames else b"\n"
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        buf = bytearray()
        rows: list[bytes] = []
        eof = False
        try:
            while len(rows) < limit:
                data = os.read(proc.stdout.fileno(), 1 << 16)
                if not data:
                    eof = True
                    break
                buf += data
                while len(rows) < limit and (i := buf.find(sep)) >= 0:
                    rows.append(bytes(buf[:i]))
                    del buf[:i + len(sep)]
            wall = time.perf_counter() - start
        finally:
            if not eof:
                proc.kill()
            proc.stdout.close()
            code = proc.wait()
        if eof and code != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(argv)} exited {code}: {err.read().decode(errors='replace')[-800:]}")
    return PeerRun(wall, rows, not eof)


def tshark_filter(path: Path, display_filter: str) -> list[str]:
    """The cold packet list of the original rows, as before the peer column (kept comparable)."""
    return ["tshark", "-r", str(path), "-Y", display_filter]


def tabs_argv(path: Path, display_filter: str, *, flush: bool) -> list[str]:
    """The packet list (default columns, tab-separated, no name resolution), as a wrapper asks for it."""
    return ["tshark", "-n", *(["-l"] if flush else []), "-r", str(path), "-Y", display_filter, "-T", "tabs"]


def first_numbers(rows: list[bytes]) -> list[int]:
    """Frame numbers of `-T tabs` / `-T fields -e frame.number ...` rows (the first cell)."""
    return [int(r.split(b"\t", 1)[0]) for r in rows if r.strip()]


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

    async def call(self, tool: str, args: dict[str, Any], *, allow_error: bool = False,
                   timeout_s: float = CALL_TIMEOUT_S) -> tuple[float, dict[str, Any], dict[str, Any]]:
        """(wall seconds, payload, _meta). Raises on a tool error unless allow_error: then the payload
        is the error ({code, message, details}) with `_is_error` set."""
        import trio

        start = time.perf_counter()
        with trio.fail_after(timeout_s):
            result = await self.client.call_tool(tool, args)
        took = time.perf_counter() - start
        text = result.content[0].text if result.content else "{}"
        if result.is_error:
            payload: dict[str, Any] = json.loads(text) if text.startswith("{") else {"message": text}
            if not allow_error:
                raise RuntimeError(f"{tool}({args}) failed: {text[:800]}")
            payload["_is_error"] = True
        else:
            payload = result.structured_content or json.loads(text)
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


def check_total(page: dict[str, Any], expected: int, what: str) -> None:
    """A page's count against tshark's. `total_exact`/`total_at_least` are optional: a first page
    answered before the whole file was filtered may only know a lower bound."""
    if page.get("total_exact", True) and "total" in page:
        if page["total"] != expected:
            raise RuntimeError(f"diagd found {page['total']} frames for {what}, tshark {expected}")
        return
    at_least = page.get("total_at_least", page.get("total"))
    if isinstance(at_least, int) and at_least > expected:
        raise RuntimeError(f"diagd found at least {at_least} frames for {what}, tshark only {expected}")


def vmrss_mb(pid: int) -> float:
    """VmRSS of one process (its children not counted)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")
