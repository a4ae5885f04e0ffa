"""The [serial] table, a port's line settings and states, and port names."""

from __future__ import annotations

import enum
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from diagd.actors._paths import made_stem
from diagd.actors.settings import parse_table, setting
from diagd.protocol.errors import DiagdError, ErrorCode

# -- settings, names and tool schemas (pure data) ----------------------------------------------

LINE_ENDINGS = {"none": b"", "cr": b"\r", "lf": b"\n", "crlf": b"\r\n"}
SETTING_KEYS = ("baudrate", "bytesize", "parity", "stopbits", "rtscts", "xonxoff", "dsrdtr", "idle_ms", "line_ending")


class PortState(enum.StrEnum):
    OPENING = "Opening"
    CONNECTED = "Connected"
    DISCONNECTED = "Disconnected"
    OCCUPIED = "Occupied"
    CLOSED = "Closed"


@dataclass(frozen=True)
class SerialConfig:
    """The [serial] config table."""

    allowed_ports: tuple[str, ...] = ()
    baudrate: int = setting(115200, positive=True)
    idle_ms: int = setting(50, positive=True)
    max_reply_bytes: int = setting(4096, positive=True)
    urc_max_packets: int = setting(1000, positive=True)
    urc_max_bytes: int = setting(1 << 20, positive=True)
    write_timeout_ms: int = setting(5000, positive=True)
    log_max_bytes: int = setting(1 << 30, positive=True)
    log_keep: int = setting(20, positive=True)
    export_keep: int = setting(20, positive=True)  # newest export_serial_pcapng files kept in $state/serial/exports

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> SerialConfig:
        return parse_table(cls, "serial", raw)


@dataclass(frozen=True)
class PortSettings:
    baudrate: int = 115200
    bytesize: int = 8
    parity: str = "N"
    stopbits: float = 1
    rtscts: bool = False
    xonxoff: bool = False
    dsrdtr: bool = False
    idle_ms: int = 50
    line_ending: str = "none"  # appended to utf8 payloads unless send_data says otherwise

    def pyserial(self) -> dict[str, Any]:
        return {"baudrate": self.baudrate, "bytesize": self.bytesize, "parity": self.parity,
                "stopbits": self.stopbits, "rtscts": self.rtscts, "xonxoff": self.xonxoff, "dsrdtr": self.dsrdtr}


def port_key(raw: str) -> str:
    """The name a port is known by: as given (links kept), `ttyUSB0` meaning `/dev/ttyUSB0`."""
    raw = raw.strip()
    if not raw or "\0" in raw:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "port is empty or contains NUL", argument="port")
    return posixpath.normpath(raw if raw.startswith("/") else f"/dev/{raw}")


def port_slug(key: str) -> str:
    """A port's name as the start of its file names (raw logs, exports): diagd's safe alphabet only."""
    return made_stem(key.strip("/").replace("/", "_")) if key.strip("/") else "port"
