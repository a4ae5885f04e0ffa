"""The capture MCP tools: list_interfaces, start_capture, capture_status, stop_capture, list_captures.
Handlers check arguments (the interface allow-list, the filter's compile check, the disk budget), start
a capture's actor or ask it, and shape the reply from the capture's record, which only its actor writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from diagd.actors.capture import budget
from diagd.actors.capture.actor import KIND, STOP_WAIT_MAX_S, CaptureActor
from diagd.actors.capture.backend import CaptureBackend
from diagd.actors.capture.messages import Stop
from diagd.actors.capture.record import Capture
from diagd.actors.capture.replies import CapturesReply, InterfacesReply, StatusReply, StopExtras, StopReply
from diagd.actors.capture.schemas import CAPTURE_ID_ARG, START_PROPS, STATUSES
from diagd.actors.capture.settings import CaptureSettings
from diagd.actors.tooling import CallContext, ToolSet
from diagd.protocol.errors import DiagdError, ErrorCode

tools: ToolSet[CaptureBackend] = ToolSet()

PCAP_HINT = ("pcap_path \"capture:<id>\" reads it with the pcap tools (and diagd_timeline), also while it grows: "
             "they answer on the packets written so far; each of files is a pcap_path too")


@tools.tool(
    "list_interfaces", title="List capture interfaces",
    description="Interfaces dumpcap can capture on: addresses, up/down, link types, and whether "
                "[capture] allowed_interfaces allows each.",
    props={"link_types": {"type": "boolean", "default": True, "description": "ask dumpcap for each one's link types"},
           "allowed_only": {"type": "boolean", "default": False, "description": "allowed ones only"}},
    timeout_s=60,
)
async def list_interfaces(backend: CaptureBackend, ctx: CallContext, args: dict[str, Any]) -> InterfacesReply:
    settings = backend.settings()
    found = await backend.interfaces(settings, args["link_types"])
    if args["allowed_only"]:
        found = [i for i in found if i["allowed"]]
    return {"interfaces": found, "count": len(found), "capture_enabled": bool(settings.allowed_interfaces),
            "allowed_interfaces": list(settings.allowed_interfaces)}


@tools.tool(
    "start_capture", title="Start a live capture",
    description="Capture on interfaces with dumpcap into a ring of pcapng files; returns a capture_id at once. "
                "The filter is compiled first (a bad one: INVALID_FILTER). The capture belongs to this client "
                "and runs until a stop condition, stop_capture, or [capture] max_duration_s.",
    props=START_PROPS, required=("interfaces",), read_only=False, idempotent=False,
    timeout_s=90,
)
async def start_capture(backend: CaptureBackend, ctx: CallContext, args: dict[str, Any]) -> StatusReply:
    settings = backend.settings()
    interfaces = list(dict.fromkeys(args["interfaces"]))
    settings.check_allowed(interfaces)
    duration = float(args.get("duration_s", settings.max_duration_s))
    if duration > settings.max_duration_s:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"duration_s {duration:g} exceeds [capture] max_duration_s = "
                         f"{settings.max_duration_s:g}", max_duration_s=settings.max_duration_s)
    snaplen = min(args["snaplen"], settings.max_snaplen)
    ring = _ring(args)
    backend.reserve(settings)
    backend.starting += 1
    excluded = list(backend.runtime.config().own_tcp_ports)
    applied = applied_filter(args["filter"], excluded)
    try:
        await backend.check_filter(settings, interfaces, applied, snaplen, given=args["filter"])
        # The budget is held before it is crossed: the capture's share, which dumpcap's own arguments bound.
        # Finished captures' files go first (oldest first) to make room for what it asks, or an equal share.
        await backend.enforce_budget(room_for=budget.wanted(ring=ring, stop_bytes=args.get("bytes"), snaplen=snaplen,
                                                            share=settings.max_bytes // settings.max_concurrent))
        room = await backend.room()
        running = sum(1 for a in backend.live.values() if a.capture.running)
        bound = budget.plan(ring=ring, stop_bytes=args.get("bytes"), snaplen=snaplen, room=room,
                            share=room // max(1, settings.max_concurrent - running))
        stop_on = {k: args[k] for k in ("packets", "bytes") if k in args} | {"duration_s": duration}
        cap = await trio.to_thread.run_sync(lambda: backend.new_capture(
            owner=ctx.client, interfaces=interfaces, filter=args["filter"], snaplen=snaplen, ring=bound.ring,
            stop_on=stop_on, excluded_tcp_ports=excluded, applied_filter=applied,
            reserved_bytes=bound.reserved_bytes, autostop_kb=bound.autostop_kb))
        argv = settings.command(_dumpcap_args(cap, args["promiscuous"], settings.buffer_mb, bound.args),
                                write_dir=Path(cap.dir))
        actor = CaptureActor(cap, backend, settings, argv)
        # The actor must not idle out while dumpcap runs: its idle timeout covers the whole capture.
        idle_s = duration + settings.start_timeout_s + settings.stop_grace_s + settings.linger_s + 30
        try:
            await backend.runtime.start(KIND, cap.id, lambda: actor, idle_timeout_s=idle_s)
        except BaseException:
            await trio.to_thread.run_sync(backend.store.forget, cap)
            raise
    finally:
        backend.starting -= 1
    return {**backend.describe(cap), "hint": PCAP_HINT}


def applied_filter(given: str, excluded_tcp_ports: list[int]) -> str:
    """`given` with diagd's own traffic left out: no user filter can bring it back (it is ANDed, the
    given one in parentheses). `tcp port N` matches IPv4 and IPv6 TCP, on any address, so a capture on
    `lo`, `any` or the listener's interface never holds a request of diagd's HTTP listener or its
    bearer token. (A non-first IPv4 fragment carries no TCP header and so is not matched: TCP over
    loopback is never fragmented, and a listener other hosts reach needs TLS, [http] listen.)"""
    if not excluded_tcp_ports:
        return given
    own = " or ".join(f"tcp port {port}" for port in excluded_tcp_ports)
    return f"({given}) and not ({own})" if given else f"not ({own})"


def _ring(args: dict[str, Any]) -> dict[str, Any]:
    ring: dict[str, Any] = {k: args[k] for k in ("ring_files", "file_size_kb", "file_duration_s") if k in args}
    if "ring_files" in ring and len(ring) == 1:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "ring_files needs file_size_kb or file_duration_s (when to "
                         "switch to the next file)", argument="ring_files")
    return ring


def _dumpcap_args(cap: Capture, promiscuous: bool, buffer_mb: int, bound: list[str]) -> list[str]:
    """Child mode (-Z none: messages on stderr), pcapng, one -i per interface with its snaplen, kernel
    buffer and filter; the stop conditions, and `bound` (the ring or file size that holds it to its share
    of the disk budget, `budget.plan`)."""
    args = ["-Z", "none", "-n", "-w", f"{cap.dir}/{cap.id}.pcapng"]
    for interface in cap.interfaces:
        bpf = cap.applied_filter or cap.filter
        args += ["-i", interface, "-s", str(cap.snaplen), "-B", str(buffer_mb), *(["-f", bpf] if bpf else []),
                 *([] if promiscuous else ["-p"])]
    args += ["-a", f"duration:{max(1, round(cap.stop_on['duration_s']))}"]
    if "packets" in cap.stop_on:
        args += ["-c", str(cap.stop_on["packets"])]
    return [*args, *bound]


@tools.tool(
    "capture_status", title="A capture's counters and files",
    description="Packets, bytes, drops (kernel and interface, known at the end), files, running or stopped "
                "and why. wait_s waits for the end.",
    props={"capture_id": CAPTURE_ID_ARG,
           "wait_s": {"type": "number", "minimum": 0, "maximum": 120, "default": 0,
                      "description": "wait this long for the capture to end"}},
    required=("capture_id",), timeout_s=130,
)
async def capture_status(backend: CaptureBackend, ctx: CallContext, args: dict[str, Any]) -> StatusReply:
    cap = await backend.capture(args["capture_id"])
    with trio.move_on_after(args["wait_s"]):
        while cap.running:
            await cap.wait_changed()
    if cap.running:
        await trio.to_thread.run_sync(cap.refresh_files)
    return {**backend.describe(cap), "hint": PCAP_HINT}


@tools.tool(
    "stop_capture", title="Stop a live capture",
    description="Stop a running capture (its owner; force=true takes over another connected client's). "
                "Files and counters are kept.",
    props={"capture_id": CAPTURE_ID_ARG,
           "force": {"type": "boolean", "default": False, "description": "stop another's"}},
    required=("capture_id",), read_only=False, timeout_s=STOP_WAIT_MAX_S + 10,
)
async def stop_capture(backend: CaptureBackend, ctx: CallContext, args: dict[str, Any]) -> StopReply:
    cap = await backend.capture(args["capture_id"])
    actor = backend.running(cap.id)
    ref = backend.runtime.find(KIND, cap.id)
    if actor is None or ref is None or not cap.running:
        nothing: StopExtras = {}
        return {**backend.describe(cap), **nothing, "already_stopped": True}
    done = await backend.runtime.ask(ref, Stop(ctx.client, args["force"]), progress=ctx.progress)
    with trio.move_on_after(STOP_WAIT_MAX_S):
        while cap.running:
            await cap.wait_changed()
    extras: StopExtras = {"took_over_from": done["took_over_from"], "hint": PCAP_HINT}
    return {**backend.describe(cap), "already_stopped": False, **extras}


@tools.tool(
    "list_captures", title="List live captures",
    description="Captures oldest first (running and stored), with counters, files and the disk budget.",
    props={"status": {"type": "string", "enum": STATUSES, "description": "only these"},
           "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100, "description": "newest N"}},
)
async def list_captures(backend: CaptureBackend, ctx: CallContext, args: dict[str, Any]) -> CapturesReply:
    settings: CaptureSettings = backend.settings()
    captures = await backend.all()
    rows = [backend.describe(c) for c in captures if not args.get("status") or c.status == args["status"]]
    return {"captures": rows[-args["limit"]:], "total": len(rows), "running": sum(c.running for c in captures),
            "bytes_on_disk": await backend.bytes_on_disk(captures), "max_bytes": settings.max_bytes,
            "max_concurrent": settings.max_concurrent}
