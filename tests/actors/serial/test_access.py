"""Which ports may be opened (actors/serial/access.py), on real device files and processes: a pty
slave is told by its name or its device number, opens only when [serial] allowed_ports names it
(links resolved), and never when diagd (this process and its descendants) holds it; real serial
lines keep the old rule (an empty allow-list means any)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from diagd.actors.serial.access import PortAccess, PtyId, held_ptys, is_pty_slave, pty_id
from diagd.protocol.errors import DiagdError, ErrorCode


def nothing_held() -> set[PtyId]:
    return set()


def char_device(major: int, minor: int) -> os.stat_result:
    return os.stat_result((0o020600, 1, 1, 1, 0, 0, 0, 0, 0, 0), {"st_rdev": os.makedev(major, minor)})


def refusal(access: PortAccess, port: str) -> DiagdError:
    found = access.refusal(port)
    assert found is not None, port
    assert found.code == ErrorCode.PERMISSION_DENIED
    return found


def test_a_pty_slave_is_told_by_its_name_or_its_device_number() -> None:
    for name in ("/dev/pts/3", "/dev/pts/1048575", "/dev/ttyp0", "/dev/ttyef", "/dev/pts//7"):
        assert is_pty_slave([name], None), name
    for name in ("/dev/ttyS0", "/dev/ttyUSB0", "/dev/ttyACM0", "/dev/ttyAMA0", "/dev/ttyprintk", "/dev/ttyp",
                 "/dev/ptmx", "/dev/pts/ptmx", "/tmp/dev/pts/3", "/dev/serial/by-id/usb-modem"):
        assert not is_pty_slave([name], None), name
    for major in (*range(136, 144), 3):  # Unix98 slaves, legacy BSD slaves: whatever the name
        assert is_pty_slave(["/dev/ttyUSB7"], char_device(major, 4)), major
    for major, minor in ((4, 64), (188, 0), (166, 0), (5, 2), (128, 3), (2, 0), (1, 3)):  # ttyS, ttyUSB, ttyACM,
        assert not is_pty_slave(["/dev/ttyUSB7"], char_device(major, minor)), (major, minor)  # ptmx, masters, null


def test_with_the_shipped_config_a_pty_is_refused_and_a_real_serial_line_is_not(pty_slave: str) -> None:
    shipped = PortAccess((), nothing_held)
    refused = refusal(shipped, pty_slave)
    assert refused.details["reason"] == "pty_not_allowed" and refused.details["device"] == pty_slave
    assert "[serial] allowed_ports" in refused.details["hint"] and "pseudo-terminal" in refused.message
    for port in ("/dev/ttyS0", "/dev/ttyUSB0", "/dev/ttyACM0"):  # real serial lines, there or not: any
        assert shipped.refusal(port) is None, port


def test_a_pty_named_by_a_glob_or_a_link_opens_and_a_link_is_judged_by_its_target(pty_slave: str,
                                                                                  tmp_path: Path) -> None:
    disguised = tmp_path / "ttyUSB0"  # a serial port's name in front of a pty
    disguised.symlink_to(pty_slave)
    assert refusal(PortAccess((), nothing_held), str(disguised)).details["device"] == pty_slave
    assert refusal(PortAccess((str(tmp_path / "other*"),), nothing_held), str(disguised)).details["reason"] == \
        "pty_not_allowed"
    for allowed in (["/dev/pts/*"], [pty_slave], [str(tmp_path / "tty*")], [str(disguised)]):
        access = PortAccess(tuple(allowed), nothing_held)
        assert access.refusal(str(disguised)) is None and access.refusal(pty_slave) is None, allowed
    real_line = PortAccess((str(tmp_path / "tty*"),), nothing_held)
    assert refusal(real_line, "/dev/ttyS0").details["allowed_ports"] == [str(tmp_path / "tty*")]  # as before


def test_a_node_of_a_pty_major_is_a_pty_whatever_its_name(tmp_path: Path) -> None:
    node = tmp_path / "ttyUSB7"
    try:
        os.mknod(node, 0o600 | 0o020000, os.makedev(137, 4))  # S_IFCHR, a Unix98 slave's number
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    assert refusal(PortAccess((), nothing_held), str(node)).details["reason"] == "pty_not_allowed"


def test_a_pty_diagd_holds_is_refused_even_when_allowed_ports_names_it(pty_slave: str, tmp_path: Path) -> None:
    link = tmp_path / "modem"
    link.symlink_to(pty_slave)
    held = pty_id(os.stat(pty_slave))
    access = PortAccess(("/dev/pts/*", str(link)), lambda: {held})
    for port in (pty_slave, str(link)):
        refused = refusal(access, port)
        assert refused.details["reason"] == "daemon_pty" and refused.details["device"] == pty_slave
        assert "allowed_ports" not in refused.details["hint"]  # nothing to add: never opened
    # ...unless it is held because this back end has it open as a port (configure_connection again).
    assert PortAccess(("/dev/pts/*",), lambda: {held}, own=(pty_slave,)).refusal(str(link)) is None


def test_the_scan_finds_a_pty_by_its_master_alone_and_one_only_a_descendant_holds() -> None:
    master, slave = os.openpty()
    name = os.ttyname(slave)
    os.close(slave)  # what pexpect leaves in the daemon for crash: the master only (the slave is crash's)
    try:
        assert pty_id(os.stat(name)) in held_ptys()
    finally:
        os.close(master)
    grandchild = ("import os, sys\n"
                  "r, w = os.pipe()\n"
                  "if os.fork() == 0:\n"
                  "    m, s = os.openpty(); os.write(w, os.ttyname(s).encode() + b'\\n')\n"
                  "    sys.stdin.read(); os._exit(0)\n"
                  "os.close(w); print(os.read(r, 100).decode().strip(), flush=True); os.wait()\n")
    with held_by(grandchild) as name:
        assert pty_id(os.stat(name)) in held_ptys()


def test_the_scan_leaves_out_a_pty_of_a_process_that_is_no_descendant() -> None:
    orphan = ("import os, sys\n"
              "r, w = os.pipe()\n"
              "if os.fork() == 0:\n"
              "    if os.fork() == 0:\n"
              "        m, s = os.openpty(); os.write(w, os.ttyname(s).encode() + b'\\n'); sys.stdin.read()\n"
              "    os._exit(0)\n"
              "os.close(w); os.wait(); print(os.read(r, 100).decode().strip(), flush=True)\n")
    with held_by(orphan, wait=True) as name:
        assert pty_id(os.stat(name)) not in held_ptys()


@contextmanager
def held_by(script: str, *, wait: bool = False) -> Iterator[str]:
    """Run `script`, which prints the /dev/pts path of a pty some process it started holds until
    stdin closes; `wait`: until the script itself has exited (its orphan is no longer ours)."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        name = proc.stdout.readline().strip()
        assert name.startswith("/dev/pts/"), name
        if wait:
            proc.wait(timeout=10)
        yield name
    finally:
        proc.stdin.close()
        proc.stdout.close()
        proc.wait(timeout=10)
