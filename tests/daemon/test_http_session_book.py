"""The HTTP session book's rules on Trio's MockClock: caps per token and overall, which record
gives way, busy sessions never evicted, dormant records forgotten after `keep_s`, and the records a
restarted daemon restores (wall-clock ages, caps, staleness)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
import trio.testing

from diagd.daemon.server.http import session_file as http_session_file
from diagd.daemon.server.http.session_book import SessionBook
from diagd.daemon.server.http.session_file import Stored
from diagd.protocol.errors import DiagdError

PARAMS = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}


def book(per_token: int = 2, overall: int = 3, keep_s: float = 100.0, wall: float = 1_000_000.0) -> SessionBook:
    return SessionBook(per_token=per_token, overall=overall, keep_s=keep_s, wall=lambda: wall)


def opened(b: SessionBook, sid: str, token: str) -> None:
    admission = b.admit(token)
    assert admission.admitted, admission.reason
    b.add(sid, token)
    b.established(sid, PARAMS)


async def test_a_token_at_its_cap_gives_up_its_longest_idle_session_not_a_busy_one(
        autojump_clock: trio.testing.MockClock) -> None:
    b = book()
    opened(b, "a1", "a")
    await trio.sleep(1)
    opened(b, "a2", "a")
    await trio.sleep(1)
    b.begin(b.get("a1"))  # type: ignore[arg-type]  # a1 used last, a2 now the longest idle
    b.end(b.get("a1"))  # type: ignore[arg-type]
    admission = b.admit("a")
    assert [r.sid for r in admission.evict] == ["a2"] and b.get("a2") is None
    b.add("a3", "a")
    b.begin(b.get("a1"))  # type: ignore[arg-type]
    b.begin(b.get("a3"))  # type: ignore[arg-type]
    refused = b.admit("a")
    assert not refused.admitted and "max_sessions_per_token = 2" in refused.reason
    assert b.get("a1") is not None and b.get("a3") is not None


async def test_the_overall_cap_takes_only_dormant_records_and_refuses_otherwise(
        autojump_clock: trio.testing.MockClock) -> None:
    b = book(per_token=2, overall=3)
    opened(b, "a1", "a")
    opened(b, "a2", "a")
    opened(b, "b1", "b")
    refused = b.admit("c")
    assert not refused.admitted and "max_sessions = 3" in refused.reason  # all live: nobody else's ends
    b.went_dormant("a1")
    admission = b.admit("c")
    assert [r.sid for r in admission.evict] == ["a1"] and len(b) == 2


async def test_dormant_records_are_forgotten_after_keep_s_and_unestablished_ones_at_once(
        autojump_clock: trio.testing.MockClock) -> None:
    b = book(keep_s=100)
    opened(b, "a1", "a")
    b.add("a2", "a")  # its opening request never succeeded: nothing to revive
    b.went_dormant("a1")
    b.went_dormant("a2")
    assert b.get("a2") is None and b.get("a1") is not None and b.live_count() == 0
    await trio.sleep(99)
    assert b.get("a1") is not None
    await trio.sleep(1)
    assert b.get("a1") is None and len(b) == 0


async def test_restored_records_keep_their_age_and_the_caps(autojump_clock: trio.testing.MockClock) -> None:
    wall = 1_000_000.0
    stored = [Stored("old", "a", PARAMS, wall - 150), Stored("a1", "a", PARAMS, wall - 10),
              Stored("a2", "a", PARAMS, wall - 20), Stored("a3", "a", PARAMS, wall - 30),
              Stored("b1", "b", PARAMS, wall - 5), Stored("c1", "c", PARAMS, wall - 40)]
    b = book(per_token=2, overall=3, keep_s=100, wall=wall)
    b.restore(stored)
    # stale "old" left out; per token the most recent first; overall 3 of the most recent
    assert sorted(s.sid for s in b.stored()) == ["a1", "a2", "b1"]
    assert all(not b.get(sid).live for sid in ("a1", "a2", "b1"))  # type: ignore[union-attr]
    assert {s.sid: round(wall - s.last_used_wall) for s in b.stored()} == {"a1": 10, "a2": 20, "b1": 5}
    await trio.sleep(91)
    assert b.get("a1") is None and b.get("b1") is not None  # 10 + 91 > keep_s


async def test_oversized_initialize_params_are_not_kept(autojump_clock: trio.testing.MockClock) -> None:
    b = book()
    b.admit("a")
    b.add("a1", "a")
    b.established("a1", {**PARAMS, "capabilities": {"x": "y" * http_session_file.MAX_PARAMS_BYTES}})
    assert b.stored() == []
    b.went_dormant("a1")
    assert b.get("a1") is None


def test_the_file_round_trips_owner_only_and_refuses_a_symlink_or_loose_mode(tmp_path: Path) -> None:
    state = tmp_path / "state"
    records = [Stored("s1", "laptop", PARAMS, 1234.5)]
    http_session_file.save(state, records)
    assert http_session_file.load(state) == records
    assert (state / http_session_file.FILE).stat().st_mode & 0o777 == 0o600
    (state / http_session_file.FILE).chmod(0o644)
    with pytest.raises(DiagdError, match="mode 0644"):
        http_session_file.load(state)
    (state / http_session_file.FILE).unlink()
    (state / http_session_file.FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(DiagdError, match="symlink"):
        http_session_file.load(state)
    (state / http_session_file.FILE).unlink()
    (state / http_session_file.FILE).write_text("{broken")
    (state / http_session_file.FILE).chmod(0o600)
    with pytest.raises(DiagdError, match="damaged"):
        http_session_file.load(state)


def test_a_file_of_sessions_bound_to_token_names_is_dropped(tmp_path: Path) -> None:
    # Version 1 kept the token's name: a name revoked and added again would inherit those sessions.
    state = tmp_path / "state"
    http_session_file.save(state, [Stored("s1", "0123abcd" * 3, PARAMS, 1234.5)])
    path = state / http_session_file.FILE
    assert '"token_id":"0123abcd' in path.read_text()
    path.write_text(json.dumps({"version": 1, "sessions": [
        {"id": "s1", "token": "laptop", "initialize": PARAMS, "last_used": 1234.5}]}))
    assert http_session_file.load(state) == []
