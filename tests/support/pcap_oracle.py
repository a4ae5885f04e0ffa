"""The packet-level pcap answers computed a second time from tshark, capinfos and `tshark -G` alone.

It never imports diagd: each function runs Wireshark's own command-line tool the way a user would
(`-n -2`, an empty configuration directory, TZ=UTC) and reads what it prints:

- `matching`: the frames a display filter keeps (`-Y F -T fields -e frame.number`);
- `columns`: the default packet-list columns, by their titles (`-T fields -e _ws.col.No. ...`);
- `layers`: the distinct layers of `frame.protocols`, in order of first appearance;
- `detail`: the `-V` text of some frames (`-Y "frame.number in {...}"`), cut into frames;
- `capinfos`: `capinfos -M -T` (one table row: count, time span, ...);
- `conversations` / `endpoints`: the rows of `-q -z conv,P` / `-q -z endpoints,P`;
- `field_catalogue`: the `F` lines of `tshark -G fields`.

Decode-as rules come from the captures' MANIFEST.md (HTTP/2 on ports tshark 4.0.17 never detects).
Answers are cached on disk (outside the repository), keyed by the capture's identity, the tshark
version, this file's source and the arguments: the e2e comparisons ask the same ones often.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.support.capture_identity import content_id

CACHE = Path(os.environ.get("DIAGD_TEST_TREE_CACHE", Path(tempfile.gettempdir()) / f"diagd-trees-{os.getuid()}"))
HANG_GUARD_S = 600  # not a measurement: only stops a tshark that hangs
COLUMN_TITLES = ("No.", "Time", "Source", "Destination", "Protocol", "Length", "Info")

# MANIFEST.md ("How to decode these files"): HTTP/2 SBI on 7777 (Open5GS) and 8000 (free5GC) needs
# decode-as; on 8080 with a preface it is found alone; HTTP/1.1 SBI must not be forced to HTTP/2.
_DECODE_AS = (
    (re.compile(r"^adrian_.*_sbi\.pcap$"), "tcp.port==7777,http2"),
    (re.compile(r"^ngtester_(open5gs_T04|initue_open5gs)_"), "tcp.port==7777,http2"),
    (re.compile(r"^ngtester_chain_free5gc_"), "tcp.port==8000,http2"),
)


def decode_as(path: Path) -> list[str]:
    """The decode-as rules MANIFEST.md gives for this capture (none for most)."""
    return [rule for pattern, rule in _DECODE_AS if pattern.search(path.name)]


@functools.cache
def _conf() -> str:
    """An empty Wireshark configuration directory: default preferences, whoever runs the tests."""
    return tempfile.mkdtemp(prefix="pcap-oracle-conf-")


def _env() -> dict[str, str]:
    conf = _conf()
    return {"PATH": "/usr/bin:/bin", "TZ": "UTC", "LC_ALL": "C.UTF-8", "WIRESHARK_CONFIG_DIR": conf, "HOME": conf}


def run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=HANG_GUARD_S, env=_env())
    if done.returncode != 0:
        raise AssertionError(f"{argv} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def tshark(path: Path, *args: str) -> str:
    return run(["tshark", "-r", str(path), "-n", "-2", *[a for rule in decode_as(path) for a in ("-d", rule)],
                *args])


def tshark_kept(path: Path, *args: str) -> str:
    """tshark() of this capture, kept on disk (cached_text): the same run is not made again."""
    return cached_text(path, ["tshark-kept", *args], lambda: tshark(path, *args))


@functools.cache
def tshark_version() -> str:
    return run(["tshark", "-v"]).splitlines()[0]


def _cached(path: Path | None, kind: str, args: Any, compute: Any) -> Any:
    """compute(), kept on disk as JSON per capture, tshark version, this file and the arguments."""
    identity = "" if path is None else content_id(path)
    key = hashlib.sha256(repr((identity, tshark_version(), kind, json.dumps(args),
                               Path(__file__).read_bytes())).encode()).hexdigest()[:24]
    cached = CACHE / f"{path.name if path else 'tshark'}.{key}.{kind}.oracle.json"
    if cached.exists():
        return json.loads(cached.read_text())
    found = compute()
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(found))
    tmp.replace(cached)
    return found


def config_key(env: Mapping[str, str] | None = None) -> str:
    """What of a Wireshark tool's environment its output depends on, for a cache key (with argv and version):
    TZ, the locale, and the contents (not the path) of the personal configuration and plugin directories it
    reads. `env`: the environment it runs with (None: this process's, which a subprocess inherits)."""
    env = os.environ if env is None else env
    home = Path(env.get("HOME") or Path.home())
    if env.get("WIRESHARK_CONFIG_DIR"):
        conf = Path(env["WIRESHARK_CONFIG_DIR"])
    elif (home / ".wireshark").is_dir():
        conf = home / ".wireshark"
    else:
        conf = Path(env.get("XDG_CONFIG_HOME") or home / ".config") / "wireshark"
    digest = hashlib.sha256()
    for root in (conf, home / ".local" / "lib" / "wireshark"):
        for f in sorted(root.rglob("*")) if root.is_dir() else []:
            if f.is_file():
                digest.update(repr((root == conf, str(f.relative_to(root)), f.read_bytes())).encode())
    locale = ",".join(f"{k}={env[k]}" for k in ("TZ", "LC_ALL", "LC_TIME", "LC_NUMERIC", "LANG") if k in env)
    return f"env:{locale};config:{digest.hexdigest()[:16]}"


def cached_text(path: Path, argv: list[str], compute: Callable[[], str]) -> str:
    """What a reference tool run printed for this capture (compute()), kept on disk by the capture's
    identity, the tshark version and the argv (the capture's own path in it does not count)."""
    text: str = _cached(path, "text", ["<capture>" if a == str(path) else a for a in argv], compute)
    return text


def cached_tool_text(argv: list[str], compute: Callable[[], str]) -> str:
    """What a reference tool run that reads no capture printed (`tshark -G ...`: compute()), kept on disk by
    the tshark version and the argv (with config_key() in it when the configuration matters)."""
    text: str = _cached(None, "text", argv, compute)
    return text


def matching(path: Path, display_filter: str) -> list[int]:
    """The frame numbers `-Y display_filter` keeps, in capture order."""
    def compute() -> list[int]:
        out = tshark(path, *(["-Y", display_filter] if display_filter else []), "-T", "fields", "-e", "frame.number")
        return [int(line) for line in out.splitlines() if line]
    result: list[int] = _cached(path, "matching", display_filter, compute)
    return result


def columns(path: Path) -> dict[int, list[str]]:
    """{frame number: the seven default columns as tshark prints them} for every frame."""
    def compute() -> list[list[str]]:
        out = tshark(path, "-T", "fields", "-E", "separator=\t",
                     *[a for t in COLUMN_TITLES for a in ("-e", f"_ws.col.{t}")])
        rows = [line.split("\t") for line in out.split("\n") if line]
        assert all(len(r) == len(COLUMN_TITLES) for r in rows), "a column held a tab"
        return rows
    return {int(r[0]): r for r in _cached(path, "columns", COLUMN_TITLES, compute)}


def layers(path: Path) -> list[str]:
    """The distinct layers of every frame's frame.protocols, in order of first appearance."""
    def compute() -> list[str]:
        seen: dict[str, None] = {}
        for line in tshark(path, "-T", "fields", "-e", "frame.protocols").splitlines():
            for layer in line.split(":"):
                if layer:
                    seen.setdefault(layer, None)
        return list(seen)
    result: list[str] = _cached(path, "layers", None, compute)
    return result


FRAME_START = re.compile(r"^Frame (\d+): ", re.MULTILINE)


def detail(path: Path, numbers: list[int], *, hex_dump: bool = False) -> dict[int, str]:
    """{frame: its `tshark -V` text} with those frames displayed (each block without its blank line)."""
    def compute() -> dict[str, str]:
        members = ",".join(map(str, sorted(set(numbers))))
        text = tshark(path, "-Y", f"frame.number in {{{members}}}", "-V", *(["-x"] if hex_dump else []))
        starts = list(FRAME_START.finditer(text))
        blocks = {}
        for i, m in enumerate(starts):
            end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
            blocks[m.group(1)] = text[m.start():end].removesuffix("\n").removesuffix("\n")
        return blocks
    return {int(n): text for n, text in _cached(path, "detail", [sorted(set(numbers)), hex_dump], compute).items()}


def capinfos(path: Path) -> dict[str, str]:
    """`capinfos -M -T`: its header row's titles -> this capture's values."""
    def compute() -> dict[str, str]:
        header, row = run(["capinfos", "-M", "-T", str(path)]).split("\n")[:2]
        return dict(zip(header.split("\t"), row.split("\t"), strict=True))
    result: dict[str, str] = _cached(path, "capinfos", None, compute)
    return result


_UNITS = {"bytes": 1, "kB": 1000, "MB": 1000**2, "GB": 1000**3}
_SIZE = r"(\d+) (bytes|kB|MB|GB)"


def conversations(path: Path, protocol: str) -> list[dict[str, Any]]:
    """The rows of `-q -z conv,protocol`: a, b, frames and bytes each way and in all, relative start.

    tshark prints sizes of 10 kB and more cut to whole kB (MB, GB): `*_unit` says which a byte
    count is in, so a comparison can cut its own value the same way."""
    def compute() -> list[dict[str, Any]]:
        rows = []
        for line in tshark(path, "-q", "-z", f"conv,{protocol}").splitlines():
            m = re.match(rf"^(\S+)\s+<->\s+(\S+)\s+(\d+) {_SIZE}\s+(\d+) {_SIZE}\s+(\d+) {_SIZE}\s+([\d.]+)\s+([\d.]+)",
                         line)
            if m:
                g = m.groups()
                rows.append({"a": g[0], "b": g[1], "b_to_a_frames": int(g[2]), "b_to_a_bytes": [int(g[3]), g[4]],
                             "a_to_b_frames": int(g[5]), "a_to_b_bytes": [int(g[6]), g[7]], "frames": int(g[8]),
                             "bytes": [int(g[9]), g[10]], "rel_start": g[11], "duration": g[12]})
        return rows
    result: list[dict[str, Any]] = _cached(path, "conv", protocol, compute)
    return result


def same_size(ours: int, printed: list[Any]) -> bool:
    """Whether a byte count is the one tshark printed as [number, unit] (cut to whole units)."""
    number, unit = printed
    return bool(ours // _UNITS[unit] == number)


def endpoints(path: Path, protocol: str) -> dict[str, list[int]]:
    """`-q -z endpoints,protocol`: address (with :port for tcp/udp/sctp) -> [frames, bytes, tx frames,
    tx bytes, rx frames, rx bytes]. The byte columns are plain numbers here (no kB)."""
    def compute() -> dict[str, list[int]]:
        rows = {}
        for line in tshark(path, "-q", "-z", f"endpoints,{protocol}").splitlines():
            cells = line.split()
            if cells and re.match(r"^[0-9a-fA-F:.]+$", cells[0]) and len(cells) >= 7 \
                    and all(c.isdigit() for c in cells[1:]):
                address = cells[0] if protocol in ("ip", "ipv6") else f"{cells[0]}:{cells[1]}"
                rows[address] = [int(c) for c in cells[-6:]]
        return rows
    result: dict[str, list[int]] = _cached(path, "endpoints", protocol, compute)
    return result


@functools.cache
def field_catalogue() -> tuple[tuple[str, str, str, str], ...]:
    """(name, description, type, protocol) of every `F` line of `tshark -G fields`, in its order."""
    def compute() -> list[list[str]]:
        rows = []
        for line in run(["tshark", "-G", "fields"]).splitlines():
            parts = line.split("\t")
            if parts[0] == "F" and len(parts) >= 5:
                rows.append([parts[2], parts[1], parts[3], parts[4]])
        return rows
    return tuple((r[0], r[1], r[2], r[3]) for r in _cached(None, "fields", None, compute))
