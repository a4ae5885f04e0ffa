"""Tool groups: the options line, the selection, what tools/list says about a tool, and calls outside it."""

from __future__ import annotations

import json
from typing import Any, NotRequired

import jsonschema
import pytest
from mcp import Client
from typing_extensions import TypedDict

from diagd.daemon import config as config_mod
from diagd.daemon import tool_groups
from diagd.daemon.server import tool_listing
from diagd.daemon.server.mcp import front as mcp_front
from diagd.daemon.server.tools import CallContext, ToolRegistry, ToolSpec
from diagd.protocol.errors import DiagdError, ErrorCode


async def _ok(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True}


def registry() -> ToolRegistry:
    reg = ToolRegistry()
    for name, group in (("diagd_status", "diagd"), ("pcap_info", "pcap"), ("open_vmcore_session", "crash")):
        reg.register(ToolSpec(name=name, description=name, input_schema={"type": "object"}, handler=_ok,
                              group=group))
    return reg


def test_a_selection_always_has_the_builtin_group_and_refuses_unknown_groups_with_close_matches() -> None:
    assert tool_groups.check(["pcap"], ["pcap", "crash"]) == {"pcap", "diagd"}
    with pytest.raises(DiagdError) as caught:
        tool_groups.check(["pcp"], ["pcap", "crash"])
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    assert caught.value.details["did_you_mean"] == ["pcap"] and "did you mean pcap" in caught.value.message
    assert tool_groups.parse_list(" pcap, crash ,,") == ["pcap", "crash"]


def test_the_options_line_round_trips_and_mcp_lines_are_not_options() -> None:
    line = tool_groups.options_line({"crash", "pcap", "diagd"})
    assert line == b'{"diagd":{"v":1,"tools":["crash","pcap"]}}\n'
    assert tool_groups.read_options(line.strip()) == {"v": 1, "tools": ["crash", "pcap"]}
    assert tool_groups.read_options(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"diagd":1}}') is None
    assert tool_groups.read_options(b'{"jsonrpc":"2.0","diagd":{"v":1}}') is None
    assert tool_groups.read_options(b"not json") is None
    # Nesting past Python's recursion limit raises RecursionError, not ValueError: still "not options".
    assert tool_groups.read_options(b"[" * 2000 + b'"diagd"') is None


@pytest.mark.parametrize("line", [b'{"diagd":{"v":2}}', b'{"diagd":[]}', b'{"diagd":{"v":1,"tools":"pcap"}}',
                                  b'{"diagd":{"v":true}}'])
def test_a_malformed_options_line_is_a_protocol_error(line: bytes) -> None:
    with pytest.raises(DiagdError) as caught:
        tool_groups.read_options(line)
    assert caught.value.code is ErrorCode.PROTOCOL_ERROR


async def test_the_registry_lists_only_selected_groups_and_refuses_the_others_as_not_found() -> None:
    reg = registry()
    selection = tool_groups.check(["pcap"], reg.groups())
    assert [s.name for s in reg.specs(selection)] == ["diagd_status", "pcap_info"]
    assert [s.name for s in reg.specs()] == ["diagd_status", "pcap_info", "open_vmcore_session"]
    refused = await reg.call("open_vmcore_session", {}, CallContext(client="t"), selection=selection)
    assert refused.is_error and refused.payload["code"] == "NOT_FOUND"
    assert refused.payload["details"]["group"] == "crash" and "--tools" in refused.payload["message"]
    allowed = await reg.call("pcap_info", {}, CallContext(client="t"), selection=selection)
    assert not allowed.is_error
    unknown = await reg.call("pcap_inf", {}, CallContext(client="t"), selection=selection)
    assert unknown.payload["code"] == "INVALID_ARGUMENT" and unknown.payload["details"]["did_you_mean"] == ["pcap_info"]


class _Row(TypedDict):
    i: int


class _Reply(TypedDict):
    n: int
    rows: list[_Row]
    note: NotRequired[str]


def test_the_listed_output_schema_is_the_whole_generated_one() -> None:
    spec = ToolSpec(name="t", description="t", input_schema={"type": "object"}, handler=_ok, reply=_Reply)
    declared = spec.output_schema
    assert declared is not None and declared["required"] == ["n", "rows"]
    wire = mcp_front.to_mcp_tool(spec).model_dump(by_alias=True, mode="json", exclude_none=True)
    assert wire["outputSchema"] == tool_listing.output_schema(spec) == declared
    for valid in ({"n": 1, "rows": []}, {"n": 2, "rows": [{"i": 1}], "note": "x"}):
        jsonschema.validate(valid, wire["outputSchema"])
    for wrong in (["not", "an", "object"], {"n": 1}, {"n": 1, "rows": [{"i": "1"}]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, wire["outputSchema"])


def test_the_model_facing_bytes_are_each_tools_name_description_and_input_schema() -> None:
    spec = ToolSpec(name="t", description="d\u00e9", input_schema={"type": "object"}, handler=_ok, reply=_Reply)
    wire = mcp_front.to_mcp_tool(spec).model_dump(by_alias=True, mode="json", exclude_none=True)
    assert {"title", "annotations", "outputSchema"} & set(wire)
    model = '{"tools":[{"name":"t","description":"d\u00e9","inputSchema":{"type":"object"}}]}'
    assert tool_listing.model_facing_bytes([wire]) == len(model.encode())
    assert tool_listing.json_bytes({"tools": [wire]}) > len(model.encode()) + len(json.dumps(spec.output_schema))


def test_the_listed_input_schema_leaves_out_only_what_restates_how_a_client_reads_it() -> None:
    declared = {"type": "object", "additionalProperties": False, "required": ["p"], "properties": {
        "p": {"type": "string", "description": "a path"},
        "flag": {"type": "boolean", "default": False, "description": "f"},
        "on": {"type": "boolean", "default": True, "description": "o"},
        "text": {"type": "string", "default": "", "description": "t"},
        "items": {"type": "array", "items": {"type": "object", "additionalProperties": False}, "default": [],
                  "description": "i"},
        "offset": {"type": "integer", "minimum": 0, "default": 0, "description": "s"},
        "limit": {"type": "integer", "default": 50, "description": "l"},
        "frames": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 2**32 - 1},
                   "description": "n"},
        "count": {"type": "integer", "maximum": 1000, "description": "c"}}}
    wire = tool_listing.input_schema(declared)
    assert wire == {"type": "object", "required": ["p"], "properties": {
        "p": {"type": "string", "description": "a path"},
        "flag": {"type": "boolean", "description": "f"},
        "on": {"type": "boolean", "default": True, "description": "o"},
        "text": {"type": "string", "description": "t"},
        "items": {"type": "array", "items": {"type": "object"}, "description": "i"},
        "offset": {"type": "integer", "minimum": 0, "description": "s"},
        "limit": {"type": "integer", "default": 50, "description": "l"},
        "frames": {"type": "array", "items": {"type": "integer", "minimum": 1}, "description": "n"},
        "count": {"type": "integer", "maximum": 1000, "description": "c"}}}
    assert declared["additionalProperties"] is False and declared["properties"]["flag"]["default"] is False
    assert declared["properties"]["items"]["items"]["additionalProperties"] is False


def test_annotations_carry_only_the_hints_that_mean_something_for_the_tool() -> None:
    assert tool_listing.hints(read_only=True, destructive=False, idempotent=True) == {"readOnlyHint": True}
    assert tool_listing.hints(read_only=False, destructive=True, idempotent=False) == {
        "readOnlyHint": False, "destructiveHint": True, "idempotentHint": False}


def test_show_other_clients_arguments_is_a_checked_boolean_off_by_default() -> None:
    assert config_mod.parse({}).mcp.show_other_clients_arguments is False
    assert config_mod.parse({"mcp": {"show_other_clients_arguments": True}}).mcp.show_other_clients_arguments
    for bad in ({"show_other_clients_arguments": "yes"}, {"show_other_client_arguments": True}):
        with pytest.raises(DiagdError) as caught:
            config_mod.parse({"mcp": bad})
        assert caught.value.code == ErrorCode.INVALID_ARGUMENT, bad


async def test_an_unknown_argument_names_the_arguments_the_tool_takes() -> None:
    reg = ToolRegistry()
    reg.register(ToolSpec(name="export", description="x", input_schema={
        "type": "object", "properties": {"port": {"type": "string"}, "name": {"type": "string"}},
        "additionalProperties": False}, handler=_ok, group="serial"))
    result = await reg.call("export", {"out_path": "/root/.ssh/authorized_keys"}, CallContext(client="mcp:1"))
    assert result.is_error and result.payload["code"] == "INVALID_ARGUMENT"
    assert result.payload["details"]["hint"] == "export takes name, port"
    assert reg.group_of("export") == "serial" and reg.group_of("no_such_tool") == "diagd"


async def test_the_mcp_sdks_client_refuses_a_result_its_listed_output_schema_does_not_allow() -> None:
    """Why every call a real MCP client makes in the suite checks its reply against the listed schema:
    the SDK's client validates structuredContent against the outputSchema tools/list gave, and raises."""

    async def handler(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"n": "one", "rows": []} if args.get("wrong") else {"n": 1, "rows": [{"i": 1}]}

    reg = ToolRegistry()
    reg.register(ToolSpec(name="t", description="t", reply=_Reply, group="diagd", handler=handler,
                          input_schema={"type": "object", "properties": {"wrong": {"type": "boolean"}}}))
    async with Client(mcp_front.build_server(reg, version="0")) as client:
        # client.session: tests/conftest.py's own check of Client.call_tool knows only the daemon's tools.
        assert (await client.session.call_tool("t", {})).structured_content == {"n": 1, "rows": [{"i": 1}]}
        with pytest.raises(RuntimeError, match="Invalid structured content returned by tool t"):
            await client.session.call_tool("t", {"wrong": True})
