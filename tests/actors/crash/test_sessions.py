"""The crash back end's book of sessions: references per client, short-lived clients, default session."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from diagd.actors.crash.sessions import SessionRecord, SessionTable
from diagd.protocol.errors import DiagdError, ErrorCode


def record(sid: str, key: str) -> SessionRecord:
    return SessionRecord(sid, key, "/d/vmcore", "/d/vmlinux", Path("/tmp") / sid, [], 0.0, state="ready")


def test_a_short_lived_clients_references_end_with_it_and_the_session_stays_open() -> None:
    table = SessionTable()
    rec = record("aaaaaaaa-000001", "k1")
    table.add(rec, "cli:100")
    table.join(rec, "mcp:7")
    table.join(rec, "cli:100")
    assert rec.refcount == 3 and dict(rec.refs) == {"cli:100": 2, "mcp:7": 1}
    assert table.drop_client("cli:100") == [rec]
    assert rec.refcount == 1 and dict(rec.refs) == {"mcp:7": 1} and "cli:100" not in table.last
    assert table.joinable("k1") is rec  # still open: held by the MCP client
    table.drop_client("mcp:7")
    assert rec.refcount == 0 and table.joinable("k1") is rec  # held by nobody, still open (idles out)
    assert rec.describe()["refcount"] == 0 and rec.describe()["held_by"] == []


def test_a_client_naming_no_session_gets_its_own_else_the_only_open_one() -> None:
    table = SessionTable()
    first = record("aaaaaaaa-000001", "k1")
    table.add(first, "cli:100")
    table.drop_client("cli:100")
    assert table.resolve("cli:200", None) is first  # a new `diagd call`: the only open session
    second = record("bbbbbbbb-000002", "k2")
    table.add(second, "mcp:7")
    assert table.resolve("mcp:7", None) is second  # its own
    with pytest.raises(DiagdError) as ambiguous:
        table.resolve("cli:300", None)
    assert ambiguous.value.code == ErrorCode.NOT_FOUND and "2 sessions are open" in ambiguous.value.message
    assert sorted(ambiguous.value.details["open_sessions"]) == [first.session_id, second.session_id]
    assert table.listing("cli:300")["default_for_this_client"] is None
    first.state = "closed"
    assert table.resolve("cli:300", None) is second and table.listing("cli:300")["default_for_this_client"] == \
        second.session_id


def test_closing_drops_the_callers_reference_first_then_anothers_then_none() -> None:
    table = SessionTable()
    rec = record("aaaaaaaa-000001", "k1")
    table.add(rec, "mcp:1")
    table.join(rec, "mcp:2")
    assert table.release_one(rec, "mcp:2") == "mcp:2" and dict(rec.refs) == {"mcp:1": 1}
    assert table.release_one(rec, "cli:9") == "mcp:1" and rec.refcount == 0  # as before: any client may close
    assert table.release_one(rec, "cli:9") is None and rec.refcount == 0
    assert not table.release_ref(rec, "cli:9")


def test_diagd_stop_actor_ends_a_session_only_when_no_other_client_holds_it() -> None:
    # The daemon's own stop tool asks this first: a client held to other tool groups never gets here,
    # and one that did may not end a session other clients hold (as close_vmcore_session keeps it).
    table = SessionTable()
    rec = record("aaaaaaaa-000001", "k1")
    table.add(rec, "mcp:7")
    table.join(rec, "mcp:8")
    actor = SimpleNamespace(resource="k1")
    with pytest.raises(DiagdError) as info:
        table.may_stop(actor, "mcp:7")  # type: ignore[arg-type]
    assert info.value.code == ErrorCode.BUSY and info.value.details["held_by"] == ["mcp:8"]
    with pytest.raises(DiagdError):
        table.may_stop(actor, "mcp:9")  # type: ignore[arg-type]
    table.release_one(rec, "mcp:8")
    table.may_stop(actor, "mcp:7")  # type: ignore[arg-type]  # only its own reference: it may
    table.may_stop(SimpleNamespace(resource="gone"), "mcp:9")  # type: ignore[arg-type]
