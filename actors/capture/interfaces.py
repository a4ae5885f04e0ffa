"""The interfaces dumpcap can capture on: its machine-readable lists (`-D -M`, `-L -M`) parsed, with
the kernel's up/down state from /sys and whether this config allows each one."""

from __future__ import annotations

import os
from pathlib import Path

from diagd.actors.capture.replies import KernelState, LinkType, ListedInterface

IFF_UP = 0x1
_TYPES = {"0": "wired", "1": "airpcap", "2": "pipe", "3": "stdin", "4": "bluetooth", "5": "wireless",
          "6": "dialup", "7": "usb", "8": "extcap", "9": "virtual"}


def parse_list(text: str) -> list[ListedInterface]:
    """`dumpcap -D -M`: "<n>. <name>\\t<vendor>\\t<friendly name>\\t<type>\\t<addresses>\\t<loopback|network>"."""
    found: list[ListedInterface] = []
    for line in text.splitlines():
        number, dot, rest = line.partition(". ")
        if not dot or not number.strip().isdigit():
            continue
        cols = rest.split("\t") + [""] * 6
        found.append({"name": cols[0], "description": cols[2] or cols[1] or "",
                      "type": _TYPES.get(cols[3], cols[3] or "unknown"),
                      "addresses": [a for a in cols[4].split(",") if a],
                      "loopback": cols[5] == "loopback"})
    return found


def parse_link_types(text: str) -> tuple[bool, list[LinkType]]:
    """`dumpcap -L -M -i <if>`: first line 1 when monitor mode is possible, then "<dlt>\\t<name>\\t<description>"."""
    lines = text.splitlines()
    types: list[LinkType] = []
    for line in lines[1:]:
        cols = line.split("\t")
        if len(cols) >= 2 and cols[0].strip().lstrip("-").isdigit():
            types.append({"dlt": int(cols[0]), "name": cols[1], "description": cols[2] if len(cols) > 2 else ""})
    return bool(lines and lines[0].strip() == "1"), types


def kernel_state(name: str, sys_class_net: Path = Path("/sys/class/net")) -> KernelState:
    """Up (administratively), running (carrier: a link) and operstate, for a kernel network interface; None
    values for the pseudo-interfaces (any, nflog, dbus, ...), which /sys does not list."""
    base = sys_class_net / name
    if "/" in name or name in ("", ".", "..") or not base.is_dir():
        return {"up": None, "running": None, "operstate": None}
    try:
        flags = int((base / "flags").read_text().strip(), 16)
        operstate = (base / "operstate").read_text().strip()
    except (OSError, ValueError):
        return {"up": None, "running": None, "operstate": None}
    try:
        carrier = (base / "carrier").read_text().strip() == "1"
    except OSError:  # EINVAL while the interface is down
        carrier = False
    return {"up": bool(flags & IFF_UP), "running": carrier, "operstate": operstate}


def exists(name: str) -> bool:
    """A kernel interface of that whole name ("", "." and ".." name /sys/class/net itself or its parent)."""
    return os.path.isdir(f"/sys/class/net/{name}") if "/" not in name and name not in ("", ".", "..") else False
