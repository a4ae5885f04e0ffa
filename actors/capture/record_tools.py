"""The recording tools: diagd_record_start and diagd_record_stop (recording.py does the work). Listed with
the capture tools (when [capture] allowed_interfaces is set); each part calls its own group's tools, which
`register` declares (recording.USES) so that the daemon checks them at start."""

from __future__ import annotations

from typing import Any

import trio

from diagd.actors.capture.backend import CaptureBackend
from diagd.actors.capture.recording import RECORDING_ID, USES, Recording, RecordingStore, not_found, start, stop
from diagd.actors.capture.replies import BundleReply, RecordingReply
from diagd.actors.runtime import Runtime
from diagd.actors.tooling import CallContext, ToolSet, current_groups

recording_tools: ToolSet[CaptureBackend] = ToolSet()


def register(runtime: Runtime, backend: CaptureBackend) -> None:
    """The recording tools, and the other groups' tools they call (Runtime.uses_tool: checked at start
    against those tools, and Runtime.call refuses one not declared)."""
    recording_tools.register(runtime, backend)
    for use in USES:
        runtime.uses_tool(use.group, use.tool, use.arguments, forwards=use.forwards)


def store_of(backend: CaptureBackend) -> RecordingStore:
    return RecordingStore(backend.store.root)


async def load_visible(backend: CaptureBackend, store: RecordingStore, recording_id: str, client: str) -> Recording:
    """The recording, if `client` (of the current call's tool groups) may see it (recording.py); else NOT_FOUND,
    as for an id never made."""
    rec: Recording = await trio.to_thread.run_sync(store.load, recording_id)
    if not rec.visible_to(client, current_groups.get(), backend.owner_connected(rec.owner)):
        raise not_found(recording_id)
    return rec


@recording_tools.tool(
    "diagd_record_start", title="Record a reproduction",
    description="Start together, under one recording_id: a live capture (start_capture's arguments), serial "
                "sessions on ports (configure_connection), a bpftrace program (exec_program). Each optional.",
    # Each part's arguments are checked by its own tool (Runtime.call validates them): not repeated here.
    props={"capture": {"type": "object", "description": "start_capture's arguments"},
           "serial_ports": {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 8,
                            "description": "ports to record"},
           "serial_settings": {"type": "object", "description": "configure_connection's, for each port"},
           "bpftrace": {"type": "object", "description": "exec_program's arguments"}},
    read_only=False, idempotent=False, timeout_s=240,
)
async def record_start(backend: CaptureBackend, ctx: CallContext, args: dict[str, Any]) -> RecordingReply:
    rec = await start(backend.runtime.call, store_of(backend), ctx.client, args,
                      keep=backend.settings().keep_captures, groups=current_groups.get())
    return {**rec.summary(), "hint": "reproduce now; diagd_record_stop returns the bundle"}


@recording_tools.tool(
    "diagd_record_stop", title="Stop a recording: its bundle",
    description="Stop a recording's parts; the bundle: the capture (pcap_path capture:<recording_id>), each "
                "serial session as pcapng, the bpftrace output, and their merged timeline.",
    props={"recording_id": {"type": "string", "pattern": RECORDING_ID.pattern, "description": "its start's"},
           "timeline_rows": {"type": "integer", "minimum": 0, "maximum": 2000, "default": 100,
                             "description": "merged rows in the answer (bundle.json keeps more)"}},
    required=("recording_id",), read_only=False, timeout_s=400,
)
async def record_stop(backend: CaptureBackend, ctx: CallContext, args: dict[str, Any]) -> BundleReply:
    store = store_of(backend)
    rid = args["recording_id"]
    # Only a client that may see it (its owner; once the owner has gone, a client of the same user), of the groups
    # its parts are read with: anyone else is told there is no such recording (and no lock is made for it).
    await load_visible(backend, store, rid, ctx.client)
    stops = backend.recording_stops
    async with stops.setdefault(rid, trio.Lock()):
        rec = await load_visible(backend, store, rid, ctx.client)  # as it is now (a stop may have just ended)
        if rec.bundle is not None:
            return {**rec.bundle, "already_stopped": True}
        bundle = await stop(backend.runtime.call, store, rec, args["timeline_rows"])
    stops.pop(rid, None)
    return {**bundle, "already_stopped": False}
