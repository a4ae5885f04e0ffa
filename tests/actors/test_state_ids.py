"""Every id a caller names that becomes a path under a back end's state dir is read whole: a trailing
newline (which `^...$` with `re.match` lets through), a slash, `..` or a NUL is a coded refusal, never a
path. One test for the class: the crash output store, the bpftrace store, the capture and recording stores."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from diagd.actors.bpftrace.store import ExecutionStore
from diagd.actors.capture.record import CaptureStore
from diagd.actors.capture.recording import RecordingStore
from diagd.actors.crash.store import OutputStore
from diagd.protocol.errors import DiagdError, ErrorCode

GOOD = {"crash session": "abc123-x", "crash command": "abc123-x:7", "bpftrace": "bt-0123abcd",
        "capture": "cap-0123abcd", "recording": "rec-0123abcd"}


def resolvers(root: Path) -> dict[str, Callable[[str], Any]]:
    return {"crash session": OutputStore(root).session_dir, "crash command": OutputStore(root)._paths,
            "bpftrace": ExecutionStore(root).path, "capture": CaptureStore(root).meta_path,
            "recording": RecordingStore(root).path}


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_a_well_formed_id_resolves_under_the_state_dir(kind: str, tmp_path: Path) -> None:
    found = resolvers(tmp_path)[kind](GOOD[kind])
    for path in found if isinstance(found, tuple) else (found,):
        assert tmp_path in Path(path).parents


@pytest.mark.parametrize("kind", sorted(GOOD))
@pytest.mark.parametrize("spoil", [lambda i: i + "\n", lambda i: i + "\r", lambda i: "\n" + i, lambda i: i + "/..",
                                   lambda i: "../" + i, lambda i: i + "\0", lambda i: i + " ", lambda i: i.upper()],
                         ids=["newline after", "CR after", "newline before", "slash-dotdot after", "dotdot before",
                              "NUL after", "space after", "upper case"])
def test_an_id_with_anything_around_it_is_refused_with_a_code(kind: str, spoil: Callable[[str], str],
                                                              tmp_path: Path) -> None:
    with pytest.raises(DiagdError) as refused:
        resolvers(tmp_path)[kind](spoil(GOOD[kind]))
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
