"""Serial ports: one actor per open port, the Serial-Agent-MCP tools, and a raw Tx/Rx log.

The tool is a stateless executor: it never interprets what a device says; the agent decides what
to send and how to wait. The daemon owns each open port until it is closed, so nothing the device
says is missed between calls, even with no agent connected.

Per open port, the actor owns the pyserial port (opened `exclusive=True`: a port another program
has flock-ed is "Occupied"), a reader task on the port's fd (`wait_readable` + non-blocking
`os.read`, never a blocking call on the Trio loop), an idle slicer on the Trio clock, the URC
buffer and the raw log. Bytes that arrive while a `send_data` call waits belong to that call's
reply; all others are cut into packets at idle gaps (`idle_ms`, restarted on every read) and go
to the URC buffer (bounded; overflow drops the oldest packets and counts them).

States: Connected; Disconnected (the device went away: hang-up or I/O error; the next call says
so, `configure_connection(action=open)` reopens it when it is back); Occupied (held by another
connected diagd client, or locked/held by another program); Closed (not open in diagd).
A port belongs to the diagd client that opened it; another client gets BUSY while the owner is
still connected (`force=true` on `configure_connection` takes it over) and takes it over silently
once the owner has disconnected (so successive `diagd call` commands work).

Raw log: one file per port session, `<state_dir>/serial/<port-slug>-<UTC time>.jsonl`, the
source of truth. One JSON object per line, in order of occurrence:
    {"ts": 1718000000.123456, "dir": "tx"|"rx", "hex": "41540D"}      bytes written / read
    {"ts": ..., "dir": "event", "event": "session", "port": ..., "device": ..., "settings": {...}}
    {"ts": ..., "dir": "event", "event": "settings"|"signals"|"owner"|"disconnected"|"log_limit"|"closed", ...}
`ts` is wall-clock Unix time of the write or read (microseconds); `hex` is uppercase without
spaces; record 0 is the session header. `get_log` pages it by record index. A session stops
logging data past [serial] log_max_bytes (recorded as a "log_limit" event, counted in
connection_status); the newest [serial] log_keep sessions per port are kept.

Config ([serial], all optional): allowed_ports (paths or globs, compared after resolving
symlinks; empty = any), baudrate, idle_ms, max_reply_bytes, urc_max_packets, urc_max_bytes,
write_timeout_ms, log_max_bytes, log_keep. Read when a port is opened (reload applies to ports
opened afterwards).
"""

from __future__ import annotations

from diagd.actors.runtime import Runtime
from diagd.actors.serial.backend import SerialBackend
from diagd.actors.serial.tools import tools


def register(runtime: Runtime) -> SerialBackend:
    backend = SerialBackend(runtime)
    tools.register(runtime, backend)
    return backend
