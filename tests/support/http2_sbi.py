"""HTTP/2 (5G SBI) service response times twice: what real sharkd answers to the requests pcap_stats makes
(recorded once per capture and cached, with the capture's decode-as rules), and the same statistics computed
from `tshark -T fields` alone (never imports diagd).

`record(path, filters)` asks a `sharkd -` (the daemon's worker config: no name resolution, the capture's
MANIFEST decode-as rules written as `decode_as_entries`, as session.py writes them) `analyse`, then per
display filter `check` and `frames` with the three columns http2_srt.py reads, then `frame` (proto) of every
frame any of those listed. `Recorded` (tests/support/sharkd_stats.py) answers them in-process.

`tshark_srt(path, filter)` is the oracle: each HTTP/2 HEADERS frame's headers are cut from the packet's
`http2.header.name`/`value` arrays by its `http2.header.count` (frames bundled in one TCP segment stay apart),
a request is a HEADERS frame with :method or :path, its response the next HEADERS frame on the same
tcp.stream and http2.streamid sent from the other TCP port (the pairing tests/e2e/test_pcap_stats.py checks
through the daemon)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import pcap_oracle
from tests.support.sharkd_stats import PREFERENCES, request_key
from tests.support.sharkd_trees import CACHE, HANG_GUARD_S, _key

HEADERS = "http2.type == 1"
# The columns http2_srt.py asks for, written out here (relative time, TCP stream, TCP source port).
COLUMNS = ("frame.time_relative", "tcp.stream", "tcp.srcport")
SEP = "\x1f"  # header values hold commas ("application/json, application/problem+json")
# 5G SBI resource ids (TS 29.501 resource URIs; TS 23.003 SUPI/SUCI/GPSI/PEI forms), numbers, UUIDs, long hex.
SBI_ID = re.compile(r"^(\d+|[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}|[0-9a-f]{16,}|(imsi|suci|supi|nai|gci|gli|gpsi"
                    r"|msisdn|extid|imei|imeisv|mac)-.+)$", re.I)


def filter_for(display_filter: str) -> str:
    return f"{HEADERS} && ({display_filter})" if display_filter else HEADERS


def frames_params(display_filter: str) -> dict[str, Any]:
    params: dict[str, Any] = {f"column{i}": f"{c}:0" for i, c in enumerate(COLUMNS)}
    params["filter"] = filter_for(display_filter)
    return params


def _decode_as_entries(rules: list[str]) -> str:
    lines = []
    for rule in rules:  # "tcp.port==7777,http2", as session.py writes it
        selector, proto = rule.split(",")
        table, value = selector.split("==")
        lines.append(f"decode_as_entry: {table},{value},(none),{proto.upper()}\n")
    return "".join(lines)


def _sharkd(path: Path, rules: list[str], requests: list[dict[str, Any]]) -> list[Any]:
    asked = [{"method": "load", "params": {"file": str(path)}}, *requests]
    lines = "".join(json.dumps({"jsonrpc": "2.0", "id": i + 1, **r}) + "\n" for i, r in enumerate(asked))
    with tempfile.TemporaryDirectory(prefix="sharkd-conf-") as conf:
        Path(conf, "preferences").write_text(PREFERENCES)
        Path(conf, "decode_as_entries").write_text(_decode_as_entries(rules))
        out = subprocess.run(["sharkd", "-"], input=lines, capture_output=True, text=True, timeout=HANG_GUARD_S,
                             env={**os.environ, "WIRESHARK_CONFIG_DIR": conf}, check=True)
    answers = sorted((a for a in map(json.loads, (x for x in out.stdout.splitlines() if x.startswith("{")))
                      if "id" in a), key=lambda a: int(a["id"]))
    if len(answers) != len(asked) or any("error" in a for a in answers):
        raise AssertionError(f"sharkd answered {len(answers)} of {len(asked)} requests: "
                             f"{[a.get('error') for a in answers if 'error' in a][:3]}")
    return [a["result"] for a in answers[1:]]


def record(path: Path, filters: list[str], decode_as: list[str] | None = None) -> dict[str, Any]:
    """{request_key: sharkd's result} for analyse, each filter's check and frames, every listed frame's tree,
    with the capture's MANIFEST decode-as rules (or `decode_as`)."""
    rules = pcap_oracle.decode_as(path) if decode_as is None else decode_as
    requests: list[tuple[str, dict[str, Any] | None]] = [("analyse", None)]
    for display_filter in filters:
        requests += [("check", {"filter": filter_for(display_filter)}), ("frames", frames_params(display_filter))]
    digest = hashlib.sha256(json.dumps([requests, rules]).encode()).hexdigest()[:16]
    CACHE.mkdir(parents=True, exist_ok=True)
    cached = CACHE / f"{path.name}.{_key(path)}.http2-{digest}.json"
    if not cached.exists():
        first = _sharkd(path, rules, [{"method": m, **({"params": p} if p else {})} for m, p in requests])
        answers = {request_key(m, p): r for (m, p), r in zip(requests, first, strict=True)}
        numbers = sorted({int(row["num"]) for (m, _), r in zip(requests, first, strict=True) if m == "frames"
                          for row in r})
        trees = _sharkd(path, rules, [{"method": "frame", "params": {"frame": n, "proto": True}} for n in numbers])
        answers.update({request_key("frame", {"frame": n, "proto": True}): t for n, t in zip(numbers, trees,
                                                                                              strict=True)})
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(answers))
        tmp.replace(cached)
    found: dict[str, Any] = json.loads(cached.read_text())
    return found


def _tshark(path: Path, *args: str) -> str:
    """pcap_oracle.tshark (the capture's decode-as rules, -n -2, default preferences), kept on disk."""
    st = path.stat()
    key = hashlib.sha256(repr((str(path.resolve()), st.st_size, st.st_mtime_ns, pcap_oracle.tshark_version(),
                               args)).encode()).hexdigest()[:24]
    cached = CACHE / f"{path.name}.{key}.http2-fields.txt"
    if not cached.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(pcap_oracle.tshark(path, *args))
        tmp.replace(cached)
    return cached.read_text()


def template(path: str) -> str:
    return "/".join("{id}" if SBI_ID.match(p) else p for p in path.partition("?")[0].split("/"))


def nanoseconds(text: str) -> int:
    """tshark's frame.time_relative (seconds, 9 decimals) in whole ns, exactly."""
    negative = text.startswith("-")
    whole, _, frac = text.lstrip("-").partition(".")
    ns = int(whole or "0") * 10**9 + int(frac.ljust(9, "0")[:9])
    return -ns if negative else ns


@dataclass
class Srt:
    rows: dict[str, tuple[int, int | None, int | None, int, int, dict[str, int]]]
    # procedure: (count, min ns, max ns, sum ns, unanswered, {status: count})
    requests: int
    responses: int
    orphans: int
    frames: dict[int, list[tuple[int, dict[str, str]]]]  # frame: its HEADERS frames' (stream id, pseudo-headers)


@dataclass(frozen=True)
class Headers:
    """One HTTP/2 HEADERS frame as tshark shows it."""

    frame: int
    at_ns: int        # frame.time_relative
    tcp: str          # tcp.stream
    port: str         # tcp.srcport
    stream: int       # http2.streamid
    pseudo: dict[str, str]  # :method, :path, :status (without the colon) when decoded


def tshark_headers(path: Path, display_filter: str = "") -> list[Headers]:
    """Every HEADERS frame of the frames `http2.type == 1 && (display_filter)` keeps, in capture order."""
    fields = ("frame.number", "frame.time_relative", "tcp.stream", "tcp.srcport", "http2.type", "http2.streamid",
              "http2.header.count", "http2.header.name", "http2.header.value")
    text = _tshark(path, "-Y", filter_for(display_filter), "-T", "fields", "-E", "occurrence=a",
                   "-E", f"aggregator={SEP}", *[a for f in fields for a in ("-e", f)])
    found = []
    for line in text.splitlines():
        number, rel, tcp, port, types, streams, counts, names, values = line.split("\t")
        header_names, header_values = names.split(SEP), values.split(SEP)
        h2 = [sid for kind, sid in zip(types.split(SEP), streams.split(SEP), strict=True) if kind == "1"]
        start = 0
        for sid, count in zip(h2, [int(c) for c in counts.split(SEP)], strict=True):
            pseudo = dict(zip(header_names[start:start + count], header_values[start:start + count], strict=True))
            start += count
            found.append(Headers(int(number), nanoseconds(rel), tcp.split(SEP)[0], port.split(SEP)[0], int(sid),
                                 {k[1:]: v for k, v in pseudo.items() if k in (":method", ":path", ":status")}))
    return found


def pair(headers: list[Headers]) -> Srt:
    """A request (:method or :path) is answered by the next HEADERS on its tcp.stream and stream id from the
    other TCP port; a HEADERS with :status and no open request is a response without its request."""
    pending: dict[tuple[str, int], tuple[str, int, str]] = {}
    times: dict[str, list[int]] = defaultdict(list)
    codes: dict[str, Counter[str]] = defaultdict(Counter)
    requests = responses = orphans = 0
    frames: dict[int, list[tuple[int, dict[str, str]]]] = {}
    for h in headers:
        frames.setdefault(h.frame, []).append((h.stream, h.pseudo))
        key = (h.tcp, h.stream)
        if "method" in h.pseudo or "path" in h.pseudo:
            requests += 1
            path = template(h.pseudo["path"]) if "path" in h.pseudo else "?"  # either may be lost (HPACK)
            pending[key] = (f"{h.pseudo.get('method', '?')} {path}", h.at_ns, h.port)
        elif key in pending and pending[key][2] != h.port:
            responses += 1
            name, t0, _ = pending.pop(key)
            times[name].append(h.at_ns - t0)
            codes[name][h.pseudo.get("status", "?")] += 1
        elif "status" in h.pseudo:
            responses += 1
            orphans += 1
    unanswered = Counter(name for name, _, _ in pending.values())
    rows = {name: (len(times[name]), min(times[name], default=None), max(times[name], default=None),
                   sum(times[name]), unanswered[name], dict(codes[name])) for name in set(times) | set(unanswered)}
    return Srt(rows, requests, responses, orphans, frames)


def tshark_srt(path: Path, display_filter: str = "") -> Srt:
    return pair(tshark_headers(path, display_filter))
