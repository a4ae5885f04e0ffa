"""The `[capture]` config table: its keys and checks, which interfaces it allows, and dumpcap's confined
command lines; parsed on every tool call, so `diagd reload` applies to the next one.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagd.actors import sandbox, system
from diagd.actors._subprocess import Step
from diagd.actors.runtime import BackendConfig
from diagd.actors.settings import parse_table, setting
from diagd.protocol.errors import DiagdError, ErrorCode


@dataclass(frozen=True)
class CaptureSettings:
    path: str = "dumpcap"
    # Interface names or globs ("veth*") that may be captured; empty: capturing is off.
    allowed_interfaces: tuple[str, ...] = ()
    max_bytes: int = setting(1 << 30, positive=True)  # every capture's files together (the disk budget)
    max_concurrent: int = setting(4, positive=True)  # captures running at once
    max_duration_s: float = setting(3600.0, positive=True)  # a capture without a duration stops here
    max_snaplen: int = setting(262144, positive=True)
    # The kernel buffer per interface (dumpcap -B, MiB). dumpcap's default of 2 MiB holds ~60 ms of
    # 200k small packets a second: a moment without CPU (2 busy cores) and the kernel drops packets.
    buffer_mb: int = setting(16, positive=True)
    start_timeout_s: float = setting(10.0, positive=True)  # dumpcap must have its first file open by then
    stop_grace_s: float = setting(5.0, positive=True)  # SIGINT (dumpcap writes its statistics), then SIGKILL
    linger_s: float = setting(60.0, minimum=0)  # a finished capture's actor stays this long
    keep_captures: int = setting(100, positive=True)  # finished captures kept (then the oldest go)
    # Where dumpcap cannot run inside the sandbox (diagd not root: dumpcap's file capabilities need
    # exec without no_new_privs), capturing is refused unless this accepts running it unconfined.
    allow_unconfined: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> CaptureSettings:
        return parse_table(cls, "capture", raw)

    def allows(self, interface: str) -> bool:
        return any(fnmatch.fnmatchcase(interface, pattern) for pattern in self.allowed_interfaces)

    def check_allowed(self, interfaces: Sequence[str]) -> None:
        if not self.allowed_interfaces:
            raise DiagdError(ErrorCode.PERMISSION_DENIED, "live capture is off: [capture] allowed_interfaces is empty",
                             setting="[capture] allowed_interfaces",
                             hint='name the interfaces (globs) diagd may capture on, e.g. allowed_interfaces = '
                                  '["eth1", "veth*"], then diagd reload')
        refused = [i for i in interfaces if not self.allows(i)]
        if refused:
            raise DiagdError(ErrorCode.PERMISSION_DENIED, f"interface {refused[0]!r} is not in [capture] "
                             "allowed_interfaces", interfaces=refused, allowed=list(self.allowed_interfaces),
                             setting="[capture] allowed_interfaces")

    @property
    def confined(self) -> bool:
        return os.geteuid() == 0

    def command(self, args: Sequence[str], write_dir: Path | None = None) -> list[str]:
        """dumpcap with `args`, in the sandbox (root: only CAP_NET_RAW/NET_ADMIN kept, writes only
        `write_dir`, no exec after its own, packet/netlink/inet sockets only); unconfined only where
        allowed."""
        if not self.confined:
            if not self.allow_unconfined:
                raise DiagdError(ErrorCode.PERMISSION_DENIED, "live capture runs dumpcap in the sandbox, which "
                                 "needs diagd to run as root (dumpcap's own file capabilities do not survive "
                                 "no_new_privs)", setting="[capture] allow_unconfined",
                                 hint="run diagd as root, or set [capture] allow_unconfined = true to run "
                                      "dumpcap unconfined with its file capabilities")
            return [self.path, *args]
        try:
            return sandbox.wrap([self.path, *args], dumpcap_policy(write_dir))
        except FileNotFoundError:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"dumpcap not found: {self.path!r}",
                             fix=system.APT_HINT.format(pkg="wireshark-common")) from None

    def stop_steps(self) -> tuple[Step, Step]:
        """SIGINT (dumpcap closes its file with the interface statistics and reports its drops), SIGKILL."""
        return (Step("sigint", signal.SIGINT, self.stop_grace_s), Step("sigkill", signal.SIGKILL, 5.0))


# dumpcap captures as root with these only: raw packet sockets, and promiscuous mode / ring setup.
DUMPCAP_CAPS = ("net_raw", "net_admin")
# AF_PACKET to capture; AF_NETLINK and AF_INET/INET6 (ioctl sockets) to list interfaces and their addresses.
DUMPCAP_FAMILIES = (socket.AF_PACKET, socket.AF_NETLINK, socket.AF_INET, socket.AF_INET6)


def dumpcap_policy(write_dir: Path | None) -> sandbox.Policy:
    """dumpcap: reads the system and /sys, /proc (interface lists), writes only its capture's directory,
    runs nothing after its own execve (`exec_once`), no TCP bind/connect."""
    return sandbox.Policy(
        read=(*sandbox.SYSTEM_READ, "/sys", "/proc"),
        write=(str(write_dir),) if write_dir is not None else (),
        keep_caps=DUMPCAP_CAPS,
        socket_families=DUMPCAP_FAMILIES,
        landlock=sandbox.landlock_abi() > 0,
        exec_once=sandbox.seccomp_available(),
    )


def check_reload(old: BackendConfig, new: BackendConfig) -> list[dict[str, Any]]:
    """`diagd reload`: refuse a broken [capture] table (the old config stays); running captures keep theirs."""
    before, after = CaptureSettings.parse(old.table), CaptureSettings.parse(new.table)
    if bool(before.allowed_interfaces) != bool(after.allowed_interfaces):
        return [{"setting": "[capture] allowed_interfaces", "applies_to": "the next daemon start",
                 "why": "the capture tools are listed only when allowed_interfaces was set at start "
                        "(changing a non-empty list applies at once)"}]
    return []
