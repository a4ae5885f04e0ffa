"""The MCP front end: the SDK's low-level `Server` served on each Unix-socket connection.

The SDK has no socket transport, so `serve_connection` turns a Trio byte stream into the
`(read_stream, write_stream)` pair of `SessionMessage`s that `Server.run()` takes: a
newline-delimited JSON-RPC reader with a maximum line size, and a writer. This is exactly what
stdio carries, which is why the shim can be a plain byte pipe.
"""

from __future__ import annotations

import contextvars
import json
from typing import Any

import anyio
import mcp_types as types
import structlog
import trio
from diagd.daemon.tools import CallContext, ToolRegistry, ToolSpec
from mcp.server import Server, ServerRequestContext
from mcp.shared.message import SessionMessage

log = structlog.get_logger("diagd.mcp")

# Which connection a handler serves (set per connection task, inherited by its handlers).
current_client: contextvars.ContextVar[str] = contextvars.ContextVar("current_client", default="mcp:?")

INSTRUCTIONS = """\
diagd drives the tools an embedded, kernel or 5G-core engineer uses to find a problem. Every
result is compact JSON; failures are isError results with {code, message, details}, where code is
stable (INVALID_ARGUMENT, NOT_FOUND, FILE_NOT_FOUND, PERMISSION_DENIED, TIMEOUT, OUTPUT_TOO_LARGE,
BACKEND_UNAVAILABLE, BUSY, ...). Read `details` before retrying: it often names the fix.

Workflows:
- pcap (pcap_* / ngap_* tools, when installed): pcap_info first (protocols, conversations), then
  pcap_frames_by_filter or pcap_timeline with a display filter to find the failing frame, then
  pcap_frame_detail on those frame numbers; pcap_follow for a SIP call, Diameter session or HTTP/2
  stream; ngap_ue_sessions / ngap_pdu_session_summary for 5G registration and PDU session issues.
- serial (list_ports, configure_connection, send_data, read_urc, get_log): open the port once,
  send with wait_policy=keyword and a stop_pattern such as OK or ERROR; unsolicited output is kept
  in the URC buffer; the raw Tx/Rx log is the source of truth.
- bpftrace (list_probes, list_helpers, exec_program, get_result): exec_program returns an id at
  once; page the output with get_result while it runs; stop_execution ends it gracefully.
- vmcore (open_vmcore_session, run_crash_command, run_drgn_command, get_crash_info): open a session
  on vmcore + vmlinux, start with get_crash_info for triage, then bt/log/kmem or drgn code; long
  outputs are stored: page with get_command_output, grep with search_command_output.
- diagd itself: diagd_status shows the daemon, its actors and per-tool statistics; diagd_calls
  lists recent tool calls with their durations and outcomes.
"""


def to_mcp_tool(spec: ToolSpec) -> types.Tool:
    return types.Tool(
        name=spec.name,
        title=spec.title,
        description=spec.description,
        input_schema=spec.input_schema,
        output_schema=spec.output_schema,
        annotations=types.ToolAnnotations(
            title=spec.title,
            read_only_hint=spec.read_only,
            destructive_hint=spec.destructive,
            idempotent_hint=spec.idempotent,
            open_world_hint=False,
        ),
    )


def build_server(registry: ToolRegistry, *, version: str) -> Server[Any]:
    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[to_mcp_tool(s) for s in registry.specs()])

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
                        ) -> types.CallToolResult:
        meta: dict[str, Any] = dict(ctx.meta or {})
        wants_progress = meta.get("progress_token", meta.get("progressToken")) is not None
        call_ctx = CallContext(
            client=current_client.get(),
            progress=ctx.session.report_progress if wants_progress else None,
        )
        result = await registry.call(params.name, params.arguments, call_ctx)
        return types.CallToolResult(
            content=[types.TextContent(text=result.text)],
            structured_content=None if result.is_error else result.payload,
            is_error=result.is_error,
            _meta=result.meta,
        )

    return Server(
        "diagd",
        version=version,
        title="diagd diagnostics daemon",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_connection(stream: trio.SocketStream, server: Server[Any], *, client: str,
                           max_line_bytes: int) -> None:
    """Serve MCP on one accepted connection until either side closes."""
    current_client.set(client)
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)

    async def reader() -> None:
        buffer = bytearray()
        async with read_send:
            while True:
                try:
                    chunk = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return
                if not chunk:
                    return
                buffer += chunk
                while (nl := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:nl])
                    del buffer[: nl + 1]
                    if line.strip():
                        await read_send.send(_parse(line))
                if len(buffer) > max_line_bytes:
                    log.warning("mcp line too long, closing", client=client, limit=max_line_bytes)
                    await _send_raw_error(stream, f"message exceeds {max_line_bytes} bytes")
                    return

    async def writer() -> None:
        async with write_recv:
            async for message in write_recv:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                try:
                    await stream.send_all(data.encode())
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return

    init_options = server.create_initialization_options()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)

            async def run_server() -> None:
                await server.run(read_recv, write_send, init_options)
                nursery.cancel_scope.cancel(reason="mcp session ended")

            nursery.start_soon(run_server)
            await reader()
            # EOF from the client: in-flight calls are cancelled with the session.
            nursery.cancel_scope.cancel(reason="client closed the connection")
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await stream.aclose()


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except Exception as exc:  # the server answers a parse error; the connection lives on
        return exc


async def _send_raw_error(stream: trio.SocketStream, message: str) -> None:
    body = ('{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":%s}}\n' % json.dumps(message)).encode()
    try:
        await stream.send_all(body)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
