"""Live capture: one actor per capture, owning its dumpcap process, its ring of pcapng files and its
counters, analysable by the pcap tools while it grows.

`start_capture` checks the interfaces against `[capture] allowed_interfaces` (globs; empty: capture
is off), compiles the BPF capture filter for each interface with `dumpcap -d` (a bad one is
INVALID_FILTER with dumpcap's message, before anything starts), makes room in the disk budget, and
starts an actor (kind "capture", resource = capture id) whose `start()` returns once dumpcap has
opened its first file. dumpcap runs in child mode (`-Z none`): its messages on stderr name each new
file of the ring and the packets written (after a flush, so the file is whole up to there), and at the
end the drops per interface; the interface statistics blocks of the last file give the interface's
own counts. Stop conditions: duration and packets are dumpcap's (`-a duration`, `-c`), bytes the
actor's (it measures the files every 0.5 s). Stopping is SIGINT (dumpcap closes the file with its
statistics), then SIGKILL.

A capture belongs to the client that started it; it outlives that client. Another client gets BUSY
from stop_capture (and diagd_stop_actor) while the owner is connected, unless force=true; once the
owner has gone any client may stop it (so successive `diagd call` commands work). Records are
`<state>/capture/captures/<id>.json`, the files `<state>/capture/exports/<id>/`: the capture group's
exports dir, which the pcap tools read for a client that selected the capture group too. After a
daemon restart a capture that was running is `interrupted` (its files and counters stay, dumpcap
died with the daemon through the sandbox's death link).

Confinement (root): dumpcap runs in the sandbox: CAP_NET_RAW and CAP_NET_ADMIN only, writes only its
capture's directory (Landlock), no execve after its own, sockets of the packet, netlink and inet
families only. Not root: refused unless [capture] allow_unconfined (dumpcap's file capabilities
need an exec that no_new_privs forbids). The disk budget (`max_bytes` over every capture's files and views):
the oldest finished captures' files are removed first; when the running ones alone exceed it they
are stopped with stop_reason "disk_budget".

`capture:<id>` names a capture as one file for the pcap tools and diagd_timeline (views.py: the packets
written so far while it runs). A recording (diagd_record_start/stop) runs a capture, serial sessions
and a bpftrace program together and bundles them, through the other groups' tools (Runtime.call).

The package: settings.py (the [capture] table, the sandbox policy), childmode.py (dumpcap's messages,
pcapng statistics), interfaces.py, record.py (a capture's record and the store), messages.py and
actor.py (a capture's actor), backend.py (captures, owners, budget, short dumpcap commands),
schemas.py and tools.py (the MCP tools), views.py (`capture:<id>`), recording.py and record_tools.py
(recorded reproductions).
"""

from __future__ import annotations

from diagd.actors.capture import record_tools
from diagd.actors.capture.actor import KIND
from diagd.actors.capture.backend import CaptureBackend
from diagd.actors.capture.settings import check_reload
from diagd.actors.capture.tools import tools
from diagd.actors.capture.views import Views
from diagd.actors.runtime import Deferred, Runtime
from diagd.actors.system import Needs, Tool

__all__ = ["DEFERRED", "INSTRUCTIONS", "OFF_HINT", "OFF_REASON", "SYSTEM_NEEDS", "register"]

# dumpcap comes with Wireshark's common files; tcpreplay is the test suite's traffic source.
SYSTEM_NEEDS = Needs(tools=(Tool("dumpcap", ("--version",), "wireshark-common"),),
                     note="live capture runs dumpcap as root inside diagd's sandbox; it is off until "
                          "[capture] allowed_interfaces names interfaces")


INSTRUCTIONS = """\
live capture (dumpcap): list_interfaces (allowed ones per [capture] allowed_interfaces), start_capture
with a BPF filter and a ring buffer (returns a capture_id at once; a bad filter fails at once),
capture_status (packets, drops, files), stop_capture, list_captures. pcap_path "capture:<id>" reads a
capture with every pcap tool and diagd_timeline ({"pcap": "capture:<id>"}): while it runs, the packets
written so far (source.live says up to which frame and time); once ended, its whole ring as one file.
diagd_record_start starts a capture, serial sessions and a bpftrace program under one recording_id;
diagd_record_stop returns the bundle (pcapng, serial pcapng, bpftrace output, merged timeline).
"""

# Why the group serves nothing, and what turns it on: the tools are listed from the next start only.
OFF_REASON = "live capture is off: [capture] allowed_interfaces is empty"
OFF_HINT = ('add allowed_interfaces = ["eth1", "veth*"] (the interfaces diagd may capture on, globs) under '
            '[capture] in config.toml, then `diagd restart` (a reload does not list the tools; docs/capture.md)')

# What a reload leaves to a restart of the capture: a running one keeps its dumpcap command line.
DEFERRED = (
    Deferred(("path", "max_snaplen", "buffer_mb", "start_timeout_s", "stop_grace_s", "linger_s", "allow_unconfined"),
             "captures started after the reload",
             "a running capture keeps the dumpcap command line and stop steps of its start_capture"),
)


def register(runtime: Runtime) -> CaptureBackend:
    backend = CaptureBackend(runtime)
    runtime.share_exports()  # its capture files are read by the pcap tools
    # pcap_path "capture:<id>": the packets written so far, as one file
    runtime.add_reference(Views(backend, record_tools.store_of(backend)).resolve)
    for deferred in DEFERRED:
        runtime.defer_on_reload(deferred)
    runtime.on_reload(check_reload)  # a broken [capture] table is refused at start and by `diagd reload`
    runtime.on_stop_request(KIND, backend.may_stop)
    backend.recover()
    # Off until [capture] allowed_interfaces names interfaces: then its tools are not listed either (five
    # tools that could only refuse would cost every client's tools/list ~3.7 KB). As crash's script
    # tools, they appear with the setting at the next start; the reload answer says so.
    if backend.settings().allowed_interfaces:
        runtime.set_instructions(INSTRUCTIONS)  # the paragraph names the tools: only with them
        tools.register(runtime, backend)
        record_tools.register(runtime, backend)  # and the other groups' tools a recording calls
    else:  # `diagd tools` says so, and `diagd client add --tools capture` is refused with this
        runtime.declare_off(OFF_REASON, OFF_HINT)
    return backend
