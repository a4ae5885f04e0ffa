"""What real sharkd answers to the requests pcap_stats makes, asked once per capture and cached on disk.

`actors/pcap/answers/stats.py` reads a capture only through its CaptureSession: sharkd `tap` (expert, conv:*,
endpt:*, srt:diameter), `frames` with columns (io, the linked response times, a filter's frame numbers),
`check` and `analyse`. `record(path, requests)` asks a `sharkd -` those requests, with the preferences the
daemon's workers get (no name resolution, as `tshark -n`), and keeps the answers beside the NGAP trees
(`sharkd_trees.CACHE`), keyed by the capture, the sharkd version and the request list; `Recorded` then
answers them in-process, so the mutation gate can run stats.py hundreds of times without a daemon.
A request outside the recorded list fails the test: stats.py asked sharkd something else.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tests.support.sharkd_trees import CACHE, _key, _run

# What the daemon writes into its workers' Wireshark config (session.py): no name resolution.
PREFERENCES = "nameres.mac_name: FALSE\nnameres.transport_name: FALSE\nnameres.network_name: FALSE\n"


def request_key(method: str, params: dict[str, Any] | None) -> str:
    return json.dumps([method, params or {}], sort_keys=True)


def record(path: Path, requests: list[tuple[str, dict[str, Any] | None]]) -> dict[str, Any]:
    """{request_key: sharkd's result} for every request, after loading `path` (cached on disk)."""
    keys = [request_key(m, p) for m, p in requests]
    digest = hashlib.sha256(json.dumps(keys).encode()).hexdigest()[:16]
    CACHE.mkdir(parents=True, exist_ok=True)
    cached = CACHE / f"{path.name}.{_key(path)}.stats-{digest}.json"
    if not cached.exists():
        asked: list[dict[str, Any]] = [{"method": "load", "params": {"file": str(path)}},
                                       *({"method": m, **({"params": p} if p else {})} for m, p in requests)]
        results = _run(asked, PREFERENCES)[1:]
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dict(zip(keys, results, strict=True))))
        tmp.replace(cached)
    answers: dict[str, Any] = json.loads(cached.read_text())
    return answers


class Recorded:
    """The part of CaptureSession that stats.py uses, answered from recorded sharkd results."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def sharkd_call(self, request: object, method: str, params: dict[str, Any] | None = None, *,
                          display_filter: str | None = None) -> Any:
        key = request_key(method, params)
        self.asked.append(key)
        if key not in self.answers:
            raise AssertionError(f"stats.py asked sharkd something not recorded: {key}")
        return json.loads(json.dumps(self.answers[key]))  # a fresh copy: the code may change what it gets

    async def check_filter(self, request: object, display_filter: str) -> None:
        if display_filter:
            await self.sharkd_call(request, "check", {"filter": display_filter})

    async def matching(self, request: object, display_filter: str) -> list[int]:
        params: dict[str, Any] = {"column0": "frame.number:0"}
        if display_filter:
            params["filter"] = display_filter
        return [int(r["num"]) for r in await self.sharkd_call(request, "frames", params)]

    async def analysed(self, request: object) -> dict[str, Any]:
        found: dict[str, Any] = await self.sharkd_call(request, "analyse")
        return found

    async def sbi_hint(self) -> str:
        raise AssertionError("sbi_hint: the fast stats test has no HTTP/2 capture")
