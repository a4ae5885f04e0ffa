"""Stored outputs: ids, paging, regex search with context, retention."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagd.actors._user_regex import Matcher, compile_user_regex
from diagd.actors.crash.store import OutputStore
from diagd.protocol.errors import DiagdError, ErrorCode


def store_with_log(tmp_path: Path) -> tuple[OutputStore, str]:
    store = OutputStore(tmp_path / "crash")
    store.create_session("abcd1234-000001", {"vmcore": "/x"})
    text = "\n".join(f"[{i:4d}] line {i}" + (" sysrq: Trigger a crash" if i == 700 else "") for i in range(1000))
    meta = store.write("abcd1234-000001", store.next_number("abcd1234-000001"), text + "\n",
                       {"engine": "crash", "command": "log"})
    return store, meta["command_id"]


def matcher(query: str, *, case_sensitive: bool = False) -> Matcher:
    return Matcher(compile_user_regex(query, case_sensitive=case_sensitive), 5.0, unit="line")


def test_pages_are_bounded_and_say_where_to_continue(tmp_path: Path) -> None:
    store, cid = store_with_log(tmp_path)
    assert cid == "abcd1234-000001:1"
    page = store.page(cid, 990, 100)
    assert page["returned"] == 10 and page["total_lines"] == 1000 and not page["has_more"]
    big = store.page(cid, 0, 10_000)
    assert big["returned"] == 500 and big["has_more"] and big["next_offset"] == 500
    fresh = OutputStore(tmp_path / "crash")  # another daemon: nothing in memory
    assert fresh.page(cid, 700, 1)["output"].endswith("sysrq: Trigger a crash")


def test_search_returns_line_numbers_usable_as_offsets_and_context(tmp_path: Path) -> None:
    store, cid = store_with_log(tmp_path)
    found = store.search(cid, matcher(r"SYSRQ: trigger"), context_lines=2, max_matches=10)
    assert found["match_count"] == 1
    match = found["matches"][0]
    assert match["line_number"] == 700 and len(match["before"]) == 2 and match["after"][0].endswith("line 701")
    assert store.search(cid, matcher("SYSRQ", case_sensitive=True), context_lines=0, max_matches=10)["match_count"] == 0
    many = store.search(cid, matcher("line"), context_lines=0, max_matches=3)
    assert many["match_count"] == 1000 and len(many["matches"]) == 3 and many["truncated"]


def test_bad_and_unknown_ids_are_coded_errors(tmp_path: Path) -> None:
    store, _ = store_with_log(tmp_path)
    for bad in ("../../etc/passwd:1", "abcd1234-000001:x", ""):
        with pytest.raises(DiagdError) as err:
            store.page(bad, 0, 10)
        assert err.value.code == ErrorCode.INVALID_ARGUMENT
    with pytest.raises(DiagdError) as err:
        store.page("abcd1234-000001:99", 0, 10)
    assert err.value.code == ErrorCode.NOT_FOUND


def test_prune_keeps_live_sessions_and_the_newest(tmp_path: Path) -> None:
    store = OutputStore(tmp_path / "crash")
    for i in range(5):
        store.create_session(f"abcd1234-00000{i}", {})
    removed = store.prune(2, live={"abcd1234-000000"})
    assert sorted(removed) == ["abcd1234-000001", "abcd1234-000002"]
    assert sorted(p.name for p in store.root.iterdir()) == ["abcd1234-000000", "abcd1234-000003", "abcd1234-000004"]
