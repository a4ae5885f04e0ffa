"""Issue 20 item 7: with `allowed_ports = []` (the default: any port) the daemon opened any character
device before finding it was no terminal (opening /dev/watchdog would arm it). Now a device is known
to be a serial line before anything opens it: the open itself is watched with inotify on a device
node of our own (a copy of /dev/null made with mknod), which sees every open(2) but not O_PATH.
A pty slave is a terminal too, but some program's: it opens only when [serial] allowed_ports names it.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, Env, start_daemon
from tests.fault.helpers import ControlClient

pytestmark = [pytest.mark.e2e, pytest.mark.fault]

IN_OPEN = 0x20


class OpenWatch:
    """inotify IN_OPEN on one path: whether anything opened it since the last look."""

    def __init__(self, path: Path) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0 and self._libc.inotify_add_watch(self.fd, str(path).encode(), IN_OPEN) >= 0

    def opened(self) -> bool:
        try:
            return bool(os.read(self.fd, 4096))
        except BlockingIOError:
            return False

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def default_daemon(env: Env) -> Iterator[DaemonProcess]:
    """[serial] as shipped: allowed_ports = [] (any port)."""
    daemon = start_daemon(env)
    yield daemon
    daemon.stop()


def configure(daemon: DaemonProcess, port: str) -> tuple[bool, dict[str, Any]]:
    """(is_error, payload) of configure_connection on `port`."""
    with ControlClient(daemon.control_socket) as c:
        return c.call("configure_connection", {"port": port})


def assert_not_a_terminal(answer: tuple[bool, dict[str, Any]]) -> None:
    is_error, payload = answer
    assert is_error, payload
    assert payload["code"] == "INVALID_ARGUMENT" and payload["details"]["reason"] == "not_a_terminal", payload


@pytest.fixture
def device_copy(tmp_path: Path) -> Path:
    node = tmp_path / "ttyUSB9"
    try:
        os.mknod(node, 0o600 | 0o020000, os.makedev(1, 3))  # S_IFCHR: the null device, under a port's name
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    return node


def test_a_character_device_that_is_no_terminal_is_refused_without_being_opened(
        default_daemon: DaemonProcess, device_copy: Path) -> None:
    watch = OpenWatch(device_copy)
    try:
        assert_not_a_terminal(configure(default_daemon, str(device_copy)))
        assert not watch.opened(), "the daemon opened the device before knowing it is no terminal"
        os.close(os.open(device_copy, os.O_RDONLY))
        assert watch.opened()  # the watch does see an open
    finally:
        watch.close()


@pytest.mark.parametrize("target", ["/dev/null", "/dev/zero", "/dev/ptmx", "regular", "link"])
def test_what_is_no_serial_line_is_refused_with_a_coded_error(default_daemon: DaemonProcess, tmp_path: Path,
                                                               target: str) -> None:
    if target == "regular":
        (tmp_path / "regular").write_bytes(b"AT\r\n")
        target = str(tmp_path / "regular")
    elif target == "link":
        (tmp_path / "ttyACM0").symlink_to("/dev/null")
        target = str(tmp_path / "ttyACM0")
    assert_not_a_terminal(configure(default_daemon, target))


def test_a_pty_slave_still_opens_once_allowed_ports_names_it(env: Env) -> None:
    master, slave = os.openpty()
    try:
        pty = os.ttyname(slave)
        env.write_config(env.config.read_text() + f'\n[serial]\nallowed_ports = ["{pty}"]\n')  # a pty: named
        daemon = start_daemon(env)
        try:
            is_error, payload = configure(daemon, pty)
            assert not is_error and payload["state"] == "Connected", payload
        finally:
            daemon.stop()
    finally:
        os.close(slave)
        os.close(master)


def test_a_pty_slave_allowed_ports_does_not_name_is_refused_without_being_opened(default_daemon: DaemonProcess,
                                                                                 tmp_path: Path) -> None:
    master, slave = os.openpty()
    try:
        pty = os.ttyname(slave)
        watch = OpenWatch(Path(pty))
        try:
            for port in (pty, str(tmp_path / "ttyUSB0")):
                if port != pty:
                    os.symlink(pty, port)  # a serial port's name in front of it changes nothing
                is_error, payload = configure(default_daemon, port)
                assert is_error and payload["code"] == "PERMISSION_DENIED", payload
                assert payload["details"]["reason"] == "pty_not_allowed" and payload["details"]["device"] == pty
            assert not watch.opened(), "the daemon opened a pty allowed_ports does not name"
            os.close(os.open(pty, os.O_RDWR | os.O_NOCTTY))
            assert watch.opened()  # the watch does see an open of a pty
        finally:
            watch.close()
    finally:
        os.close(slave)
        os.close(master)
