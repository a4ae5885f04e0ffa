"""The registry's central checks and the two records of a call (started, then its end)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from diagd.daemon.server.audit import AuditLog, CallStats
from diagd.daemon.server.tools import CallContext, CallRecord, ToolRegistry, ToolSpec

SCHEMA = {
    "type": "object",
    "properties": {
        "program": {"type": "string"},
        "columns": {"type": "array", "items": {"type": "object", "properties": {"field": {"type": "string"}}}},
        "delay": {"type": "number"},
    },
    "additionalProperties": False,
}


def make_registry() -> tuple[ToolRegistry, list[CallRecord], list[dict[str, Any]]]:
    handled: list[dict[str, Any]] = []

    async def handler(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        handled.append(args)
        await trio.sleep(args.get("delay", 0))
        return {"ok": True}

    registry = ToolRegistry(call_timeout_s=30)
    records: list[CallRecord] = []
    registry.observers.append(records.append)
    registry.register(ToolSpec(name="t", description="test", input_schema=SCHEMA, handler=handler))
    return registry, records, handled


@pytest.mark.parametrize(("arguments", "path", "words"), [
    ({"program": "BEGIN { exit(); }\x00tracepoint:x"}, "$.program", "a NUL byte (\\u0000) at offset 17"),
    ({"columns": [{"field": "ip.src"}, {"field": "ip\x00.dst"}]}, "$.columns[1].field", "NUL byte"),
    ({"program": "caf\u00e9 \ud800"}, "$.program", "a lone surrogate (\\ud800) at offset 5"),
    ({"columns": [{"fi\x00eld": "x"}]}, "$.columns[0]", "key 'fi\\x00eld'"),
])
async def test_nul_bytes_and_lone_surrogates_in_any_string_argument_are_refused_before_the_handler(
        arguments: dict[str, Any], path: str, words: str) -> None:
    registry, records, handled = make_registry()
    result = await registry.call("t", arguments, CallContext(client="test"))
    assert result.is_error and result.payload["code"] == "INVALID_ARGUMENT"
    assert result.payload["message"].startswith(f"{path}: ") and words in result.payload["message"]
    assert result.payload["details"] == {"path": path}
    assert handled == []
    assert [r.outcome for r in records] == ["started", "error"]


async def test_a_call_is_recorded_when_it_starts_and_when_it_ends_with_one_call_id(
        autojump_clock: trio.testing.MockClock) -> None:
    registry, records, _ = make_registry()
    stats = CallStats()
    registry.observers.append(stats.observe)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(registry.call, "t", {"delay": 20}, CallContext(client="c1"))
        await trio.sleep(10)
        # Mid-call: the start is recorded and the call shows as running; nothing is counted yet.
        assert [r.outcome for r in records] == ["started"]
        (running,) = stats.running()
        assert running.outcome == "running" and running.tool == "t" and running.call_id == records[0].call_id
        assert stats.total == 0 and stats.summary() == {}
    started, ended = records
    assert started.call_id == ended.call_id and started.call_id is not None
    assert (started.arguments, started.client, started.duration_ms, started.bytes) == ({"delay": 20}, "c1", 0.0, 0)
    assert ended.outcome == "ok" and stats.running() == [] and stats.total == 1


async def test_call_ids_differ_per_call() -> None:
    registry, records, _ = make_registry()
    for _ in range(3):
        await registry.call("t", {}, CallContext(client="c"))
    ids = [r.call_id for r in records]
    assert ids[0::2] == ids[1::2] and len(set(ids)) == 3  # each start pairs with its end


async def test_a_failing_observer_does_not_fail_the_call() -> None:
    registry, records, _ = make_registry()

    def full_disk(record: CallRecord) -> None:
        raise OSError(28, "No space left on device")

    registry.observers.insert(0, full_disk)
    result = await registry.call("t", {}, CallContext(client="c"))
    assert not result.is_error and [r.outcome for r in records] == ["started", "ok"]


def test_audit_log_keeps_both_records_and_escapes_what_utf8_cannot_hold(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=1 << 20, keep=2)
    base = {"ts": 0.0, "client": "c", "tool": "t", "queue_ms": 0.0, "code": None, "truncated": False,
            "call_id": "ab12cd-1"}
    log.write(CallRecord(arguments={"q": "\ud800"}, duration_ms=0.0, outcome="started", bytes=0, **base))
    log.write(CallRecord(arguments={"q": "\ud800"}, duration_ms=3.0, outcome="error", bytes=10, **base))
    log.close()
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(r["outcome"], r["call_id"]) for r in lines] == [("started", "ab12cd-1"), ("error", "ab12cd-1")]
    assert lines[0]["arguments"] == {"q": "\ud800"}


def test_a_refused_call_is_recorded_as_started_and_error_with_its_details_and_counted() -> None:
    registry, records, handled = make_registry()
    stats = CallStats()
    registry.observers.append(stats.observe)
    registry.record_refusal("x" * 300, {"a": "b" * 5000}, "mcp:1", "INVALID_ARGUMENT", jsonrpc_code=-32602,
                            did_you_mean=["t"])
    started, ended = records
    assert (started.outcome, ended.outcome, ended.code) == ("started", "error", "INVALID_ARGUMENT")
    assert started.call_id == ended.call_id is not None
    assert ended.tool == "x" * 128 + "...(+172)"  # the MCP spec's bound on a tool name
    assert ended.arguments["a"].endswith("...(+3976 chars)")  # abridged as any call's
    assert ended.to_json()["details"] == {"jsonrpc_code": -32602, "did_you_mean": ["t"]}
    assert "details" not in started.to_json()
    assert stats.total == 1 and stats.summary()[ended.tool]["failures"] == 1 and not stats.running()
    assert handled == []
