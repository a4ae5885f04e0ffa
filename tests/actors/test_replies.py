"""Reply models: each tool's outputSchema is generated from its handler's reply model, whole where the
tests check replies (tests/support/reply_check.py) and cut to its type in tools/list."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, NotRequired

import jsonschema
import pytest
from typing_extensions import TypedDict

from diagd.actors.replies import reply_schema
from diagd.actors.tooling import CallContext, ToolSet
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
    assert tool_listing.output_schema(spec) == {"type": "object"}
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
