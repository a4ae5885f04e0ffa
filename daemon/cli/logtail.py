"""`diagd logs`: audit records printed as one line each, and following the log across rotations."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from diagd.actors import statefile
from diagd.daemon import paths
from diagd.daemon.exits import EXIT_FAILED, EXIT_OK
from diagd.protocol.errors import DiagdError


def run(*, lines: int, follow_on: bool, raw: bool) -> int:
    """`diagd logs [-n LINES] [-f] [--json]`: the last audit records, then (with -f) new ones."""
    state = paths.state_dir()
    if problem := paths.private_dir_problem(state):  # records from a dir someone else controls prove nothing
        sys.stderr.write(f"diagd logs: refusing state directory {state}: {problem}\n")
        return EXIT_FAILED
    path = state / "audit.jsonl"
    try:
        last = tail(path, lines)  # never through a link: PERMISSION_DENIED, one line
    except FileNotFoundError:
        sys.stderr.write(f"no audit log yet at {path}\n")
        return follow(path, raw=raw) if follow_on else EXIT_OK
    except DiagdError as exc:
        sys.stderr.write(f"diagd logs: {exc.code}: {exc.message}\n")
        return EXIT_FAILED
    except OSError as exc:
        sys.stderr.write(f"diagd logs: cannot read {path}: {exc.strerror or exc}\n")
        return EXIT_FAILED
    for line in last:
        print_record(line, raw=raw)
    return follow(path, raw=raw) if follow_on else EXIT_OK


def tail(path: Path, lines: int) -> list[str]:
    """The last `lines` records; FileNotFoundError, or PERMISSION_DENIED for a link (never followed)."""
    with open(statefile.open_file(path, os.O_RDONLY), encoding="utf-8", errors="replace") as f:
        return f.readlines()[-lines:] if lines > 0 else []


def follow(path: Path, *, raw: bool) -> int:
    """Poll the file; reopen it after rotation (inode change). A link in its place ends it with one line."""
    f = None
    inode = None
    try:
        while True:
            if f is None and os.path.lexists(path):
                try:
                    f = open(statefile.open_file(path, os.O_RDONLY), encoding="utf-8")  # noqa: SIM115
                except DiagdError as exc:
                    sys.stderr.write(f"diagd logs: {exc.code}: {exc.message}\n")
                    return EXIT_FAILED
                except FileNotFoundError:
                    pass  # gone again between the two looks: the next round sees
                if f is not None and inode is None:
                    f.seek(0, os.SEEK_END)
                if f is not None:
                    inode = os.fstat(f.fileno()).st_ino
            if f is not None:
                for line in f:
                    print_record(line, raw=raw)
                try:
                    if os.stat(path).st_ino != inode:
                        f.close()
                        f = None
                        inode = -1
                except FileNotFoundError:
                    pass
            sys.stdout.flush()
            time.sleep(0.25)
    except KeyboardInterrupt:
        return EXIT_OK


def print_record(line: str, *, raw: bool) -> None:
    if raw:
        sys.stdout.write(line if line.endswith("\n") else line + "\n")
        return
    try:
        r = json.loads(line)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["ts"]))
        outcome = r["outcome"] if r["outcome"] in ("ok", "started") else f"{r['outcome']}:{r['code']}"
        args = json.dumps(r["arguments"], separators=(",", ":"), ensure_ascii=False)
        if len(args) > 120:
            args = args[:117] + "..."
        text = (f"{when}  {r['client']:<14} {r['tool']:<24} {r['duration_ms']:>9.1f}ms  q{r['queue_ms']:.1f}ms  "
                f"{r['bytes']:>7}B  {outcome}  {args}")
    except (ValueError, KeyError, TypeError, OverflowError):
        return  # a torn or foreign line: skip it rather than stop the listing
    print(text)
