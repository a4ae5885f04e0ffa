"""ToolRegistry: argument validation and coercion, coded errors, timeouts, the call record."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing
from typing_extensions import TypedDict

from diagd.actors.tooling import ToolSet, arguments_validator, display_filter, object_schema, paging, path
from diagd.daemon.server.tools import CallContext, CallRecord, ToolRegistry, ToolSpec, coerce
from diagd.protocol.errors import DiagdError, ErrorCode

SCHEMA = {
    "type": "object",
    "properties": {
        "limit": {"type": "integer", "minimum": 1, "maximum": 10},
        "ratio": {"type": "number"},
        "flag": {"type": "boolean"},
        "name": {"type": "string"},
        "frames": {"type": "array", "items": {"type": "integer"}},
        "nested": {"type": "object", "properties": {"n": {"type": "integer"}}},
    },
    "additionalProperties": False,
}


def make_registry(handler: Any = None, timeout_s: float | None = None) -> tuple[ToolRegistry, list[CallRecord]]:
    async def default(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"args": args}

    registry = ToolRegistry(call_timeout_s=30)
    records: list[CallRecord] = []
    registry.observers.append(records.append)
    registry.register(ToolSpec(name="t", description="test", input_schema=SCHEMA, handler=handler or default,
                               timeout_s=timeout_s))
    return registry, records


async def test_numbers_and_booleans_sent_as_strings_are_accepted() -> None:
    registry, _ = make_registry()
    result = await registry.call("t", {"limit": "5", "ratio": "0.5", "flag": "true", "name": "7",
                                       "frames": ["1", 2], "nested": {"n": "3"}}, CallContext(client="test"))
    assert not result.is_error
    assert result.payload["args"] == {"limit": 5, "ratio": 0.5, "flag": True, "name": "7", "frames": [1, 2],
                                      "nested": {"n": 3}}


def test_numbers_typed_on_a_command_line_where_the_schema_wants_text_become_text() -> None:
    assert coerce({"type": "string"}, 12, numbers_as_text=True) == "12"
    assert coerce({"type": "object", "properties": {"p": {"type": "string"}}}, {"p": 1.5},
                  numbers_as_text=True) == {"p": "1.5"}
    assert coerce({"type": "string"}, True, numbers_as_text=True) is True  # left for the validator to refuse


async def test_a_number_from_an_agent_where_the_schema_wants_text_is_refused() -> None:
    registry, _ = make_registry()
    result = await registry.call("t", {"name": 5}, CallContext(client="test"))
    assert result.payload["code"] == "INVALID_ARGUMENT" and result.payload["details"]["path"] == "$.name"
    typed = await registry.call("t", {"name": 5}, CallContext(client="cli", typed=True))  # `diagd call name=5`
    assert not typed.is_error and typed.payload["args"]["name"] == "5"


def test_coerce_leaves_unparseable_strings_for_the_validator() -> None:
    assert coerce({"type": "integer"}, "five") == "five"
    assert coerce({"type": ["integer", "string"]}, "5") == "5"


async def test_bad_argument_gives_invalid_argument_with_the_schema_path() -> None:
    registry, records = make_registry()
    result = await registry.call("t", {"limit": 50}, CallContext(client="test"))
    assert result.is_error
    assert result.payload["code"] == "INVALID_ARGUMENT"
    assert result.payload["details"]["path"] == "$.limit"
    assert "maximum" in result.payload["details"]["schema_path"]
    assert records[-1].outcome == "error" and records[-1].code == "INVALID_ARGUMENT"


async def test_nested_bad_argument_names_the_array_index() -> None:
    registry, _ = make_registry()
    result = await registry.call("t", {"frames": [1, "x"]}, CallContext(client="test"))
    assert result.payload["details"]["path"] == "$.frames[1]"


async def test_unknown_argument_is_refused() -> None:
    registry, _ = make_registry()
    result = await registry.call("t", {"bogus": 1}, CallContext(client="test"))
    assert result.payload["code"] == "INVALID_ARGUMENT" and "bogus" in result.payload["message"]


async def test_a_misspelt_argument_is_named_with_the_close_match_before_any_missing_required_one() -> None:
    registry = ToolRegistry()
    schema = object_schema({"pcap_path": {"type": "string"}, "frame_numbers": {"type": "array"},
                            "limit": {"type": "integer", "maximum": 10, "default": 5}},
                           ("pcap_path", "frame_numbers"), closed=True)
    registry.register(ToolSpec(name="t", description="test", input_schema=schema, handler=_echo))
    result = await registry.call("t", {"pcap_pth": "/x.pcap", "frame_numbers": [1]}, CallContext(client="test"))
    assert result.payload["code"] == "INVALID_ARGUMENT"
    assert result.payload["message"] == "unknown argument 'pcap_pth' (did you mean 'pcap_path'?)"
    assert result.payload["details"] == {"path": "$.pcap_pth", "did_you_mean": ["pcap_path"],
                                         "hint": "t takes frame_numbers, limit, pcap_path"}
    prefix = await registry.call("t", {"pcap_path": "/x", "frame": [1]}, CallContext(client="test"))
    assert prefix.payload["message"] == "unknown argument 'frame' (did you mean 'frame_numbers'?)"
    # Nothing close: the arguments it takes.
    far = await registry.call("t", {"pcap_path": "/x", "frame_numbers": [1], "zzz": 1}, CallContext(client="test"))
    assert far.payload["message"] == "unknown argument 'zzz' (arguments: pcap_path, frame_numbers, limit)"


async def test_an_unknown_key_of_a_nested_closed_object_is_named_with_its_path() -> None:
    registry = ToolRegistry()
    item = object_schema({"name": {"type": "string"}, "field": {"type": "string"}}, ("field",), closed=True)
    schema = object_schema({"columns": {"type": "array", "items": item}}, closed=True)
    registry.register(ToolSpec(name="t", description="test", input_schema=schema, handler=_echo))
    result = await registry.call("t", {"columns": [{"field": "ip.src"}, {"feild": "ip.dst"}]},
                                 CallContext(client="test"))
    assert result.payload["message"] == "$.columns[1]: unknown argument 'feild' (did you mean 'field'?)"
    assert result.payload["details"]["path"] == "$.columns[1].feild"


async def _echo(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
    return {"args": args}


async def test_non_object_arguments_are_refused() -> None:
    registry, _ = make_registry()
    result = await registry.call("t", ["not", "an", "object"], CallContext(client="test"))
    assert result.payload["code"] == "INVALID_ARGUMENT"


async def test_unknown_tool_suggests_close_names() -> None:
    registry, _ = make_registry()
    result = await registry.call("tt", {}, CallContext(client="test"))
    assert result.payload["code"] == "INVALID_ARGUMENT"
    assert result.payload["details"]["did_you_mean"] == ["t"]


async def test_a_bug_in_a_handler_becomes_internal_error_without_traceback() -> None:
    async def broken(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("secret")

    registry, records = make_registry(broken)
    result = await registry.call("t", {}, CallContext(client="test"))
    assert result.is_error and result.payload["code"] == "INTERNAL_ERROR"
    assert "Traceback" not in result.text
    assert records[-1].code == "INTERNAL_ERROR"


async def test_coded_errors_pass_through_with_details() -> None:
    async def missing(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        raise DiagdError(ErrorCode.FILE_NOT_FOUND, "no such capture", path="/x.pcap")

    registry, _ = make_registry(missing)
    result = await registry.call("t", {}, CallContext(client="test"))
    assert result.payload == {"code": "FILE_NOT_FOUND", "message": "no such capture", "details": {"path": "/x.pcap"}}


async def test_slow_handler_times_out_at_exactly_the_tool_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async def slow(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        await trio.sleep(100)
        return {}

    registry, _ = make_registry(slow, timeout_s=2.5)
    start = trio.current_time()
    result = await registry.call("t", {}, CallContext(client="test"))
    assert trio.current_time() - start == 2.5
    assert result.payload["code"] == "TIMEOUT" and result.payload["details"]["timeout_s"] == 2.5


async def test_a_tool_timeout_read_from_settings_follows_them_call_by_call(
        autojump_clock: trio.testing.MockClock) -> None:
    async def slow(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        await trio.sleep(100)
        return {}

    setting = {"timeout_s": 2.5}
    registry = ToolRegistry(call_timeout_s=30)
    registry.register(ToolSpec(name="t", description="test", input_schema=SCHEMA, handler=slow,
                               timeout_s=lambda: setting["timeout_s"]))
    start = trio.current_time()
    first = await registry.call("t", {}, CallContext(client="test"))
    assert trio.current_time() - start == 2.5 and first.payload["details"]["timeout_s"] == 2.5
    setting["timeout_s"] = 7.0  # what a reload of the back end's settings does
    start = trio.current_time()
    second = await registry.call("t", {}, CallContext(client="test"))
    assert trio.current_time() - start == 7.0 and second.payload["details"]["timeout_s"] == 7.0


async def test_result_text_is_compact_json_and_meta_counts_its_bytes() -> None:
    registry, records = make_registry()
    result = await registry.call("t", {"name": "é"}, CallContext(client="cli:1"))
    assert result.text == '{"args":{"name":"é"}}'
    assert json.loads(result.text) == result.payload
    assert result.meta["bytes"] == len(result.text.encode())
    assert set(result.meta) == {"duration_ms", "queue_ms", "bytes", "truncated"}
    record = records[-1]
    assert (record.client, record.tool, record.arguments, record.outcome) == ("cli:1", "t", {"name": "é"}, "ok")


async def test_cancelled_call_is_recorded_as_cancelled(autojump_clock: trio.testing.MockClock) -> None:
    async def slow(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        await trio.sleep(100)
        return {}

    registry, records = make_registry(slow)
    with trio.move_on_after(1):
        await registry.call("t", {}, CallContext(client="test"))
    assert records[-1].outcome == "cancelled"


def test_registering_a_tool_twice_is_a_programming_error() -> None:
    registry, _ = make_registry()
    with pytest.raises(ValueError):
        registry.register(registry.get("t"))


async def test_the_call_record_abridges_long_arguments() -> None:
    registry, records = make_registry()
    await registry.call("t", {"name": "x" * 5000, "frames": list(range(300))}, CallContext(client="test"))
    shown = records[-1].arguments
    assert shown["name"].startswith("x" * 1024) and shown["name"].endswith("...(+3976 chars)")
    assert len(shown["frames"]) == 101 and shown["frames"][-1] == "...(+200 items)"


async def test_whole_numbers_sent_as_decimals_reach_handlers_as_ints() -> None:
    registry, _ = make_registry()
    result = await registry.call("t", {"limit": 5.0, "frames": [1.0, 2], "nested": {"n": 3.0}},
                                 CallContext(client="test"))
    assert not result.is_error
    args = result.payload["args"]
    assert args == {"limit": 5, "frames": [1, 2], "nested": {"n": 3}}
    assert all(type(v) is int for v in (args["limit"], *args["frames"], args["nested"]["n"]))


@pytest.mark.parametrize(("arguments", "path"), [
    ({"ratio": float("nan")}, "$.ratio"),
    ({"ratio": float("inf")}, "$.ratio"),
    ({"frames": [1, 1e308]}, "$.frames[1]"),
    ({"nested": {"n": 2**64}}, "$.nested.n"),
])
async def test_non_finite_and_out_of_range_numbers_are_refused_with_their_path(arguments: dict[str, Any],
                                                                              path: str) -> None:
    registry, records = make_registry()
    result = await registry.call("t", arguments, CallContext(client="test"))
    assert result.is_error and result.payload["code"] == "INVALID_ARGUMENT"
    assert result.payload["details"]["path"] == path
    for record in records:  # the audit record of the call stays strict JSON
        json.dumps(record.arguments, allow_nan=False)


async def test_non_json_arguments_from_msgpack_are_refused_and_recorded_as_json() -> None:
    registry, records = make_registry()
    result = await registry.call("t", {b"limit": 1, "nested": {1: b"\x00raw"}}, CallContext(client="test"))
    assert result.is_error and result.payload["code"] == "INVALID_ARGUMENT"
    assert "not a string" in result.payload["message"]
    for record in records:  # diagd_calls and the audit log serialise these
        json.dumps(record.arguments, allow_nan=False)


DEFAULTS = object_schema({
    "limit": {"type": "integer", "minimum": 1, "default": 20},
    "layers": {"type": "array", "items": {"type": "string"}, "default": []},
    "nested": object_schema({"depth": {"type": "integer", "default": 3}, "name": {"type": "string"}}),
    "bad": {"type": "integer", "maximum": 5},
}, closed=True)


def defaults_registry() -> ToolRegistry:
    async def handler(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        args["layers"].append("touched")  # a handler changing a default must not change the next call's
        return {"args": args}

    registry = ToolRegistry(call_timeout_s=30)
    registry.register(ToolSpec(name="d", description="defaults", input_schema=DEFAULTS, handler=handler))
    return registry


async def test_validation_fills_the_defaults_the_schema_declares() -> None:
    registry = defaults_registry()
    first = await registry.call("d", {}, CallContext(client="test"))
    assert first.payload["args"] == {"limit": 20, "layers": ["touched"]}
    second = await registry.call("d", {"limit": "7", "nested": {"name": "x"}}, CallContext(client="test"))
    # Sent values win (after coercion); defaults fill nested objects that were sent, and each call gets its
    # own copy of a mutable default.
    assert second.payload["args"] == {"limit": 7, "layers": ["touched"], "nested": {"name": "x", "depth": 3}}


async def test_filling_defaults_keeps_the_error_paths_and_the_audited_arguments() -> None:
    registry = defaults_registry()
    records: list[CallRecord] = []
    registry.observers.append(records.append)
    result = await registry.call("d", {"nested": {"depth": "deep"}}, CallContext(client="test"))
    assert result.payload["details"]["path"] == "$.nested.depth"
    assert records[-1].arguments == {"nested": {"depth": "deep"}}  # what the client sent, not the defaults


class XReply(TypedDict):
    x: int
    """x plus the back end's offset"""


async def test_a_tool_set_declares_each_tool_once_and_binds_it_to_its_back_end() -> None:
    tools: ToolSet[dict[str, int]] = ToolSet()

    @tools.tool("t1", "first", {"x": {"type": "integer", "default": 1}}, required=("x",), read_only=False)
    async def t1(backend: dict[str, int], ctx: CallContext, args: dict[str, Any]) -> XReply:
        return {"x": args["x"] + backend["offset"]}

    with pytest.raises(ValueError, match="declared twice"):
        tools.tool("t1", "again")(t1)
    registered: list[ToolSpec] = []
    tools.register(SimpleNamespace(register_tool=registered.append), {"offset": 10})  # type: ignore[arg-type]
    [spec] = registered
    assert spec.input_schema == {"type": "object", "properties": {"x": {"type": "integer", "default": 1}},
                                 "required": ["x"], "additionalProperties": False}
    assert spec.reply is XReply and spec.output_schema is not None and not spec.read_only
    assert await spec.handler(CallContext(client="t"), {"x": 5}) == {"x": 15}


def test_shared_schema_fragments_are_valid_and_carry_their_defaults() -> None:
    schema = object_schema({**paging(limit=50, maximum=500), **display_filter(), "pcap_path": path("capture")},
                           ("pcap_path",), closed=True)
    args: dict[str, Any] = {"pcap_path": "x.pcap"}
    assert not list(arguments_validator(schema).iter_errors(args))
    assert args == {"pcap_path": "x.pcap", "offset": 0, "limit": 50, "display_filter": ""}
