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
once the owner has disconnected (so successive `diagd call` commands work). The actor owns the
owner too: every tool that acts on a port (send_data, read_urc, set_signals, configure_connection)
is a message to the port's actor, which checks ownership and does it in inbox order, so such a
call waits behind a send_data still waiting for its reply on the same port. Status
(connection_status, list_ports, get_log) reads the port's record, which only the actor writes, and
never waits.

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
symlinks; empty = any serial line; a pseudo-terminal only when named there, and never one diagd
itself holds, such as a crash session's: access.py), baudrate, idle_ms, line_ending (default cr,
as AT modems expect), max_reply_bytes, urc_max_packets, urc_max_bytes, write_timeout_ms, log_max_bytes, log_keep,
export_keep, and per port `[serial.ports."<port or glob>"]` tables of line settings (baudrate,
bytesize, parity, stopbits, rtscts, xonxoff, dsrdtr, idle_ms, line_ending). Read when a port is
opened (reload applies to ports opened afterwards); a reload with an error in [serial] is refused.

The package: settings.py (the [serial] table, line settings, port names), port.py (pyserial on
Trio), codec.py (hex, escapes, slicer, reply matching), urc.py, rawlog.py, record.py (a port's
state), messages.py and actor.py (the port's actor), access.py (which ports may be opened),
backend.py (the open ports, hot-plug, probes), pcapng.py and export.py (a session's log as pcapng:
export_serial_pcapng), schemas.py and tools.py (the MCP tools).
"""

from __future__ import annotations

from diagd.actors.runtime import Deferred, Runtime
from diagd.actors.serial import timeline_source
from diagd.actors.serial.actor import KIND
from diagd.actors.serial.backend import SerialBackend
from diagd.actors.serial.settings import check_reload
from diagd.actors.serial.tools import tools
from diagd.actors.system import Needs, check_serial_access

# No Debian package: pyserial comes with diagd; the ports' group decides who may open them.
SYSTEM_NEEDS = Needs(modules=("serial",), checks=(check_serial_access,),
                     note="serial ports belong to the dialout group: sudo usermod -aG dialout $USER")


INSTRUCTIONS = """\
serial (modems, boards): list_ports, configure_connection(action=open) once, then send_data with
wait_policy=keyword and stop_pattern such as ["OK\\r\\n","ERROR\\r\\n"] (or timeout / none).
Unsolicited output waits in read_urc; get_log pages the raw Tx/Rx log (the source of truth);
set_signals resets boards; connection_status shows who holds a port. export_serial_pcapng turns a
session into a capture the pcap tools read.
"""

# What a reload leaves to a reopen: `PortRecord.config` is the config at open, the line settings too.
DEFERRED = (
    Deferred(("max_reply_bytes", "urc_max_packets", "urc_max_bytes", "write_timeout_ms", "log_max_bytes", "log_keep"),
             "ports opened after the reload (configure_connection action=close, then open)",
             "an open port keeps the [serial] limits it was opened with"),
    Deferred(("baudrate", "idle_ms", "line_ending", "ports"),
             "ports opened after the reload (or configure_connection with the new value)",
             "an open port keeps the line settings it was opened or configured with"),
)


def register(runtime: Runtime) -> SerialBackend:
    backend = SerialBackend(runtime)
    runtime.set_instructions(INSTRUCTIONS)
    runtime.add_timeline_source(timeline_source.SOURCE)
    runtime.share_exports()  # export_serial_pcapng writes captures the pcap tools read
    for deferred in DEFERRED:
        runtime.defer_on_reload(deferred)
    runtime.on_reload(check_reload)
    runtime.on_stop_request(KIND, backend.may_stop)
    tools.register(runtime, backend)
    return backend
