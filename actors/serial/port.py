"""The port itself: pyserial driven from Trio through its non-blocking fd, settings applied one at a
time (a refusal names the setting and puts the port back), and why an open failed."""

from __future__ import annotations

import errno
import os
import select
import termios
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import serial
import trio

from diagd.actors.serial import ttydev
from diagd.actors.serial.replies import ModemLines
from diagd.actors.serial.settings import PortSettings, PortState
from diagd.protocol.errors import DiagdError, ErrorCode

READ_SIZE = 16384


class PortGone(Exception):
    """The device went away (hang-up, I/O error): the port is Disconnected."""


class SettingRefused(Exception):
    """The device did not take one setting; the port has been put back as it was."""

    def __init__(self, key: str, value: Any, reason: str) -> None:
        super().__init__(f"{key}={value!r}: {reason}")
        self.key, self.value, self.reason = key, value, reason


# The order pyserial applies settings in (SerialBase._SAVED_SETTINGS); each change is one tcsetattr.
DEVICE_KEYS = ("baudrate", "bytesize", "parity", "stopbits", "xonxoff", "dsrdtr", "rtscts")
_CMSPAR = 0o10000000000  # "stick" (mark/space) parity; the termios module does not export it
_PARITY_BITS = {"N": 0, "E": termios.PARENB, "O": termios.PARENB | termios.PARODD,
                "M": termios.PARENB | termios.PARODD | _CMSPAR, "S": termios.PARENB | _CMSPAR}
_SIZE_BITS = {5: termios.CS5, 6: termios.CS6, 7: termios.CS7, 8: termios.CS8}


def _not_in_effect(fd: int, key: str, value: Any) -> str | None:
    """Why the line does not have `key=value` although tcsetattr succeeded, or None if it has it.

    tcsetattr succeeds when any part of a change was made, and a driver may drop what it cannot do
    (a pty takes a baud rate change but drops parity and character size in the same call), so
    what counts is what reads back. The baud rate is not compared: drivers legitimately round it
    and report the rate they achieved.
    """
    iflag, _oflag, cflag, _lflag, _ispeed, _ospeed, _cc = termios.tcgetattr(fd)
    if key == "bytesize":
        ok = cflag & termios.CSIZE == _SIZE_BITS[value]
    elif key == "parity":
        ok = cflag & (termios.PARENB | termios.PARODD | _CMSPAR) == _PARITY_BITS[value]
    elif key == "stopbits":
        ok = bool(cflag & termios.CSTOPB) == (value != 1)
    elif key == "rtscts":
        ok = bool(cflag & termios.CRTSCTS) == value
    elif key == "xonxoff":
        ok = (iflag & (termios.IXON | termios.IXOFF) == termios.IXON | termios.IXOFF) == value
    else:
        return None
    return None if ok else "the device did not take it (it does not read back)"


def _as_oserror(exc: termios.error) -> OSError:
    """termios.error is not an OSError, though it carries (errno, text) like one."""
    code, text = (*exc.args, 0, str(exc))[:2]
    return OSError(code, text)


def _set(ser: Any, key: str, value: Any) -> None:
    """One pyserial setting: it reconfigures the open port at once."""
    try:
        setattr(ser, key, value)
    except termios.error as exc:
        raise _as_oserror(exc) from None


def apply_settings(ser: Any, wanted: dict[str, Any]) -> None:
    """Change an open port's settings one at a time, so a refusal names the setting; on a refusal,
    walk back through states the port was just in (each one it took) and raise SettingRefused.

    A refusal: pyserial's ValueError (e.g. a custom baud rate the driver rejects), EINVAL from
    tcsetattr, or a setting that does not read back. Any other OSError (the device went away)
    propagates unchanged.
    """
    done: list[tuple[str, Any]] = []
    for key in DEVICE_KEYS:
        old = getattr(ser, key)
        if key not in wanted or wanted[key] == old:
            continue
        try:
            _set(ser, key, wanted[key])
            reason = _not_in_effect(ser.fileno(), key, wanted[key])
        except ValueError as exc:
            reason = str(exc)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            reason = os.strerror(errno.EINVAL)
        if reason is None:
            done.append((key, old))
            continue
        for back_key, back_value in [(key, old), *reversed(done)]:
            _set(ser, back_key, back_value)
        raise SettingRefused(key, wanted[key], reason)


class PortIO(Protocol):
    """The narrow port interface the actor needs; `PosixPort` on pyserial, scripted fakes in tests."""

    async def receive(self) -> bytes: ...  # waits for bytes; raises PortGone
    async def write_some(self, data: memoryview) -> int: ...  # raises PortGone
    def apply(self, settings: PortSettings) -> None: ...
    def set_lines(self, dtr: bool | None, rts: bool | None) -> None: ...
    def set_break(self, on: bool) -> None: ...
    def modem_lines(self) -> ModemLines | None: ...
    def close(self) -> None: ...


Opener = Callable[[str, PortSettings, dict[str, bool]], Awaitable[PortIO]]
# Runs a blocking helper (path resolution, log files, /proc scans) off the Trio loop. A seam, so
# virtual-clock tests can run them inline: a thread would let MockClock's autojump fire deadlines.
BlockingRunner = Callable[..., Awaitable[Any]]


class PosixPort:
    """A pyserial port driven from Trio through its non-blocking fd."""

    def __init__(self, ser: Any) -> None:
        self.ser = ser
        self.fd: int = ser.fileno()
        self._closed = False

    async def receive(self) -> bytes:
        while True:
            try:
                await trio.lowlevel.wait_readable(self.fd)
            except trio.ClosedResourceError:
                raise PortGone("port closed") from None
            try:
                data = os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                continue
            except OSError as exc:
                raise PortGone(f"read failed: {os.strerror(exc.errno or 0)}") from None
            if data:
                return data
            # Readable but empty (VMIN=0): a hang-up, or another reader took the bytes.
            poller = select.poll()
            poller.register(self.fd, select.POLLHUP | select.POLLERR)
            if poller.poll(0):
                raise PortGone("hang-up: the device or the other end of the line went away")
            await trio.sleep(0.01)

    async def write_some(self, data: memoryview) -> int:
        while True:
            try:
                return os.write(self.fd, data)
            except BlockingIOError:
                pass
            except OSError as exc:
                raise PortGone(f"write failed: {os.strerror(exc.errno or 0)}") from None
            try:
                await trio.lowlevel.wait_writable(self.fd)
            except trio.ClosedResourceError:
                raise PortGone("port closed") from None

    def apply(self, settings: PortSettings) -> None:
        apply_settings(self.ser, settings.pyserial())

    def set_lines(self, dtr: bool | None, rts: bool | None) -> None:
        if dtr is not None:
            self.ser.dtr = dtr
        if rts is not None:
            self.ser.rts = rts

    def set_break(self, on: bool) -> None:
        self.ser.break_condition = on

    def modem_lines(self) -> ModemLines | None:
        try:
            return {"cts": self.ser.cts, "dsr": self.ser.dsr, "ri": self.ser.ri, "cd": self.ser.cd}
        except OSError:
            return None  # no modem lines (a pty, some USB adapters)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            trio.lowlevel.notify_closing(self.fd)  # wakes a task still waiting on the fd
            self.ser.close()


async def open_posix_port(device: str, settings: PortSettings, lines: dict[str, bool]) -> PortIO:
    def _open() -> Any:
        held = ttydev.hold_terminal(device)  # known to be a serial line before its driver's open runs
        try:
            return _open_held(held)
        finally:
            os.close(held)

    def _open_held(held: int) -> Any:
        wanted = settings.pyserial()
        ser = serial.Serial()
        ser.port = f"/proc/self/fd/{held}"  # the very inode checked, whatever the path points at now
        # Opened at the wanted speed and 8N1, then set one setting at a time (as on an open port): a
        # device that refuses one is told apart from the others, and a pty that would silently drop
        # parity taken together with a speed change is caught (see _not_in_effect).
        ser.baudrate = wanted["baudrate"]
        ser.exclusive = True
        ser.timeout = 0
        if "dtr" in lines:
            ser.dtr = lines["dtr"]  # applied by open(): no reset pulse when asked for dtr=false
        if "rts" in lines:
            ser.rts = lines["rts"]
        try:
            ser.open()
        except ValueError as exc:
            raise SettingRefused("baudrate", wanted["baudrate"], str(exc)) from None
        except termios.error as exc:
            error = _as_oserror(exc)
            if error.errno == errno.EINVAL:
                raise SettingRefused("baudrate", wanted["baudrate"], os.strerror(errno.EINVAL)) from None
            raise OSError(error.errno, f"cannot set up {device}: {error.strerror}") from None
        except OSError as exc:  # pyserial's message names the /proc/self/fd path: name the port instead
            raise OSError(exc.errno, str(exc).replace(ser.port, device)) from None
        try:
            apply_settings(ser, wanted)
        except BaseException:
            ser.close()
            raise
        return ser

    try:
        return PosixPort(await trio.to_thread.run_sync(_open))
    except SettingRefused as exc:
        raise refused_error(device, exc, "the port stays closed") from None
    except ValueError as exc:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"invalid settings for {device}: {exc}", port=device) from None
    except OSError as exc:  # serial.SerialException is an OSError
        raise await _open_error(device, exc) from None


def refused_error(port: str, exc: SettingRefused, outcome: str) -> DiagdError:
    return DiagdError(ErrorCode.INVALID_ARGUMENT, f"{port} refused {exc.key}={exc.value!r}: {exc.reason}; {outcome}",
                      port=port, argument=exc.key, value=exc.value, reason=exc.reason)


async def _open_error(device: str, exc: OSError) -> DiagdError:
    code, text = exc.errno, str(exc)
    if code in (errno.EAGAIN, errno.EBUSY):
        holders = await trio.to_thread.run_sync(port_holders, device)
        return DiagdError(ErrorCode.BUSY, f"{device} is Occupied: locked or in use by another program",
                          port=device, state=str(PortState.OCCUPIED), holders=holders)
    if code in (errno.ENOENT, errno.ENODEV, errno.ENXIO):
        return DiagdError(ErrorCode.NOT_FOUND, f"no such port: {device} ({os.strerror(code)})", port=device)
    if code in (errno.EACCES, errno.EPERM):
        return DiagdError(ErrorCode.PERMISSION_DENIED, f"diagd may not open {device}", port=device,
                          hint="serial devices usually need membership of the dialout group")
    if "configure" in text:
        return DiagdError(ErrorCode.INVALID_ARGUMENT, f"{device} is not a serial port: {text}", port=device)
    return DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"cannot open {device}: {text}", port=device)


def port_holders(device: str) -> list[dict[str, Any]]:
    """Processes that have `device` open (like fuser); what we can see without privileges."""
    real = os.path.realpath(device)
    out: list[dict[str, Any]] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            links = [os.readlink(fd.path) for fd in os.scandir(f"{entry.path}/fd")]
        except OSError:
            continue
        if real in links:
            try:
                command = Path(f"{entry.path}/comm").read_text().strip()
            except OSError:
                command = "?"
            out.append({"pid": int(entry.name), "command": command})
    return out
