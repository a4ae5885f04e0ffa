"""Reply models: each tool's outputSchema is generated from its handler's reply model, the same whole
schema in tools/list and where the tests check replies (tests/support/reply_check.py)."""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any, NotRequired

import jsonschema
import pytest
from typing_extensions import TypedDict

from diagd.actors.replies import is_reply_model, reply_schema
from diagd.actors.tooling import CallContext, ToolSet, ToolSpec
from diagd.daemon.server import tool_listing
from tests.support import reply_check


class Inner(TypedDict):
    """A nested part."""

    n: int
    """how many"""


class Reply(TypedDict):
    """What the tool returns."""

    title: str
    """a property named title stays (pydantic's title keywords go)"""
    parts: list[Inner]
    note: NotRequired[str | None]


def test_the_schema_is_generated_from_the_model_with_its_docstrings_as_descriptions() -> None:
    schema = reply_schema(Reply)
    assert schema["type"] == "object" and schema["description"] == "What the tool returns."
    assert schema["required"] == ["title", "parts"]
    assert schema["properties"]["title"] == {"description": "a property named title stays (pydantic's title "
                                                             "keywords go)", "type": "string"}
    assert schema["$defs"]["Inner"]["properties"]["n"] == {"description": "how many", "type": "integer"}
    assert "title" not in schema and "title" not in schema["$defs"]["Inner"]
    jsonschema.validate({"title": "t", "parts": [{"n": 1}], "note": None}, schema)
    for wrong in ({"title": "t"}, {"title": "t", "parts": [{"n": "1"}]}, {"title": 1, "parts": []}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)


def test_a_tool_takes_its_reply_model_from_its_handlers_return_annotation() -> None:
    tools: ToolSet[None] = ToolSet()

    @tools.tool("t", "A tool.", {})
    async def handler(owner: None, ctx: CallContext, args: dict[str, Any]) -> Reply:
        return {"title": "x", "parts": []}

    [spec] = tools.specs(None)
    assert spec.reply is Reply and spec.output_schema == reply_schema(Reply)
    assert tool_listing.output_schema(spec) == reply_schema(Reply)  # tools/list gives it whole
    with pytest.raises(TypeError, match="reply model"):
        @tools.tool("u", "Another.", {})
        async def untyped(owner: None, ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
            return {}


def test_every_declared_tool_has_a_valid_whole_output_schema_and_the_check_refuses_a_wrong_reply() -> None:
    known = reply_check.validators()
    assert {"send_data", "pcap_info", "diagd_status", "exec_program", "run_crash_command", "echo"} <= set(known)
    wrong = SimpleNamespace(is_error=False, structured_content={"port": "ttyX"})
    with pytest.raises(AssertionError, match="send_data: its reply does not match"):
        reply_check.check("send_data", wrong)
    with pytest.raises(AssertionError, match="no declared tool"):
        reply_check.check("no_such_tool", SimpleNamespace(is_error=False, structured_content={}))
    reply_check.check("send_data", SimpleNamespace(is_error=True, structured_content={"code": "X"}))


def _declared_specs() -> dict[str, ToolSpec]:
    """Every tool declared on a ToolSet in the modules the reply check knows (all of diagd's and the test's)."""
    specs: dict[str, ToolSpec] = {}
    for name in reply_check.MODULES:
        module = importlib.import_module(name)
        for toolset in (v for v in vars(module).values() if isinstance(v, ToolSet)):
            specs |= {spec.name: spec for spec in toolset.specs(None)}
    return specs


def _undescribed(schema: dict[str, Any], where: str) -> list[str]:
    """`where.key` of every property (at any depth, in `$defs` too) that has no description."""
    found = []
    for key, prop in schema.get("properties", {}).items():
        if not (isinstance(prop.get("description"), str) and prop["description"].strip()):
            found.append(f"{where}.{key}")
    for name, sub in schema.get("$defs", {}).items():
        found += _undescribed(sub, f"{where}/$defs/{name}")
    return found


def test_every_tools_output_schema_is_generated_from_its_reply_model_with_every_property_described() -> None:
    specs = _declared_specs()
    assert len(specs) >= 45 and {"send_data", "pcap_info", "exec_program", "run_crash_command", "start_capture",
                                 "diagd_timeline", "pcap_sequence_diagram", "diagd_record_stop", "echo"} <= set(specs)
    for spec in specs.values():
        assert spec.reply is not None and is_reply_model(spec.reply), spec.name
        assert spec.output_schema == reply_schema(spec.reply), spec.name
    assert "declared_output" not in ToolSpec.__dataclass_fields__  # no schema written by hand can stand in
    undescribed = [u for spec in specs.values() for u in _undescribed(spec.output_schema or {}, spec.name)]
    assert undescribed == [], f"{len(undescribed)} reply properties have no description (an attribute docstring)"
