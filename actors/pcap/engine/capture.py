"""A capture as one worker loads it: the file (its version), and exactly how it is decoded (the actor's key)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired

from typing_extensions import TypedDict

from diagd.actors.pcap.shark.decode_check import PortCheck


class Decoding(TypedDict):
    """How a capture is decoded, as every answer's source names it."""

    decode_as: list[str]
    preferences: dict[str, Any]
    decode_as_checked: NotRequired[list[dict[str, Any]]]


@dataclass(frozen=True)
class CaptureSpec:
    """What one worker loads: the file and exactly how it is decoded."""

    path: Path
    identity: str  # the file version, "device:inode:size:mtime_ns" (wireshark.file_identity)
    decode_as: tuple[str, ...]
    preferences: tuple[tuple[str, str], ...]
    size: int
    # What each requested port rule became (decode_check.py): `decode_as` holds the rules applied.
    # Derived from the file version and the requested rules, so not part of the key.
    decode_checks: tuple[PortCheck, ...] = ()
    # The reference the call named (`capture:<id>`) and what its back end said of the file it resolved to
    # (a live capture: running, its ring): not part of the key, the file's identity is.
    reference: str | None = field(default=None, compare=False)
    about: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def key(self) -> str:
        extra = json.dumps([self.decode_as, self.preferences])
        return f"{hashlib.sha1(self.identity.encode()).hexdigest()[:16]}:{hashlib.sha1(extra.encode()).hexdigest()[:8]}"

    def describe(self) -> Decoding:
        out: Decoding = {"decode_as": list(self.decode_as), "preferences": dict(self.preferences)}
        if self.decode_checks:
            out["decode_as_checked"] = [c.describe() for c in self.decode_checks]
        return out
