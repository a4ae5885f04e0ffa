"""Starting MCP over HTTP inside `diagd serve` ([http] listen), without importing its stack until then."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import trio

from diagd.actors.tooling import CallContext
from diagd.daemon import app_views, tokens
from diagd.daemon.server.http.inflight import InFlight
from diagd.daemon.server.ui.feed import CallFeed
from diagd.protocol.errors import DiagdError, ErrorCode

if TYPE_CHECKING:
    from diagd.daemon.server.services import Front, Services


async def serve(daemon: Services, front: Front, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
                ) -> None:
    """The same SDK server as the Unix socket, started with the daemon (an HTTP client cannot start
    one), with the web view at /ui; `started` with the endpoint's URL. hypercorn and h11/h2 are
    imported here, off the loop."""
    _mcp_front, server = await front.get()
    http_front = await trio.to_thread.run_sync(importlib.import_module, "diagd.daemon.server.http.front")
    verifier = tokens.Verifier(daemon.state_dir)
    in_flight = InFlight()
    daemon.before_stop.append(in_flight.answer_all)  # each request in flight is answered before the stop
    registry = daemon.registry
    views = {spec.name: name for spec in registry.specs(None)
             if spec.ui is not None and app_views.path_of(spec.ui) is not None
             and (name := app_views.name_of(spec.ui)) is not None}
    feed = CallFeed(views=views)  # the web view's live call list (/ui, ui/web.py)
    registry.observers.append(feed.observe)
    daemon.before_stop.append(feed.close)

    async def call_for_page(tool: str, arguments: Any, cwd: str | None) -> dict[str, Any]:
        """A read-only tool run for the web view (a call's view again, or what a view asks), as an MCP
        Apps client: listed and audited as client "web-ui"."""
        spec = registry.get(tool)
        if not spec.read_only:
            raise DiagdError(ErrorCode.PERMISSION_DENIED, f"{tool} changes things: the web view runs read-only "
                             "tools only", tool=tool)
        result = await registry.call(tool, arguments, CallContext(client="web-ui", cwd=cwd, views=True))
        return {"content": [{"type": "text", "text": result.text}], "isError": result.is_error, "_meta": result.meta,
                **({} if result.is_error else {"structuredContent": result.payload})}

    shown = http_front.Shown(daemon.ui_auth, feed, daemon.status, call_for_page)
    await http_front.serve(daemon.config.http, server, verifier, state_dir=daemon.state_dir,
                           on_freed=daemon.trimmer.poke, default_tools=daemon.configured_tools,
                           in_flight=in_flight, shown=shown, task_status=task_status)
