"""Loaded by `diagd serve` when this folder is on PYTHONPATH (tests/test_call_path.py): with
DIAGD_CALL_TRACE set to a file name, SIGUSR1 starts recording and SIGUSR2 writes what was recorded.

What is recorded: every *fresh* call (not a coroutine or generator resuming after a suspension) of a
function of a `diagd.*` module from a frame of another module, as the chain of diagd modules on the
calling stack (the frame's f_back chain, which for coroutines runs through the awaiting frames),
consecutive repeats collapsed. One JSON line per call: {"task": ..., "chain": [...]}.
"""

from __future__ import annotations

import dis
import json
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

_FILE = os.environ.get("DIAGD_CALL_TRACE")
_RESUME = dis.opmap["RESUME"]
_records: list[dict[str, Any]] = []


def _module(frame: FrameType | None) -> str | None:
    if frame is None:
        return None
    name = frame.f_globals.get("__name__")
    return name if isinstance(name, str) and name.startswith("diagd.") else None


def _fresh(frame: FrameType) -> bool:
    """True for a function starting, False for a suspended coroutine/generator going on (RESUME's
    argument is 0 only at the start of a function)."""
    code = frame.f_code.co_code
    i = frame.f_lasti
    return not (0 <= i < len(code) - 1 and code[i] == _RESUME and code[i + 1] != 0)


def _task() -> str:
    try:
        import trio

        return f"{id(trio.lowlevel.current_task()):x}"
    except Exception:  # a worker thread has no Trio task
        return f"thread-{threading.get_ident():x}"


def _profile(frame: FrameType, event: str, arg: Any) -> None:
    if event != "call":
        return
    module = _module(frame)
    if module is None or _module(frame.f_back) == module or not _fresh(frame):
        return
    chain: list[str] = []
    f: FrameType | None = frame
    while f is not None:
        m = _module(f)
        if m is not None and (not chain or chain[-1] != m):
            chain.append(m)
        f = f.f_back
    chain.reverse()
    _records.append({"task": _task(), "chain": chain, "function": frame.f_code.co_qualname})


def _start(signum: int, _frame: Any) -> None:
    _records.clear()
    threading.setprofile(_profile)
    sys.setprofile(_profile)
    assert _FILE is not None
    with open(_FILE + ".on", "w"):
        pass


def _stop(signum: int, _frame: Any) -> None:
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    assert _FILE is not None
    with open(_FILE + ".tmp", "w") as out:
        for record in _records:
            out.write(json.dumps(record) + "\n")
    os.replace(_FILE + ".tmp", _FILE)


if _FILE:
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
