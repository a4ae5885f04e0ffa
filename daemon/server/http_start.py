"""Starting MCP over HTTP inside `diagd serve` ([http] listen), without importing its stack until then."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import trio

from diagd.daemon import tokens
from diagd.daemon.server.http_inflight import InFlight
from diagd.daemon.server.ui_feed import CallFeed

if TYPE_CHECKING:
    from diagd.daemon.server.services import Front, Services


async def serve(daemon: Services, front: Front, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
                ) -> None:
    """The same SDK server as the Unix socket, started with the daemon (an HTTP client cannot start
    one), with the web view at /ui; `started` with the endpoint's URL. hypercorn and h11/h2 are
    imported here, off the loop."""
    _mcp_front, server = await front.get()
    http_front = await trio.to_thread.run_sync(importlib.import_module, "diagd.daemon.server.http_front")
    verifier = tokens.Verifier(daemon.state_dir)
    in_flight = InFlight()
    daemon.before_stop.append(in_flight.answer_all)  # each request in flight is answered before the stop
    feed = CallFeed()  # the web view's live call list (/ui, web_ui.py)
    daemon.registry.observers.append(feed.observe)
    daemon.before_stop.append(feed.close)
    shown = http_front.Shown(daemon.ui_auth, feed, daemon.status)
    await http_front.serve(daemon.config.http, server, verifier, state_dir=daemon.state_dir,
                           on_freed=daemon.trimmer.poke, default_tools=daemon.configured_tools,
                           in_flight=in_flight, shown=shown, task_status=task_status)
