"""The C heap under a long-lived Python daemon (glibc malloc): keep what is freed returnable.

A big tool answer (a 40 MB crash output read for a page, a capture's field catalogue parsed, a
100 kB JSON result encoded) allocates and frees large buffers and many small objects. glibc keeps
freed memory in its heaps for reuse and returns only a free top of a heap, so one live block
above a freed region keeps all of it in the daemon's RSS, in every thread's arena (trio worker
threads get their own). Two remedies, both no-ops where glibc is not the allocator:

- `configure()` at start-up: a fixed mmap threshold (blocks of 256 kB and more get their own
  mapping, unmapped when freed; glibc would otherwise raise the threshold to the largest block freed
  so far, up to 32 MB, and put later big blocks on the heap) and at most two arenas (a
  thread's arena holds its freed memory as the main heap does; the daemon's threads only wait on
  subprocesses and files);
- `trim()` after a big answer or load: `malloc_trim(0)` gives back every free page of every arena,
  also those in the middle of a heap (madvise), in a few ms.

And one for the cyclic garbage collector: `settle()` once what was just imported is there for good
(the back ends at start-up, the MCP SDK on the first MCP connection) moves it out of the collector's
reach (`gc.freeze`). A full collection walks every tracked object; the calls' own allocations trigger
one now and then, and with the SDK's and the back ends' objects in it, it took 82 ms in the middle of
a text search (measured with a gc callback); it then walks only what was made since.
"""

from __future__ import annotations

import ctypes
import gc
from typing import Any, Final

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
MMAP_THRESHOLD_BYTES = 256 * 1024
TRIM_THRESHOLD_BYTES = 1024 * 1024
ARENA_MAX = 2


def _load_libc() -> Any:
    """The C library the process runs on, when it is glibc (None elsewhere): the process's own symbols
    (dlopen(NULL), no search for the library's file), which hold libc's."""
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim, libc.mallopt  # noqa: B018  (glibc only: musl has neither)
    except (OSError, AttributeError, TypeError):
        return None
    return libc


_LIBC: Final[Any] = _load_libc()  # looked up once, at import: a handle, never changed


def configure() -> bool:
    """Set the allocator up for a long-lived process; False when it is not glibc."""
    libc = _LIBC
    if libc is None:
        return False
    # Each mallopt also turns off glibc's dynamic raising of the mmap and trim thresholds.
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    libc.mallopt(M_ARENA_MAX, ARENA_MAX)
    return True


def trim() -> bool:
    """Give free heap pages back to the OS; True when some were."""
    libc = _LIBC
    return bool(libc.malloc_trim(0)) if libc is not None else False


def settle() -> None:
    """Collect, then freeze what is left (modules, their classes and tables): later full collections
    walk only objects made after this. Call it where nothing short-lived is about (after imports)."""
    gc.collect()
    gc.freeze()
