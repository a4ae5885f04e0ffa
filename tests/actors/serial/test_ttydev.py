"""A device is known to be a serial line before anything opens it (actors/serial/ttydev.py), on real
device files: a pty slave is, /dev/null, /dev/zero, a regular file, a link to /dev/null, /dev/ptmx and
/dev/tty are not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from diagd.actors.serial import ttydev
from diagd.protocol.errors import DiagdError, ErrorCode

SAMPLE = """\
/dev/tty             /dev/tty        5       0 system:/dev/tty
/dev/ptmx            /dev/ptmx       5       2 system
usbserial            /dev/ttyUSB   188 0-511 serial
serial               /dev/ttyS       4 64-111 serial
pty_slave            /dev/pts      136 0-1048575 pty:slave
pty_master           /dev/ptm      128 0-1048575 pty:master
unknown              /dev/tty        4 1-63 console
"""


def test_the_drivers_table_is_parsed_and_only_serial_and_pty_slave_drivers_count() -> None:
    drivers = ttydev.parse_drivers(SAMPLE)
    assert [d.name for d in drivers][:3] == ["/dev/tty", "/dev/ptmx", "usbserial"]
    assert ttydev.serial_driver(os.makedev(188, 511), drivers).name == "usbserial"  # type: ignore[union-attr]
    assert ttydev.serial_driver(os.makedev(4, 64), drivers).name == "serial"  # type: ignore[union-attr]
    assert ttydev.serial_driver(os.makedev(136, 7), drivers).name == "pty_slave"  # type: ignore[union-attr]
    for major, minor in ((4, 1), (5, 0), (5, 2), (128, 3), (188, 512), (1, 3)):  # console, tty, ptmx, master
        assert ttydev.serial_driver(os.makedev(major, minor), drivers) is None, (major, minor)


def test_a_pty_slave_and_a_link_to_it_are_held_as_the_same_device(pty_slave: str, tmp_path: Path) -> None:
    link = tmp_path / "modem"
    link.symlink_to(pty_slave)  # socat's `link=` and /dev/serial/by-id are links
    for path in (pty_slave, str(link)):
        fd = ttydev.hold_terminal(path)
        try:
            assert os.fstat(fd).st_rdev == os.stat(pty_slave).st_rdev
        finally:
            os.close(fd)


def refused(device: str) -> DiagdError:
    with pytest.raises(DiagdError) as info:
        os.close(ttydev.hold_terminal(device))
    return info.value


@pytest.mark.parametrize("device", ["/dev/null", "/dev/zero", "/dev/ptmx", "/dev/tty"])
def test_character_devices_that_are_no_serial_line_are_refused(device: str) -> None:
    error = refused(device)
    assert error.code == ErrorCode.INVALID_ARGUMENT and error.details["reason"] == "not_a_terminal", error.details
    assert "device_number" in error.details


def test_a_regular_file_a_link_to_dev_null_and_a_missing_path_are_refused(tmp_path: Path) -> None:
    regular = tmp_path / "file"
    regular.write_bytes(b"AT\r\n")
    assert refused(str(regular)).details["reason"] == "not_a_terminal"
    link = tmp_path / "ttyUSB0"
    link.symlink_to("/dev/null")
    error = refused(str(link))
    assert error.details["reason"] == "not_a_terminal" and error.details["device_number"] == "1:3"
    assert refused(str(tmp_path / "gone")).code == ErrorCode.NOT_FOUND
