"""resources/list and resources/read: the tools' views, MCP Apps (SEP-1865, docs/views.md).

Each view a tool of the client's selection names (`ToolSpec.ui`, `ui://diagd/<name>`) and that is built
(daemon/app_views.py) is one resource: a self-contained HTML document of MIME type
`text/html;profile=mcp-app` whose `_meta.ui.csp` declares no outside origin at all (the view fetches
nothing: its script and style are inline, its data comes from tool calls through the host).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

import mcp_types as types
import trio
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from diagd.daemon import app_views
from diagd.daemon.server.tools import ToolSpec

# No connect, resource, frame or base-uri origin: the host's CSP for the view allows none.
UI_META: dict[str, Any] = {"ui": {"csp": {}, "prefersBorder": True}}


def _views(specs: Iterable[ToolSpec]) -> dict[str, list[ToolSpec]]:
    """uri -> the tools that show their results in it, for the built views."""
    out: dict[str, list[ToolSpec]] = {}
    for spec in specs:
        if spec.ui is not None and app_views.path_of(spec.ui) is not None:
            out.setdefault(spec.ui, []).append(spec)
    return out


def _describe(uri: str, tools: list[ToolSpec]) -> types.Resource:
    name = app_views.name_of(uri) or uri
    return types.Resource(uri=uri, name=name, title=f"diagd {name.replace('-', ' ')}",
                          description=f"MCP Apps view of {', '.join(t.name for t in tools)}",
                          mime_type=app_views.MIME_TYPE, _meta=UI_META)


def listing(specs: Iterable[ToolSpec]) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[_describe(uri, tools) for uri, tools in _views(specs).items()])


async def read(uri: str, specs: Iterable[ToolSpec]) -> types.ReadResourceResult:
    """The view's HTML; an unknown (or not built) URI is an invalid-params error naming the close ones."""
    known = _views(specs)
    path = app_views.path_of(uri) if uri in known else None
    if path is None:
        # Close by the view's name: every diagd view URI shares its long scheme and host part.
        by_name = {app_views.name_of(k) or k: k for k in known}
        asked = app_views.name_of(uri) or uri.rsplit("/", 1)[-1]
        close = [by_name[n] for n in difflib.get_close_matches(asked, list(by_name), n=3, cutoff=0.5)]
        if close:
            hint = f" (did you mean {' or '.join(close)}?)"
        elif known:
            hint = f" (diagd's resources: {', '.join(sorted(known))})"
        else:
            hint = f" (no view is built: {app_views.BUILD_HINT})"
        raise MCPError(code=INVALID_PARAMS, message=f"unknown resource {uri!r}{hint}",
                       data={"uri": uri, "did_you_mean": close or sorted(known)})
    html = await trio.Path(path).read_text(encoding="utf-8")
    return types.ReadResourceResult(contents=[
        types.TextResourceContents(uri=uri, mime_type=app_views.MIME_TYPE, text=html, _meta=UI_META)])
