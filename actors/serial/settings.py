"""The [serial] table, a port's line settings and states, and port names."""

from __future__ import annotations

import enum
import fnmatch
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from diagd.actors._paths import made_stem
from diagd.actors.runtime import BackendConfig
from diagd.actors.settings import parse_table, refuse, setting
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
    """The [serial] config table. baudrate, idle_ms and line_ending are the line settings of a port at
    open, unless a `[serial.ports."<port or glob>"]` table (the first that matches the port's name, in
    file order) says otherwise for that port, or configure_connection does."""

    allowed_ports: tuple[str, ...] = ()
    baudrate: int = setting(115200, positive=True)
    idle_ms: int = setting(50, positive=True)
    # AT modems end a command line with CR (V.250 S3); "none" would leave a command unsent.
    line_ending: str = setting("cr", choices=tuple(LINE_ENDINGS))
    ports: dict[str, Any] = field(default_factory=dict)  # port name or glob -> PortSettings keys
    max_reply_bytes: int = setting(4096, positive=True)
    urc_max_packets: int = setting(1000, positive=True)
    urc_max_bytes: int = setting(1 << 20, positive=True)
    write_timeout_ms: int = setting(5000, positive=True)
    log_max_bytes: int = setting(1 << 30, positive=True)
    log_keep: int = setting(20, positive=True)
    export_keep: int = setting(20, positive=True)  # newest export_serial_pcapng files kept in $state/serial/exports

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> SerialConfig:
        config = parse_table(cls, "serial", raw)
        for pattern, table in config.ports.items():
            port_table(pattern, table)  # refuses a wrong key or value now, not at the port's open
        return config

    def port_settings(self, key: str) -> PortSettings:
        """The line settings `key` opens with: the [serial] defaults, then its [serial.ports] table."""
        base = PortSettings(baudrate=self.baudrate, idle_ms=self.idle_ms, line_ending=self.line_ending)
        for pattern, table in self.ports.items():
            if fnmatch.fnmatchcase(key, port_key(pattern)):
                return replace(base, **port_table(pattern, table))
        return base


def port_table(pattern: str, table: Any) -> dict[str, Any]:
    """A `[serial.ports."<pattern>"]` table's settings, checked; DiagdError naming the table and key."""
    name = f'serial.ports."{pattern}"'
    if not isinstance(table, Mapping):
        raise refuse("serial", f'ports."{pattern}"', "must be a table of port settings, e.g. line_ending = \"crlf\"")
    parsed = parse_table(PortSettings, name, table)
    return {key: getattr(parsed, key) for key in table}


@dataclass(frozen=True)
class PortSettings:
    """One port's line settings (configure_connection's keys); the checks are those of a
    `[serial.ports."<port>"]` table, the tool's schema checks its arguments alike."""

    baudrate: int = setting(115200, minimum=50, maximum=16000000)
    bytesize: int = setting(8, choices=(5, 6, 7, 8))
    parity: str = setting("N", choices=("N", "E", "O", "M", "S"))
    stopbits: float = setting(1.0, choices=(1, 1.5, 2))
    rtscts: bool = False
    xonxoff: bool = False
    dsrdtr: bool = False
    idle_ms: int = setting(50, minimum=1, maximum=10000)
    line_ending: str = setting("cr", choices=tuple(LINE_ENDINGS))  # appended to utf8 payloads (send_data may override)

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


def check_reload(old: BackendConfig, new: BackendConfig) -> list[dict[str, Any]]:
    """`diagd reload`: refuse a broken [serial] table (the old config stays). What a change does not
    reach (open ports keep theirs) is in daemon/reload.py's notes."""
    SerialConfig.parse(new.table)
    return []
