"""`diagd setup [BACKEND...|all]`: install with apt the Debian packages those back ends declare.

Only what the chosen back ends need (their `SYSTEM_NEEDS`), after a confirmation (or `--yes`);
`--dry-run` prints the commands instead. None of these packages ships a service (the test
toolchain's openssh-server is scripts/setup.sh's business). Without root it goes through sudo, and
without sudo it refuses, printing the commands to run as root. Nothing else is changed: group
membership and mounts are printed as notes.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from diagd.daemon.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE

# shutil and subprocess are imported where used: `diagd mcp` builds this parser too, and starts fast.
APT_TIMEOUT_S = 3600.0  # a slow mirror; apt prints its own progress meanwhile
# tshark asks whether non-root users may capture: "no", without a prompt (diagd reads files, never captures).
DEBCONF = "wireshark-common wireshark-common/install-setuid boolean false\n"


def add_parser(sub: Any) -> None:
    s = sub.add_parser("setup", help="install with apt what the back ends need (diagd setup NAME... or all)",
                       description="Install with apt only the Debian packages the chosen back ends need. "
                                   "Back ends: every installed one (diagd doctor lists them) and any [daemon] "
                                   "extra_backends.")
    s.add_argument("backends", nargs="*", metavar="BACKEND", default=["all"],
                   help="back ends to set up (default: all)")
    s.add_argument("-y", "--yes", action="store_true", help="install without asking")
    s.add_argument("-n", "--dry-run", action="store_true", help="print what would run, change nothing")
    s.set_defaults(func=cmd_setup)


def cmd_setup(args: argparse.Namespace) -> int:
    from diagd.daemon.cli import backend_needs

    known = backend_needs.names()
    wanted = known if "all" in args.backends else list(dict.fromkeys(args.backends))
    unknown = [n for n in wanted if n not in known]
    if unknown:
        sys.stderr.write(f"diagd setup: unknown back end {', '.join(unknown)} (known: {', '.join(known)}, all)\n")
        return EXIT_USAGE
    needs = backend_needs.declared(wanted)
    missing: list[str] = []
    for name, need in needs.items():
        state = {p: backend_needs.installed(p) for p in need.packages}
        if None in state.values():
            sys.stderr.write("diagd setup: no dpkg here; install these with your package manager: "
                             f"{' '.join(need.packages)}\n")
            return EXIT_FAILED
        absent = [p for p, ok in state.items() if not ok]
        missing += [p for p in absent if p not in missing]
        print(f"{name}: " + (f"to install: {' '.join(absent)}" if absent else
                             "nothing to install" if not need.packages else f"installed: {' '.join(need.packages)}"))
        failing = [c for c in (check() for check in need.checks) if not c.ok]
        for check in failing:  # what no package fixes: privileges, a mount, a group
            print(f"  not ready: {check.name}: {check.detail}" + (f"\n    fix: {check.fix}" if check.fix else ""))
        if need.note and (absent or failing):
            print(f"  note: {need.note}")
    if not missing:
        return EXIT_OK
    return install(missing, yes=args.yes, dry_run=args.dry_run)


def install(packages: list[str], *, yes: bool, dry_run: bool) -> int:
    prefix = _as_root()
    commands = [[*(prefix or []), "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "update", "-q"],
                [*(prefix or []), "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q",
                 "--no-install-recommends", *packages]]
    if dry_run or prefix is None:
        if prefix is None and not dry_run:
            sys.stderr.write("diagd setup: installing packages needs root, and there is no sudo here; as root, run:\n")
        out = sys.stdout if dry_run else sys.stderr
        for cmd in commands:
            out.write("  " + shlex.join(cmd) + "\n")
        return EXIT_OK if dry_run else EXIT_FAILED
    if not yes and not _confirm(f"Install {' '.join(packages)} with apt-get?"):
        print("nothing installed")
        return EXIT_FAILED
    if "wireshark-common" in packages or "tshark" in packages:
        _run([*prefix, "debconf-set-selections"], stdin=DEBCONF)
    for cmd in commands:
        if not _run(cmd):
            sys.stderr.write(f"diagd setup: failed: {shlex.join(cmd)}\n")
            return EXIT_FAILED
    print("installed; `diagd doctor` checks the rest")
    return EXIT_OK


def _as_root() -> list[str] | None:
    """The prefix that runs a command as root: none for root, sudo, or None (no way)."""
    import shutil

    if os.geteuid() == 0:
        return []
    sudo = shutil.which("sudo")
    return [sudo] if sudo else None


def _confirm(question: str) -> bool:
    sys.stdout.write(f"{question} [y/N] ")
    sys.stdout.flush()
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def _run(cmd: list[str], stdin: str | None = None) -> bool:
    """Run one apt step on our terminal (apt shows its own progress), bounded; whether it succeeded."""
    import subprocess

    try:
        return subprocess.run(cmd, input=stdin, text=True, timeout=APT_TIMEOUT_S, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        sys.stderr.write(f"diagd setup: {shlex.join(cmd)}: {exc}\n")
        return False
