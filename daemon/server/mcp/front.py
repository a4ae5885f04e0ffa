"""The MCP front end: the SDK's low-level `Server` served on each Unix-socket connection.

The SDK has no socket transport, so `serve_connection` turns a Trio byte stream into the
`(read_stream, write_stream)` pair of `SessionMessage`s that `Server.run()` takes: a
newline-delimited JSON-RPC reader with a maximum line size, and a writer. This is exactly what
stdio carries, which is why the shim can be a plain byte pipe.
"""

from __future__ import annotations

import contextvars
import math
import select
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import mcp_types as types
import structlog
import trio
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.shared.message import SessionMessage

from diagd.daemon import app_views, jsonrpc, tool_groups
from diagd.daemon.server import connections, eras, tool_listing
from diagd.daemon.server.connections import ByteBudget, Connection
from diagd.daemon.server.mcp import requests as mcp_requests
from diagd.daemon.server.mcp import resources as mcp_resources
from diagd.daemon.server.mcp import validation as mcp_validation
from diagd.daemon.server.mcp import wire as mcp_wire
from diagd.daemon.server.mcp.lines import LineReader
from diagd.daemon.server.tools import CallContext, ToolRegistry, ToolSpec
from diagd.daemon.tool_groups import Selection, selects
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.mcp")

HTTP_CLIENT_KEY = "diagd.client"  # set by http/front.py (not imported here: HTTP is optional)
# Which connection a handler serves (set per connection task, inherited by its handlers).
current_client: contextvars.ContextVar[str] = contextvars.ContextVar("current_client", default="mcp:?")


class ChosenTools:
    """The tool groups one connection sees: `[mcp] tools` at connect time, or its options line."""

    def __init__(self, selection: Selection) -> None:
        self.selection = selection

    def __repr__(self) -> str:
        return f"<ChosenTools [{','.join(sorted(self.selection)) if self.selection is not None else 'ALL'}]>"


# Set per connection before its server starts, so every handler of the connection sees the one object.
current_tools: contextvars.ContextVar[ChosenTools | None] = contextvars.ContextVar("current_tools", default=None)


INTRO = """\
diagd drives the tools an embedded, kernel or 5G-core engineer uses to find a problem. Results are
compact JSON; failures are isError results with {code, message, details} and a stable code
(INVALID_ARGUMENT, NOT_FOUND, FILE_NOT_FOUND, PERMISSION_DENIED, TIMEOUT, OUTPUT_TOO_LARGE, BUSY,
BACKEND_UNAVAILABLE, INVALID_FILTER, INVALID_FIELDS, ...). Read `details` before retrying: it often
names the fix (a close field name, a missing decode-as, the mount command).
"""

def instructions(guides: Mapping[str, str], selection: Selection = None) -> str:
    """The server instructions for a client that selected these groups (None: all): the intro, then
    `guides`, one paragraph per group, each back end's as it declared it (`Runtime.set_instructions`)."""
    return "\n".join([INTRO, *(text for group, text in guides.items() if selects(selection, group))])


def to_mcp_tool(spec: ToolSpec, *, views: bool = False) -> types.Tool:
    """The tool as tools/list gives it (tool_listing): its input schema less what restates how a client
    reads it, its whole output schema (hosts validate structured results with it), the hints acted on.
    `views`: the client renders MCP Apps, so a tool whose view is built names it (`_meta.ui.resourceUri`,
    docs/views.md); any other client gets the tool exactly as before views existed."""
    hints = tool_listing.hints(read_only=spec.read_only, destructive=spec.destructive, idempotent=spec.idempotent)
    extra: dict[str, Any] = {}
    if views and spec.ui is not None and app_views.path_of(spec.ui) is not None:
        extra["_meta"] = {"ui": {"resourceUri": spec.ui}}
    return types.Tool(
        name=spec.name,
        title=spec.title,
        description=spec.description,
        input_schema=tool_listing.input_schema(spec.input_schema),
        output_schema=tool_listing.output_schema(spec),
        annotations=types.ToolAnnotations.model_validate(hints),
        **extra,
    )


def client_supports_apps(ctx: ServerRequestContext[Any]) -> bool:
    """Whether the client declared MCP Apps with its HTML profile (`capabilities.extensions`), as the SDK's
    mcp.server.apps.client_supports_apps tells it (not imported: that module loads its high-level server)."""
    capabilities = getattr(ctx.session, "client_capabilities", None)
    extensions = getattr(capabilities, "extensions", None) or {}
    settings = extensions.get(app_views.EXTENSION_ID)
    mime_types = settings.get("mimeTypes") if isinstance(settings, dict) else None
    return isinstance(mime_types, list | tuple) and app_views.MIME_TYPE in mime_types


def _client(ctx: ServerRequestContext[Any]) -> str:
    """Who calls: `http:<token name>` over HTTP (http/front.py puts it on the request's ASGI scope: the
    SDK runs an HTTP session's handlers in its own tasks, not the request's), else the connection's."""
    scope = getattr(ctx.request, "scope", None)
    client = scope.get(HTTP_CLIENT_KEY) if isinstance(scope, dict) else None
    return client if isinstance(client, str) else current_client.get()


def build_server(registry: ToolRegistry, *, version: str, default_tools: Callable[[], Selection] = lambda: None,
                 guides: Mapping[str, str] | None = None) -> Server[Any]:
    """The SDK server every transport shares. A connection of the Unix socket carries its own choice
    (`current_tools`); an HTTP session the one it opened with (`requests.py`'s `session_tools`); a
    2026-era HTTP request, which has no session, `default_tools()` (`[mcp] tools`) at that request."""

    def _selection(ctx: ServerRequestContext[Any]) -> Selection:
        chosen = current_tools.get()
        if chosen is not None:
            return chosen.selection
        in_session, selection = mcp_requests.session_tools(ctx)
        return selection if in_session else default_tools()

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        views = client_supports_apps(ctx)
        return types.ListToolsResult(tools=[to_mcp_tool(s, views=views) for s in registry.specs(_selection(ctx))])

    async def list_resources(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> types.ListResourcesResult:
        return mcp_resources.listing(registry.specs(_selection(ctx)))

    async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
                            ) -> types.ReadResourceResult:
        return await mcp_resources.read(str(params.uri), registry.specs(_selection(ctx)))

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
                        ) -> types.CallToolResult:
        selection = _selection(ctx)
        # Unknown: a protocol error, not a result (audited and counted all the same).
        try:
            registry.check_callable(params.name, selection, client=_client(ctx), arguments=params.arguments)
        except DiagdError as exc:
            raise mcp_requests.refused(params.name, exc) from None
        meta: dict[str, Any] = dict(ctx.meta or {})
        wants_progress = meta.get("progress_token", meta.get("progressToken")) is not None
        conn = connections.current.get()
        call_ctx = CallContext(
            client=_client(ctx),
            progress=ctx.session.report_progress if wants_progress else None,
            cwd=conn.cwd if conn is not None else None,  # the shim's, i.e. its MCP client's directory
            views=client_supports_apps(ctx),
        )
        result = await registry.call(params.name, params.arguments, call_ctx, selection=selection)
        return types.CallToolResult(
            content=[types.TextContent(text=result.text)],
            structured_content=None if result.is_error else result.payload,
            is_error=result.is_error,
            _meta=result.meta,
        )

    server: Server[Any] = Server("diagd", version=version, title="diagd diagnostics daemon",
                                 instructions=instructions(guides or {}), on_list_tools=list_tools,
                                 on_call_tool=call_tool, on_list_resources=list_resources,
                                 on_read_resource=read_resource)
    server.extensions[app_views.EXTENSION_ID] = {}  # MCP Apps (SEP-1865): the tools' views, docs/views.md
    server.middleware.append(mcp_validation.short_validation_errors)
    _discover_lists_advertised(server)
    return server


def _discover_lists_advertised(server: Server[Any]) -> None:
    """`server/discover` as the SDK answers it, but its `supportedVersions` from eras.ADVERTISED: the
    list an UnsupportedProtocolVersion error gives as `data.supported` (wire.py), so they cannot
    disagree."""
    sdk = server.get_request_handler("server/discover")
    assert sdk is not None, "the SDK serves server/discover"

    async def discover(ctx: ServerRequestContext[Any], params: types.RequestParams) -> types.DiscoverResult:
        result = await sdk.handler(ctx, params)
        assert isinstance(result, types.DiscoverResult), result
        return result.model_copy(update={"supported_versions": list(eras.ADVERTISED)})

    server.add_request_handler("server/discover", types.RequestParams, discover)


class _InFlight:
    """Requests the SDK was given and has not answered yet.

    The SDK's dispatcher cancels every running handler when its input ends, so a client that
    half-closes after its last request (`printf ... | diagd mcp`) would lose the answers still being
    computed: the reader holds the SDK's input open until this is empty (a hang-up still cancels).
    """

    def __init__(self) -> None:
        self._ids: set[str | int] = set()
        self._idle = trio.Event()
        self._idle.set()

    def given(self, message: SessionMessage) -> None:
        msg = message.message
        if isinstance(msg, types.JSONRPCRequest):
            if not self._ids:
                self._idle = trio.Event()
            self._ids.add(msg.id)
        elif isinstance(msg, types.JSONRPCNotification) and msg.method == "notifications/cancelled":
            self._done((msg.params or {}).get("requestId"))  # MCP: a cancelled request is not answered

    def answered(self, message: SessionMessage) -> None:
        if isinstance(message.message, types.JSONRPCResponse | types.JSONRPCError):
            self._done(message.message.id)

    def _done(self, ident: Any) -> None:
        self._ids.discard(ident)
        if not self._ids:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()


class _Pipes:
    """The two directions of one MCP connection: socket lines to the SDK's server, its answers (and
    the screening's own error lines) back to the socket."""

    def __init__(self, stream: trio.SocketStream, server: Server[Any], lines: LineReader, client: str,
                 on_options: Callable[[dict[str, Any] | None], None]) -> None:
        self.stream, self.lines, self.client = stream, lines, client
        self.on_options: Callable[[dict[str, Any] | None], None] | None = on_options  # None once the first line is in
        self.read_send, self.read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        # The SDK writes SessionMessages; the screening below writes ready-made error lines (bytes).
        self.write_send, self.write_recv = anyio.create_memory_object_stream[SessionMessage | bytes](0)
        self.handshake = mcp_wire.Handshake(lambda method: server.get_request_handler(method) is not None)
        self.writer_done = trio.Event()
        self.in_flight = _InFlight()
        self.mid_line = False  # a send_all cancelled midway leaves half a line on the socket

    async def reader(self, at_eof: Callable[[], None]) -> bool:
        """Feed complete lines to the server; True at a clean EOF (once every request is answered;
        `at_eof` runs first), False when the connection must close (a line too long or too slow:
        its error is queued for the writer)."""
        async with self.read_send:
            while True:
                try:
                    batch = await self.lines.next_lines()
                except DiagdError as exc:
                    self.lines.release()
                    log.warning("mcp line refused, closing", client=self.client, reason=exc.message)
                    await self.write_send.send(_closing_error(exc))
                    return False
                if batch is None:
                    self.lines.release()
                    at_eof()
                    await self.in_flight.wait_idle()
                    return True
                if self.on_options is not None:
                    on_options, self.on_options = self.on_options, None
                    try:
                        options = tool_groups.read_options(batch[0])
                        on_options(options)
                    except DiagdError as exc:
                        log.warning("mcp connection options refused, closing", client=self.client, reason=exc.message)
                        await self.write_send.send(_closing_error(exc))
                        return False
                    if options is not None:
                        batch = batch[1:]
                for line in batch:
                    if not line.strip():
                        continue
                    parsed = mcp_wire.parse(line)
                    if isinstance(parsed, SessionMessage):
                        parsed = self.handshake.screen(parsed) or parsed
                    if isinstance(parsed, SessionMessage):
                        self.in_flight.given(parsed)
                        await self.read_send.send(parsed)
                    else:  # answered here: the SDK would stay silent or answer misleadingly
                        await self.write_send.send(parsed)

    async def writer(self) -> None:
        try:
            async with self.write_recv:
                async for message in self.write_recv:
                    if isinstance(message, bytes):
                        await self._send(message)
                        continue
                    self.handshake.answered(message)
                    self.in_flight.answered(message)
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await self._send(data.encode())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.writer_done.set()

    async def _send(self, data: bytes) -> None:
        self.mid_line = True
        await self.stream.send_all(data)
        self.mid_line = False

    async def farewell(self, line: bytes) -> None:
        """The last line, after the writer stopped (bounded: the peer may not read)."""
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            try:
                # Ends a half-written line first, so the notice is a line of its own.
                await self.stream.send_all((b"\n" if self.mid_line else b"") + line)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass


async def serve_connection(stream: trio.SocketStream, server: Server[Any], *, client: str,
                           max_line_bytes: int, frame_timeout_s: float = math.inf,
                           budget: ByteBudget | None = None, conn: Connection | None = None,
                           stopping: Callable[[], bytes | None] | None = None,
                           tools: Selection = None, groups: Sequence[str] = (),
                           guides: Mapping[str, str] | None = None,
                           off: Mapping[str, Mapping[str, str]] | None = None) -> None:
    """Serve MCP on one accepted connection until either side closes.

    A client that half-closes (EOF after its last request, as `echo ... | diagd mcp` does) still
    gets its answers; a client that hangs up completely has its in-flight calls cancelled. A
    partial line must be complete within `frame_timeout_s` of its first byte and draws on
    `budget` past a small size (see `lines.py`); otherwise the client gets a coded error and
    the connection closes. When the daemon stops under it, `stopping()` gives the last line the
    client gets (a DAEMON_STOPPING notice: the shim reconnects after it, unlike after a refusal).

    `tools` are the groups the connection sees (`[mcp] tools`); a first line of options
    (`tool_groups.read_options`) may choose others among `groups`, the registered ones; the
    initialize answer's instructions hold the `guides` of the groups it sees.
    """
    current_client.set(client)
    chosen = ChosenTools(tools)
    current_tools.set(chosen)
    lines = LineReader(stream, max_line_bytes=max_line_bytes, frame_timeout_s=frame_timeout_s,
                       budget=budget, conn=conn)
    init_options = server.create_initialization_options()

    def on_options(options: dict[str, Any] | None) -> None:
        # Before the first MCP message reaches the server: its initialize answer gets these instructions.
        if options is not None and options.get("tools") is not None:
            chosen.selection = tool_groups.check(options["tools"], groups, off=off)
        init_options.instructions = instructions(guides or {}, chosen.selection)

    pipes = _Pipes(stream, server, lines, client, on_options)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipes.writer)

            async def run_server() -> None:
                async with pipes.write_send:
                    await server.run(pipes.read_recv, pipes.write_send.clone(), init_options)

            nursery.start_soon(run_server)
            if await pipes.reader(lambda: nursery.start_soon(_cancel_on_hangup, stream, nursery.cancel_scope)):
                await pipes.writer_done.wait()  # every answer written (or the peer is gone)
            else:
                with trio.move_on_after(1):  # flush the error ...
                    await pipes.writer_done.wait()
                await _discard_input(stream)  # ... and make sure the peer can read it
            nursery.cancel_scope.cancel(reason="client closed the connection")
    finally:
        lines.release()
        last = stopping() if stopping is not None else None
        if last is not None:
            await pipes.farewell(last)
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await stream.aclose()


def _closing_error(exc: DiagdError) -> bytes:
    """The last line a refused connection gets: a too-long line is an invalid request, a too-slow
    one a coded TIMEOUT (a server error, as the accept loop words its notices); both say the daemon closes."""
    if exc.code is ErrorCode.PROTOCOL_ERROR:
        data = {"code": str(exc.code), "closing": True, **exc.details}
        return jsonrpc.error_line(mcp_wire.INVALID_REQUEST, exc.message, data=data)
    return jsonrpc.coded_error(exc.code, exc.message, closing=True, **exc.details)


async def _cancel_on_hangup(stream: trio.SocketStream, scope: trio.CancelScope) -> None:
    """After EOF, tell a half-close from a hang-up: only a hang-up cancels in-flight calls.

    Trio has no POLLHUP wait, so this polls; it runs only between a client's EOF and the end of
    its last answers.
    """
    poller = select.poll()
    poller.register(stream.socket.fileno(), select.POLLHUP)
    while True:
        if any(ev & select.POLLHUP for _, ev in poller.poll(0)):
            scope.cancel(reason="client hung up")
            return
        await trio.sleep(0.05)


async def _discard_input(stream: trio.SocketStream, timeout_s: float = 2.0) -> None:
    """Half-close, then read and drop what the peer still sends (bounded in time).

    Closing a Unix socket with unread input resets the peer, which can then lose our last
    answer; draining first lets it read the error before it sees EOF.
    """
    with trio.move_on_after(timeout_s):
        try:
            await stream.send_eof()
            while await stream.receive_some(65536):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
