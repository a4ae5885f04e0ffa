"""Which device files are terminals, known before anything opens them.

Opening a device runs its driver's open: `/dev/watchdog` arms the watchdog, `/dev/ptmx` makes a new
pty, a tape rewinds. So a port is never opened on the strength of its name or of a failed termios
call afterwards: the path is first opened with O_PATH (which runs no driver code), the inode it
reached is checked to be a character device whose major/minor belongs to a serial or pty-slave tty
driver in /proc/tty/drivers (ttyS, ttyUSB, ttyACM, ttyAMA, /dev/pts/N from socat...), and only then
is that same inode opened, through /proc/self/fd, so a link swapped in between changes nothing.
Consoles, /dev/tty, /dev/ptmx and pty masters are terminals too, but no serial line: refused.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from diagd.protocol.errors import DiagdError, ErrorCode

DRIVERS = "/proc/tty/drivers"
SERIAL_TYPES = frozenset({"serial", "pty:slave"})  # the "type" column of /proc/tty/drivers


@dataclass(frozen=True)
class TtyDriver:
    name: str
    major: int
    minors: range
    kind: str


def parse_drivers(text: str) -> list[TtyDriver]:
    """/proc/tty/drivers: `name  /dev/prefix  major  minor[-last]  type` per line."""
    drivers = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5 or not fields[2].isdigit():
            continue
        first, _, last = fields[3].partition("-")
        try:
            minors = range(int(first), int(last or first) + 1)
        except ValueError:
            continue
        drivers.append(TtyDriver(fields[0], int(fields[2]), minors, fields[4]))
    return drivers


def serial_driver(rdev: int, drivers: list[TtyDriver]) -> TtyDriver | None:
    """The serial or pty-slave driver of device number `rdev`, if any."""
    major, minor = os.major(rdev), os.minor(rdev)
    for driver in drivers:
        if driver.kind in SERIAL_TYPES and driver.major == major and minor in driver.minors:
            return driver
    return None


def _not_a_port(device: str, why: str, **details: object) -> DiagdError:
    return DiagdError(ErrorCode.INVALID_ARGUMENT, f"{device} is not a serial port: {why}; diagd opens only "
                      "serial lines and pseudo-terminal slaves (tty drivers of /proc/tty/drivers)",
                      port=device, reason="not_a_terminal", **details)


def hold_terminal(device: str) -> int:
    """An O_PATH fd on `device` once it is known to be a serial line (nothing opened it yet); the
    caller opens `/proc/self/fd/<fd>` and closes the fd. NOT_FOUND or INVALID_ARGUMENT otherwise."""
    try:
        fd = os.open(device, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        raise DiagdError(ErrorCode.NOT_FOUND, f"no such port: {device}", port=device,
                         hint="list_ports shows the ports this machine has") from None
    except OSError as exc:
        code = ErrorCode.PERMISSION_DENIED if exc.errno in (errno.EACCES, errno.EPERM) else ErrorCode.INVALID_ARGUMENT
        raise DiagdError(code, f"cannot look at {device}: {exc.strerror}", port=device) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISCHR(st.st_mode):
            raise _not_a_port(device, "it is not a character device")
        number = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        try:
            with open(DRIVERS, encoding="ascii", errors="replace") as f:
                drivers = parse_drivers(f.read())
        except OSError as exc:
            raise _not_a_port(device, f"{DRIVERS} cannot be read ({exc.strerror}), so it cannot be told "
                                      "to be a terminal", device_number=number) from None
        if serial_driver(st.st_rdev, drivers) is None:
            raise _not_a_port(device, f"character device {number} belongs to no serial or pty tty driver",
                              device_number=number)
    except BaseException:
        os.close(fd)
        raise
    return fd
