"""An index built by the builder itself (`python -m ...build`, as the daemon runs it) over a capture: in one
pass (chunk_bytes 0) or in chunks of about chunk_bytes, for tests that read its files directly."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from diagd.actors.pcap.index.build import META_FILE, SEGMENT_FRAMES, command


def build(capture: Path, out: Path, chunk_bytes: int, argv: list[str] | None = None,
          segment_frames: int = SEGMENT_FRAMES) -> dict[str, Any]:
    """Index `capture` into `out` as the daemon would read it (`argv`, by default `tshark -n -2`), its frames
    table in files of `segment_frames`; its meta.json."""
    done = subprocess.run(command(out, argv or ["tshark", "-r", str(capture), "-n", "-2"], chunk_bytes,
                                  segment_frames),
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    meta: dict[str, Any] = json.loads((out / META_FILE).read_text())
    return meta
