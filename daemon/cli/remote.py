"""`diagd mcp|status|call|logs|doctor --ssh [user@]host[:port]`: the same command on a remote host.

OpenSSH is the transport (no home-made one): `ssh -T ... host -- diagd <command> <args>`, with
stdio handed straight to ssh by `exec`, so an MCP client's bytes go through one pipe and the local
side stays stdlib-only. Before that, one cheap probe (`diagd version` on the remote host) turns
the usual failures into one coded line each: ssh missing, host unreachable, authentication
refused, no diagd on the remote PATH, a different diagd version. The probe opens the shared
connection (ControlMaster/ControlPersist, its socket in diagd's owner-only runtime dir), so the
real command that follows, and the next invocations for a while, reuse it instead of
re-authenticating.

The remote side is a shell, and not always sh: quoting that is safe in sh is not in fish (a
backslash escapes a quote inside single quotes there) or csh. So no argument text reaches it as
text: the command's words travel as one hex word (`diagd --argv-hex 5b22…`), which every shell
passes on untouched, and the remote diagd decodes them (the versions match, so it can). The
remote diagd's path, the only other word, is refused unless it is plain path characters.
No secret ever goes on a command line: authentication is keys or an agent (BatchMode: an MCP
client cannot answer a password prompt).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from diagd import __version__
from diagd.actors import statefile
from diagd.daemon import paths
from diagd.daemon.exits import (
    EXIT_AUTH,
    EXIT_FAILED,
    EXIT_NO_REMOTE_DIAGD,
    EXIT_SSH_FAILED,
    EXIT_SSH_MISSING,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    EXIT_VERSION,
)
from diagd.protocol.errors import DiagdError, ErrorCode

COMMANDS = ("mcp", "status", "call", "logs", "doctor")
CONNECT_TIMEOUT_S = 10
CONTROL_PERSIST_S = 60
PROBE_TIMEOUT_S = CONNECT_TIMEOUT_S + 20  # connect, authenticate, start a Python on the remote host

# Exit statuses of a failed remote start (the remote command's own status passes through).
EXIT_BY_CODE = {
    ErrorCode.SSH_NOT_FOUND: EXIT_SSH_MISSING,
    ErrorCode.SSH_UNREACHABLE: EXIT_UNREACHABLE,
    ErrorCode.SSH_AUTH_FAILED: EXIT_AUTH,
    ErrorCode.REMOTE_DIAGD_NOT_FOUND: EXIT_NO_REMOTE_DIAGD,
    ErrorCode.VERSION_MISMATCH: EXIT_VERSION,
    ErrorCode.SSH_FAILED: EXIT_SSH_FAILED,
    ErrorCode.INVALID_ARGUMENT: EXIT_USAGE,  # a malformed --ssh target
}

# Our own options, taken out of the argument list before the rest is forwarded unchanged (so an
# option added to `diagd mcp` later is forwarded without this module knowing it).
_VALUED = {"--ssh": "target", "--ssh-option": "options", "--remote-diagd": "remote_diagd"}


@dataclass(frozen=True)
class Target:
    host: str
    user: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (f"{self.user}@" if self.user else "") + host + (f":{self.port}" if self.port else "")


@dataclass
class Request:
    """What `--ssh` asked for: where, how, and the command line to run there."""

    target: Target
    command: list[str]  # the diagd sub-command and its arguments, without our own options
    options: list[str] = field(default_factory=list)  # extra `ssh -o` options
    remote_diagd: str = "diagd"


def parse_target(text: str) -> Target:
    """`[user@]host[:port]`; an IPv6 address with a port goes in brackets (`[::1]:2222`)."""
    user, at, hostport = text.rpartition("@")
    if hostport.startswith("["):
        host, bracket, rest = hostport[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise _bad_target(text, "expected [user@][ipv6]:port")
        port_text = rest[1:]
    elif hostport.count(":") == 1:
        host, _, port_text = hostport.partition(":")
    else:
        host, port_text = hostport, ""  # a bare IPv6 address, or a name
    # A leading '-' would be read by ssh as an option (`-oProxyCommand=...`): never a host or user.
    if not host or host.startswith("-") or (at and (not user or user.startswith("-"))):
        raise _bad_target(text, "expected [user@]host[:port]")
    if any(c.isspace() or not c.isprintable() for c in text):
        raise _bad_target(text, "it contains blanks or control characters")
    port = None
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise _bad_target(text, f"port {port_text!r} is not a number from 1 to 65535")
        port = int(port_text)
    return Target(host, user or None, port)


def _bad_target(text: str, why: str) -> DiagdError:
    return DiagdError(ErrorCode.INVALID_ARGUMENT, f"--ssh {text!r}: {why}", target=text)


def split_argv(argv: Sequence[str]) -> Request | None:
    """The `--ssh` request in a `diagd` argument list, or None when it is a local command.

    Only the five sub-commands that make sense remotely take it; `diagd call`'s own arguments are
    free-form `key=value` words, so our options are recognised anywhere but only as whole words.
    """
    if not argv or argv[0] not in COMMANDS:
        return None
    found: dict[str, list[str]] = {"target": [], "options": [], "remote_diagd": []}
    rest: list[str] = []
    i = 1
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name in _VALUED:
            if not eq:
                if i + 1 >= len(argv):
                    raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{name} needs a value")
                i += 1
                value = argv[i]
            found[_VALUED[name]].append(value)
        elif argv[i] == "--":
            rest += argv[i:]
            break
        else:
            rest.append(argv[i])
        i += 1
    if not found["target"]:
        if found["options"] or found["remote_diagd"]:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "--ssh-option and --remote-diagd need --ssh HOST")
        return None
    if len(found["target"]) > 1:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "--ssh given more than once")
    remote_diagd = (found["remote_diagd"] or [os.environ.get("DIAGD_REMOTE_DIAGD") or "diagd"])[-1]
    return Request(parse_target(found["target"][0]), [argv[0], *rest], found["options"], remote_diagd)


def ssh_binary() -> str:
    ssh = shutil.which(os.environ.get("DIAGD_SSH") or "ssh")
    if ssh is None:
        raise DiagdError(ErrorCode.SSH_NOT_FOUND, "ssh is not installed (not found on PATH); "
                         "install OpenSSH's client (Debian: apt install openssh-client)")
    return ssh


def control_path() -> str:
    """The shared connections' sockets: diagd's owner-only runtime dir, named by OpenSSH's %C
    (a hash of local host, remote host, port and user), short enough for the 107-byte limit."""
    return str(paths.ensure_private_dir(paths.runtime_dir(), what="runtime directory") / "ssh-%C")


def ssh_argv(request: Request, *extra: str) -> list[str]:
    """`ssh` with diagd's options, up to and including the host (add the remote command after)."""
    argv = [ssh_binary()]
    if config := os.environ.get("DIAGD_SSH_CONFIG"):
        argv += ["-F", config]
    for option in request.options:  # first: for ssh the first value of an option wins, so these override ours
        argv += ["-o", option]
    argv += ["-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
             "-o", "ControlMaster=auto", "-o", f"ControlPath={control_path()}",
             "-o", f"ControlPersist={CONTROL_PERSIST_S}"]
    if request.target.port:
        argv += ["-p", str(request.target.port)]
    if request.target.user:
        argv += ["-l", request.target.user]
    return [*argv, *extra, "--", request.target.host]


ARGV_FLAG = "--argv-hex"
# Characters that mean nothing to sh, bash, zsh, fish or csh inside a word (a leading `~` expands to
# the remote home, which is what a user writing `~/bin/diagd` means).
_PLAIN_PATH = re.compile(r"~?[A-Za-z0-9_./+-]+")


def remote_command(remote_diagd: str, words: Sequence[str]) -> str:
    """The line the remote shell runs: the remote diagd, then the words hex-encoded. Nothing in an
    argument is ever run, whatever the remote login shell."""
    if not _PLAIN_PATH.fullmatch(remote_diagd):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"--remote-diagd {remote_diagd!r}: use a path of letters, digits "
                         "and _ . / + - (optionally starting with ~)", remote_diagd=remote_diagd)
    encoded = json.dumps(list(words), ensure_ascii=False).encode().hex()
    return f"{remote_diagd} {ARGV_FLAG} {encoded}"


def decode_argv(argv: Sequence[str]) -> list[str]:
    """The words of `diagd --argv-hex HEX` (what `remote_command` sent), or INVALID_ARGUMENT."""
    try:
        words = json.loads(bytes.fromhex(argv[1]).decode()) if len(argv) == 2 else None
    except ValueError:  # not hex, not UTF-8, not JSON
        words = None
    if not (isinstance(words, list) and all(isinstance(w, str) for w in words)):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{ARGV_FLAG} takes one hex-encoded JSON list of words")
    return words


def check(request: Request) -> None:
    """`probe` once per shared connection: a master that already passed it is not asked again.

    `ssh -O check` only asks the local master (milliseconds); a remote session costs a login
    shell and a Python start on the remote host. The stamp names the master's pid, so a new
    master (the old one expired after ControlPersist) is probed again.
    """
    stamp = _stamp_name(request)
    pid = master_pid(request)
    if pid is not None and _read_stamp(stamp) == f"{pid} {__version__}":
        return
    probe(request)
    if (pid := master_pid(request)) is not None:
        _write_stamp(stamp, f"{pid} {__version__}")


def master_pid(request: Request) -> int | None:
    """The pid of the shared connection to this target, None when there is none."""
    done = subprocess.run(ssh_argv(request, "-O", "check"), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, errors="replace", timeout=PROBE_TIMEOUT_S, check=False)
    match = re.search(r"Master running \(pid=(\d+)\)", done.stderr)
    return int(match.group(1)) if done.returncode == 0 and match else None


def _stamp_name(request: Request) -> str:
    what = repr((str(request.target), request.options, request.remote_diagd, os.environ.get("DIAGD_SSH_CONFIG")))
    return "ssh-ok-" + hashlib.sha256(what.encode()).hexdigest()[:20]


def _read_stamp(name: str) -> str | None:
    try:
        return statefile.read_text(paths.runtime_dir() / name).strip()
    except (OSError, DiagdError):  # absent, or a link (never read through)
        return None


def _write_stamp(name: str, text: str) -> None:
    directory = paths.open_private_dir(paths.runtime_dir(), what="runtime directory")
    try:
        fd = directory.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
    finally:
        directory.close()


def probe(request: Request) -> None:
    """Check that the remote diagd answers `version` with ours; a coded DiagdError says what is wrong."""
    argv = [*ssh_argv(request), remote_command(request.remote_diagd, ["version"])]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                              timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise DiagdError(ErrorCode.SSH_UNREACHABLE, f"{request.target}: no answer within {PROBE_TIMEOUT_S} s",
                         target=str(request.target)) from None
    classify(request, done.returncode, done.stdout, done.stderr)


_UNREACHABLE = re.compile(r"connection refused|no route to host|could not resolve|name or service not known|"
                          r"timed out|network is unreachable|temporary failure in name resolution|"
                          r"connection reset|connection closed by remote host|kex_exchange_identification",
                          re.IGNORECASE)
_AUTH = re.compile(r"permission denied|too many authentication failures|no more authentication methods|"
                   r"host key verification failed|remote host identification has changed", re.IGNORECASE)
_VERSION = re.compile(r"^diagd (\S+)")


def classify(request: Request, status: int, stdout: str, stderr: str) -> None:
    """The probe's outcome as one coded error (or nothing when the remote diagd is ours).

    ssh exits 255 for its own failures and says why on stderr; any other status is the remote
    command's: 127 is the shell's "command not found", anything else a diagd without `version`.
    """
    target = str(request.target)
    said = _last_line(stderr)
    if status == 255:
        if _AUTH.search(stderr):
            host_key = "host key" in stderr.lower()
            fix = ("check the host key in known_hosts (connect once with `ssh` to accept it)" if host_key else
                   "diagd uses keys or an agent only (BatchMode): load the key into ssh-agent or name it with "
                   "IdentityFile in ~/.ssh/config, and check that the remote authorized_keys has it")
            raise DiagdError(ErrorCode.SSH_AUTH_FAILED, f"{target}: ssh could not authenticate ({said}); {fix}",
                             target=target, ssh_said=said)
        if _UNREACHABLE.search(stderr):
            raise DiagdError(ErrorCode.SSH_UNREACHABLE, f"{target} is unreachable ({said}); check the host name, "
                             "port and network, and that sshd runs there", target=target, ssh_said=said)
        raise DiagdError(ErrorCode.SSH_FAILED, f"ssh to {target} failed: {said or 'exit status 255'}",
                         target=target, ssh_said=said)
    if status == 127:
        raise DiagdError(ErrorCode.REMOTE_DIAGD_NOT_FOUND,
                         f"no {request.remote_diagd!r} on {target}'s PATH ({said}); install diagd there, or "
                         "name its path with --remote-diagd (non-interactive ssh sessions may not read the "
                         "profile that sets PATH)", target=target, remote_diagd=request.remote_diagd)
    lines = stdout.strip().splitlines()
    if status == 0 and len(lines) > 1 and _VERSION.match(lines[-1]):
        # diagd answered, after something else: the remote shell's startup files print on stdout,
        # which would corrupt every MCP session (stdout is the protocol). Not a version problem.
        raise DiagdError(ErrorCode.SSH_FAILED, f"{target}: the remote shell writes to stdout before diagd runs "
                         f"({lines[0].strip()[:100]!r}), which would corrupt MCP; make its startup files "
                         "(e.g. ~/.bashrc) print nothing in non-interactive sessions", target=target,
                         remote_stdout=lines[0].strip()[:100])
    match = _VERSION.match(stdout.strip())
    if status != 0 or match is None:
        raise DiagdError(ErrorCode.VERSION_MISMATCH,
                         f"{request.remote_diagd!r} on {target} is not diagd {__version__} (it answered "
                         f"`version` with status {status}: {said or _last_line(stdout) or 'nothing'}); "
                         "install the same diagd version on both hosts",
                         target=target, local_version=__version__)
    if match.group(1) != __version__:
        raise DiagdError(ErrorCode.VERSION_MISMATCH,
                         f"{target} runs diagd {match.group(1)}, this host diagd {__version__}; "
                         "install the same version on both hosts", target=target,
                         local_version=__version__, remote_version=match.group(1))


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def run(request: Request) -> int:
    """Probe, then become `ssh ... diagd <command>`: stdio, signals and the exit status are ssh's,
    which are the remote command's (255 for ssh's own failures)."""
    name = request.command[0]
    try:
        check(request)
        argv = [*ssh_argv(request), remote_command(request.remote_diagd, request.command)]
    except DiagdError as exc:
        sys.stderr.write(f"diagd {name}: {exc.code}: {exc.message}\n")
        return EXIT_BY_CODE.get(exc.code, EXIT_FAILED)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
    raise AssertionError("unreachable")  # pragma: no cover - execv does not return


def main(argv: list[str]) -> int:
    """`diagd ... --ssh HOST ...`: the exit status of the remote command, or USAGE for a bad command line."""
    try:
        request = split_argv(argv)
    except DiagdError as exc:
        sys.stderr.write(f"diagd: {exc.code}: {exc.message}\n")
        return EXIT_BY_CODE[ErrorCode.INVALID_ARGUMENT]
    if request is None:
        sys.stderr.write(f"diagd: --ssh works with {', '.join(COMMANDS)}\n")
        return EXIT_BY_CODE[ErrorCode.INVALID_ARGUMENT]
    return run(request)
