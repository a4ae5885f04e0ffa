"""Which ports a client may open: [serial] allowed_ports, pseudo-terminals, and the ptys diagd holds.

A pseudo-terminal is no serial line somebody plugged in: it is some program's terminal (a shell, an
ssh login, another user's session) or one diagd made itself (the pty a crash session runs on; a
client that opened it could read what diagd sends crash and make another client's commands time
out). So:

- a real serial line (ttyS, ttyUSB, ttyACM, ...) opens when `[serial] allowed_ports` is empty (the
  default: any) or names it;
- a pty slave opens only when `[serial] allowed_ports` names it: an entry (a path or a glob) that,
  links resolved, reaches that device; the default (empty) names none;
- a pty diagd itself holds, or one of its descendants holds (crash's terminal), never opens, whatever
  allowed_ports says. The ports this back end has open are its own business, not "held by diagd".

A pty is told by its resolved path and by its device number, whichever says so: a path under
/dev/pts/ or a legacy BSD slave name (/dev/ttyp0 ... /dev/ttyef), or a character device of a pty
slave major (Unix98: 136-143; BSD: 3; or a `pty:slave` driver of /proc/tty/drivers). Pty masters
(/dev/ptmx, /dev/ptyp0, majors 2 and 128-135) are no serial lines at all: ttydev refuses them as
`not_a_terminal` before anything opens them, whatever allowed_ports says.

Every check here runs in a worker thread (it stats files and reads /proc); `PortAccess` is one
verdict's snapshot of the allow-list and of the ptys held, each computed at most once.
"""

from __future__ import annotations

import fcntl
import glob
import os
import re
import stat
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from diagd.actors.serial import ttydev
from diagd.protocol.errors import DiagdError, ErrorCode

UNIX98_SLAVE_MAJORS = frozenset(range(136, 144))
UNIX98_MASTER_MAJORS = frozenset(range(128, 136))
BSD_MASTER_MAJOR, BSD_SLAVE_MAJOR = 2, 3
PTMX = os.makedev(5, 2)
# Legacy BSD pty slaves (ttyp0 ... ttyef); ttyS0, ttyUSB0, ttyACM0 and ttyprintk are not among them.
_SLAVE_NAME = re.compile(r"/dev/(?:pts/(?!ptmx$)[^/]+|tty[p-za-e][0-9a-f])")
_TIOCGPTN = 0x80045430  # _IOR('T', 0x30, unsigned int): the pty number of a master (not in Python's termios)

PtyId = tuple[int, int]  # (st_dev of its devpts instance, 0 for a BSD pty; st_rdev): the slave's identity
PtyScan = Callable[[], set[PtyId]]

HINT = "add it to [serial] allowed_ports (a path, a glob or a link that reaches it), then diagd reload"


def _majors(kind: str, builtin: frozenset[int]) -> frozenset[int]:
    try:
        with open(ttydev.DRIVERS, encoding="ascii", errors="replace") as f:
            listed = {d.major for d in ttydev.parse_drivers(f.read()) if d.kind == kind}
    except OSError:
        listed = set()
    return builtin | listed


def slave_majors() -> frozenset[int]:
    return _majors("pty:slave", UNIX98_SLAVE_MAJORS | {BSD_SLAVE_MAJOR})


def is_pty_slave(names: Iterable[str], st: os.stat_result | None, majors: frozenset[int] | None = None) -> bool:
    """Whether a port is a pty slave: by any of its `names` (as given, resolved) or by its device."""
    if any(_SLAVE_NAME.fullmatch(os.path.normpath(name)) for name in names):
        return True
    if st is None or not stat.S_ISCHR(st.st_mode):
        return False
    return os.major(st.st_rdev) in (slave_majors() if majors is None else majors)


def pty_id(st: os.stat_result) -> PtyId:
    """A pty slave's identity: its device number, within its devpts instance (a container's /dev/pts/3
    is not the host's, though both are 136:3)."""
    return (0 if os.major(st.st_rdev) == BSD_SLAVE_MAJOR else st.st_dev, st.st_rdev)


# -- the ptys diagd holds ----------------------------------------------------------------------


def held_ptys() -> set[PtyId]:
    """The pty slaves this process and its descendants hold: the slaves they have open (crash's
    terminal) and the slaves of the masters they have open (the pty pexpect made for crash)."""
    me = os.getpid()
    slaves = slave_majors()
    masters = _majors("pty:master", UNIX98_MASTER_MAJORS)
    found: set[PtyId] = set()
    for pid in (me, *descendants(me)):
        found |= _process_ptys(pid, pid == me, slaves, masters)
    return found


def descendants(root: int) -> list[int]:
    """The processes below `root` (children, theirs, ...), from /proc/<pid>/stat's parent field."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rpartition(")")[2].split()
            children.setdefault(int(fields[1]), []).append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    out: list[int] = []
    seen, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                out.append(child)
                todo.append(child)
    return out


def _process_ptys(pid: int, own: bool, slaves: frozenset[int], masters: frozenset[int]) -> set[PtyId]:
    found: set[PtyId] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found  # gone, or not ours to look at
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")  # the inode the fd holds (no open, no driver code)
        except OSError:
            continue
        if not stat.S_ISCHR(st.st_mode):
            continue
        major = os.major(st.st_rdev)
        if major in slaves:
            found.add(pty_id(st))
        elif major == BSD_MASTER_MAJOR:
            found.add((0, os.makedev(BSD_SLAVE_MAJOR, os.minor(st.st_rdev))))
        elif st.st_rdev == PTMX or major in masters:
            index = _master_index(pid, fd, own)
            if index is not None:
                try:
                    found.add(pty_id(os.stat(f"/dev/pts/{index}")))
                except OSError:
                    continue  # its slave is gone (or in another devpts): nothing to open there
    return found


def _master_index(pid: int, fd: str, own: bool) -> int | None:
    """The pty number of a Unix98 master: `tty-index` in its fdinfo, else (our own fd) TIOCGPTN."""
    try:
        for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines():
            if line.startswith("tty-index:"):
                return int(line.split(":", 1)[1])
    except (OSError, ValueError):
        return None
    if not own:
        return None
    try:
        return int(struct.unpack("I", fcntl.ioctl(int(fd), _TIOCGPTN, b"\0" * 4))[0])
    except (OSError, ValueError):
        return None


# -- the verdict ---------------------------------------------------------------------------------


def allowed_devices(patterns: Iterable[str]) -> set[str]:
    """What [serial] allowed_ports names: every entry and glob match, links resolved."""
    devices = set()
    for entry in patterns:
        entry = os.path.expanduser(entry)
        for path in glob.glob(entry) if glob.has_magic(entry) else [entry]:
            devices.add(os.path.realpath(path))
    return devices


@dataclass
class PortAccess:
    """Whether ports may be opened, under `allowed` ([serial] allowed_ports). `held` finds the ptys
    diagd holds (`held_ptys`, a seam for tests that play the modem in the daemon's own process);
    `own` are the devices of the ports this back end has open, which it may configure again."""

    allowed: tuple[str, ...]
    held: PtyScan = held_ptys
    own: tuple[str, ...] = ()
    _devices: set[str] | None = field(default=None, init=False, repr=False)
    _held: set[PtyId] | None = field(default=None, init=False, repr=False)
    _majors: frozenset[int] | None = field(default=None, init=False, repr=False)

    def check(self, key: str) -> None:
        """Raise the refusal of `key`, if any (PERMISSION_DENIED)."""
        refusal = self.refusal(key)
        if refusal is not None:
            raise refusal

    def refusal(self, key: str) -> DiagdError | None:
        real = os.path.realpath(key)
        try:
            st: os.stat_result | None = os.stat(real)
        except OSError:
            st = None  # not there (the open says NOT_FOUND) or not ours to look at
        if self._majors is None:
            self._majors = slave_majors()
        named = real in self.devices()
        if not is_pty_slave((key, real), st, self._majors):
            if self.allowed and not named:
                return DiagdError(ErrorCode.PERMISSION_DENIED, f"{key} is not in [serial] allowed_ports",
                                  port=key, device=real, allowed_ports=list(self.allowed), hint=HINT)
            return None
        if st is not None and pty_id(st) in self.held_by_diagd():
            return DiagdError(
                ErrorCode.PERMISSION_DENIED,
                f"{key} ({real}) is a pseudo-terminal diagd itself holds (such as the terminal of a crash "
                "session): it is never opened as a serial port, whatever [serial] allowed_ports says",
                port=key, device=real, reason="daemon_pty",
                hint="open a real serial line, or a pty another program made for the purpose (socat, a simulator)")
        if not named:
            names = "names no pty" if not self.allowed else "does not name it"
            return DiagdError(
                ErrorCode.PERMISSION_DENIED,
                f"{key} ({real}) is a pseudo-terminal, not a serial line, and [serial] allowed_ports {names}: "
                "a pty is some program's terminal (a shell, another user's login), opened only when configured",
                port=key, device=real, reason="pty_not_allowed", allowed_ports=list(self.allowed),
                hint=f"if it is a pty of yours (socat, a simulator), {HINT}")
        return None

    def devices(self) -> set[str]:
        if self._devices is None:
            self._devices = allowed_devices(self.allowed)
        return self._devices

    def held_by_diagd(self) -> set[PtyId]:
        if self._held is None:
            own = set()
            for device in self.own:
                try:
                    own.add(pty_id(os.stat(device)))
                except OSError:
                    continue
            self._held = self.held() - own
        return self._held
