"""A capture's identity for the reference caches: the sha256 of its bytes, not its path or mtime.

The caches of tshark/sharkd answers live outside the repository and outlive a checkout; a fresh clone
(CI's), a copied corpus or a rebuilt capture with the same bytes finds what an earlier run computed, and a
capture whose bytes changed never reads another's answers. Hashed once per path, size and mtime."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


def content_id(path: Path) -> str:
    st = path.stat()
    return _digest(str(path.resolve()), st.st_size, st.st_mtime_ns)


@functools.cache
def _digest(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}:{size}"
