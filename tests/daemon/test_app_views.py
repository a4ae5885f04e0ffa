"""Views as MCP Apps without a browser: which tools name their view, the resources served, doctor's row.

The browser end of it (the built views in Chromium against a real daemon) is tests/e2e/test_views.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError
from typing_extensions import TypedDict

from diagd.actors.tooling import CallContext, ToolSet
from diagd.daemon import app_views
from diagd.daemon.cli import doctor
from diagd.daemon.server.mcp import resources as mcp_resources
from diagd.daemon.server.mcp.front import to_mcp_tool
from diagd.daemon.server.tools import ToolSpec


class EchoReply(TypedDict):
    message: str

tools: ToolSet[None] = ToolSet()


@tools.tool("shown", "A tool with a view.", {}, ui="ui://diagd/packet-list")
async def shown(owner: None, ctx: CallContext, args: dict[str, Any]) -> EchoReply:
    return {"message": ""}


@tools.tool("plain", "A tool without one.", {})
async def plain(owner: None, ctx: CallContext, args: dict[str, Any]) -> EchoReply:
    return {"message": ""}


SPECS: list[ToolSpec] = tools.specs(None)


@pytest.fixture
def views(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(app_views.ENV, str(tmp_path))
    (tmp_path / "packet-list.html").write_text("<!doctype html><title>x</title>")
    return tmp_path


def test_a_view_is_named_only_to_apps_clients_and_only_when_built(views: Path) -> None:
    with_view, without = (to_mcp_tool(s, views=True) for s in SPECS)
    assert with_view.meta == {"ui": {"resourceUri": "ui://diagd/packet-list"}} and without.meta is None
    assert to_mcp_tool(SPECS[0], views=False) == to_mcp_tool(replace(SPECS[0], ui=None))
    (views / "packet-list.html").unlink()
    assert to_mcp_tool(SPECS[0], views=True).meta is None  # not built: listed as it always was


def test_a_ui_must_be_a_ui_uri() -> None:
    with pytest.raises(ValueError, match="ui://"):
        tools.tool("bad", "d", {}, ui="https://example.com/view")


async def test_resources_list_and_read(views: Path) -> None:
    listed = mcp_resources.listing(SPECS).resources
    assert [(r.uri, r.mime_type, r.meta) for r in listed] == [
        ("ui://diagd/packet-list", "text/html;profile=mcp-app", {"ui": {"csp": {}, "prefersBorder": True}})]
    read = (await mcp_resources.read("ui://diagd/packet-list", SPECS)).contents[0]
    assert read.mime_type == "text/html;profile=mcp-app" and getattr(read, "text", "").startswith("<!doctype")
    with pytest.raises(MCPError) as refused:
        await mcp_resources.read("ui://diagd/paket-list", SPECS)
    assert refused.value.error.code == -32602 and refused.value.error.data == {
        "uri": "ui://diagd/paket-list", "did_you_mean": ["ui://diagd/packet-list"]}
    with pytest.raises(MCPError, match="unknown resource"):
        await mcp_resources.read("ui://diagd/../../etc/passwd", SPECS)


def test_doctor_says_whether_views_are_built(views: Path) -> None:
    built = doctor.check_views()
    assert built.ok and "packet-list" in built.detail and str(views) in built.detail
    (views / "packet-list.html").unlink()
    missing = doctor.check_views()
    assert not missing.ok and not missing.required and "build-views.sh" in missing.fix
    assert "without their MCP Apps view" in missing.detail
