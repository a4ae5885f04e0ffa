"""The sharkd protocol trees of a capture's NGAP frames, fetched once and cached on disk for fast tests.

What the daemon's pcap actor asks sharkd for a `ngap_*` call (the same preferences set before the
load, then `frames` with the filter and `frame` with proto and bytes), asked directly of a
`sharkd -` here, so the NGAP model can be run in-process against the real dissector's trees
without starting a daemon (the mutation gate runs the NGAP model hundreds of times). The cache is
keyed by the capture's bytes, the sharkd version, the preferences and filter asked and the environment; it
only avoids re-asking.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.support import pcap_oracle
from tests.support.capture_identity import content_id

PREFS = {"sctp.association_index": "TRUE", "nas-5gs.null_decipher": "TRUE"}
NGAP_FILTER = "ngap && sctp"
CACHE = Path(os.environ.get("DIAGD_TEST_TREE_CACHE", Path(tempfile.gettempdir()) / f"diagd-trees-{os.getuid()}"))
HANG_GUARD_S = 300  # not a measurement: only stops a sharkd that hangs


@functools.cache
def _version() -> str:
    out = subprocess.run(["sharkd", "-v"], capture_output=True, text=True, timeout=60)
    return out.stdout.splitlines()[0] if out.stdout else "unknown"


def _key(path: Path) -> str:
    """The capture's bytes, the sharkd version, what is asked (preferences, filter) and the environment it runs in
    (a fresh, empty configuration directory: only TZ, the locale and personal plugins count)."""
    asked = json.dumps([PREFS, NGAP_FILTER, "frame proto bytes"])
    where = pcap_oracle.config_key({**os.environ, "WIRESHARK_CONFIG_DIR": str(Path(__file__).parent / "no-such-dir")})
    return hashlib.sha256(f"{content_id(path)}|{_version()}|{asked}|{where}".encode()).hexdigest()[:24]


def _ask(path: Path) -> dict[str, Any]:
    requests: list[dict[str, Any]] = [
        *({"method": "setconf", "params": {"name": n, "value": v}} for n, v in PREFS.items()),
        {"method": "load", "params": {"file": str(path)}},
        {"method": "frames", "params": {"filter": NGAP_FILTER, "column0": "frame.number:0"}},
    ]
    first = _run(requests)
    numbers = [int(r["num"]) for r in first[-1]]
    if not numbers:
        return {}
    frames = _run([*requests[:-1], *({"method": "frame", "params": {"frame": n, "proto": True, "bytes": True}}
                                      for n in numbers)])
    return {str(n): answer for n, answer in zip(numbers, frames[len(requests) - 1:], strict=True)}


def _run(requests: list[dict[str, Any]], preferences: str = "") -> list[Any]:
    """Each request's result from one `sharkd -` (a fresh Wireshark config dir, `preferences` its file)."""
    lines = "".join(json.dumps({"jsonrpc": "2.0", "id": i + 1, **r}) + "\n" for i, r in enumerate(requests))
    with tempfile.TemporaryDirectory(prefix="sharkd-conf-") as conf:
        if preferences:
            Path(conf, "preferences").write_text(preferences)
        out = subprocess.run(["sharkd", "-"], input=lines, capture_output=True, text=True, timeout=HANG_GUARD_S,
                             env={**os.environ, "WIRESHARK_CONFIG_DIR": conf}, check=True)
    answers = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    answers = [a for a in answers if "id" in a]
    if len(answers) != len(requests) or any("error" in a for a in answers):
        raise AssertionError(f"sharkd answered {len(answers)} of {len(requests)} requests: "
                             f"{[a.get('error') for a in answers if 'error' in a][:3]}")
    return [a["result"] for a in sorted(answers, key=lambda a: int(a["id"]))]


def ngap_trees(path: Path) -> dict[int, dict[str, Any]]:
    """{frame number: sharkd `frame` answer} for every frame matching `ngap && sctp`."""
    CACHE.mkdir(parents=True, exist_ok=True)
    cached = CACHE / f"{path.name}.{_key(path)}.json"
    if not cached.exists():
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(_ask(path)))
        tmp.replace(cached)
    return {int(n): tree for n, tree in json.loads(cached.read_text()).items()}
