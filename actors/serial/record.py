"""One open port's state, written by its actor, read by the tools (see `PortRecord`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from diagd.actors.serial.codec import iso
from diagd.actors.serial.port import BlockingRunner, Opener
from diagd.actors.serial.rawlog import RawLog
from diagd.actors.serial.replies import PortStatus
from diagd.actors.serial.settings import PortSettings, PortState, SerialConfig
from diagd.actors.serial.urc import UrcBuffer


@dataclass(eq=False)
class PortRecord:
    """One open port's state. It survives actor restarts, so a crash loses neither the URC buffer
    nor the owner.

    Single writer: only the port's actor changes it (the URC buffer, the owner, the raw log, the
    counters), in its own task; the tools change nothing here, they send the actor messages. The
    tools do read it, for status (describe, list_ports, lookups by device) and for a snapshot of the
    live log's index, so that status never waits in the inbox behind a long send_data.
    """

    key: str
    settings: PortSettings
    config: SerialConfig
    log_dir: Path
    opener: Opener
    run_blocking: BlockingRunner
    owner: str | None
    urc: UrcBuffer
    # Whether a client is still connected (the backend asks the runtime): a port whose owner has
    # gone passes silently to the next client.
    owner_connected: Callable[[str | None], bool]
    lines: dict[str, bool] = field(default_factory=dict)
    state: PortState = PortState.OPENING
    device: str | None = None
    log: RawLog | None = None
    log_path: Path | None = None
    opened_at: float | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    sessions: int = 0
    last_rx: float | None = None
    last_error: str | None = None

    def describe(self, viewer: str | None = None, *, owner_connected: bool = False) -> PortStatus:
        state = self.state
        if state == PortState.CONNECTED and viewer and self.owner not in (None, viewer) and owner_connected:
            state = PortState.OCCUPIED
        return {
            "port": self.key, "device": self.device, "state": state, "owner": self.owner,
            "you_own": viewer is not None and self.owner == viewer,
            "settings": asdict(self.settings),
            "opened_at": iso(self.opened_at), "last_rx_at": iso(self.last_rx),
            "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
            "pending_urc_count": len(self.urc), "urc_dropped": self.urc.dropped,
            "urc_dropped_total": self.urc.dropped_total,
            "log_file": str(self.log_path) if self.log_path else None,
            "log_records": self.log.records if self.log else None,
            "log_unlogged_bytes": self.log.unlogged_bytes if self.log else 0,
            "last_error": self.last_error,
        }
