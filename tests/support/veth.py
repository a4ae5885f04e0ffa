"""A veth pair for the live-capture tests: the sending end in a network namespace of the test's own,
real captures replayed into it with tcpreplay, the other end captured by diagd; and the frames of a
capture file as (length, sha256) to compare what was captured with what was sent."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import struct
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, Env, start_daemon

REPLAY_PPS = 500  # well below what the veth pair and dumpcap take without a drop on a 2-vCPU VM


@dataclass(frozen=True)
class Veth:
    capture: str  # the end diagd captures on (in the daemon's namespace)
    netns: str  # the namespace holding the sending end
    send: str

    def replay(self, capture: str, pps: int = REPLAY_PPS) -> None:
        done = subprocess.run(["ip", "netns", "exec", self.netns, "tcpreplay", "-q", f"--pps={pps}", "-i", self.send,
                               capture], capture_output=True, text=True, check=True)
        assert "Failed packets:            0" in done.stdout, done.stdout


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextmanager
def veth_pair() -> Iterator[Veth]:
    if os.geteuid() != 0:
        pytest.skip("live capture tests need root (network namespaces, veth links, dumpcap in the sandbox)")
    for tool in ("ip", "tcpreplay", "dumpcap", "editcap"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup.sh test installs tcpreplay)")
    tag = secrets.token_hex(3)
    pair = Veth(capture=f"dgc{tag}", netns=f"diagd-cap-{tag}", send=f"dgs{tag}")
    _ip("netns", "add", pair.netns)
    try:
        _ip("link", "add", pair.capture, "mtu", "9000", "type", "veth", "peer", "name", pair.send, "mtu", "9000",
            "netns", pair.netns)
        # No IPv6 on either end: the kernel would send its own router and neighbour solicitations.
        for ns, dev in ((None, pair.capture), (pair.netns, pair.send)):
            prefix = ["ip", "netns", "exec", ns] if ns else []
            subprocess.run([*prefix, "sysctl", "-qw", f"net.ipv6.conf.{dev}.disable_ipv6=1"], check=True)
        _ip("link", "set", pair.capture, "up")
        _ip("-n", pair.netns, "link", "set", pair.send, "up")
        yield pair
    finally:
        subprocess.run(["ip", "link", "del", pair.capture], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", pair.netns], capture_output=True, check=False)


def start_capture_daemon(env: Env, veth: Veth, extra: str = "") -> DaemonProcess:
    """A daemon that may capture on the pair's end (`extra`: more lines of its [capture] table)."""
    env.write_config(env.config.read_text() + f'\n[capture]\nallowed_interfaces = ["{veth.capture}"]\n{extra}')
    return start_daemon(env)


def frames(path: str | Path, tmp: Path) -> list[tuple[int, str]]:
    """(original length, sha256 of the bytes) of every frame, read from the file as classic pcap."""
    classic = tmp / f"{secrets.token_hex(4)}.pcap"
    subprocess.run(["editcap", "-F", "pcap", str(path), str(classic)], check=True, capture_output=True)
    data = classic.read_bytes()
    order = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    out, offset = [], 24
    while offset + 16 <= len(data):
        _sec, _frac, incl, orig = struct.unpack(order + "IIII", data[offset:offset + 16])
        out.append((orig, hashlib.sha256(data[offset + 16:offset + 16 + incl]).hexdigest()))
        offset += 16 + incl
    return out


def bytes_under(folder: Path) -> int:
    """Bytes of every regular file under `folder`, as the disk holds them (a file going while it is read,
    as a ring drops its oldest, counts nothing)."""
    total = 0
    for d, _, names in os.walk(folder):
        for name in names:
            try:
                total += (Path(d) / name).stat().st_size
            except OSError:
                pass
    return total
