"""`diagd index export CAPTURE [--to DIR]`: a capture's persistent index (docs/pcap-index.md), built by
the running daemon if it is not yet (`pcap_index`), copied beside the capture for another engine or
another machine: its Parquet files and meta.json, never over a file.

A command the pcap back end declares (its `diagd.commands` entry point, pyproject.toml): the CLI finds
it by name without importing it and hands it the rest of the command line, a way to call a tool of
the running daemon and the daemon's state directory (daemon/cli/cli.py). The daemon keeps indexes in
that directory, which no tool writes out of (an agent's calls write only into the output directory);
this command runs as the user who owns both, at the terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diagd.actors.pcap.index.tables import FRAMES_DIR, frame_files
from diagd.protocol.errors import DiagdError, ErrorCode

# (tool, arguments) -> (result, is_error), through the running daemon (cli.py's control client).
CallTool = Callable[[str, dict[str, Any]], tuple[dict[str, Any], bool]]
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2  # as daemon/exits.py numbers them for every command
HELP = "a capture's persistent index: export it beside the capture (Parquet)"
EXPORTED = ("layers.parquet", "conversations.parquet", "endpoints.parquet", "meta.json")  # and the frames table's files
SUFFIX = ".diagd-index"


def main(argv: list[str], call_tool: CallTool, state_dir: Path) -> int:
    """`diagd index ARGV...`; `state_dir`: the running daemon's (where its indexes are)."""
    s = argparse.ArgumentParser(prog="diagd index", description=(
        "Export a capture's index (Parquet files any engine reads, and meta.json; docs/pcap-index.md) into a "
        "new folder, by default CAPTURE.diagd-index beside the capture. The running daemon builds the index "
        "first if it has none."))
    actions = s.add_subparsers(dest="action", required=True)
    e = actions.add_parser("export", help="copy the index of CAPTURE into a new folder")
    e.add_argument("capture", help="the capture file")
    e.add_argument("--to", metavar="DIR", help=f"the folder to create (default: CAPTURE{SUFFIX})")
    e.add_argument("--wait", type=float, default=600.0, metavar="S", help="wait this long for a build (default 600)")
    e.add_argument("--decode-as", action="append", default=[], metavar="RULE",
                   help="a decode-as rule the index is of, as pcap tools take it (repeatable)")
    e.add_argument("--json", action="store_true", help="print what was written as JSON")
    args = s.parse_args(argv)
    return cmd_export(args, call_tool, state_dir)


def cmd_export(args: argparse.Namespace, call_tool: CallTool, state_dir: Path) -> int:
    capture = Path(args.capture).expanduser().absolute()
    target = Path(args.to).expanduser().absolute() if args.to else capture.with_name(capture.name + SUFFIX)
    arguments: dict[str, Any] = {"pcap_path": str(capture), "wait_s": args.wait}
    if args.decode_as:
        arguments["decode_as"] = args.decode_as
    if target.exists() or target.is_symlink():
        sys.stderr.write(f"diagd index export: {target} exists: name a new folder with --to\n")
        return EXIT_USAGE
    result, is_error = call_tool("pcap_index", arguments)
    if is_error:
        sys.stderr.write(f"diagd index export: {result.get('code')}: {result.get('message')}\n")
        return EXIT_FAILED
    if result.get("state") != "ready":
        sys.stderr.write(f"diagd index export: the index is {result.get('state')} ({result.get('note', '')}); "
                         "run it again later or with a longer --wait\n")
        return EXIT_FAILED
    try:
        written = export(index_folder(state_dir, str(result["index"])), target)
    except DiagdError as exc:
        sys.stderr.write(f"diagd index export: {exc.code}: {exc.message}\n")
        return EXIT_FAILED
    if args.json:
        print(json.dumps({"folder": str(target), "files": written, "frames": result["summary"]["frames"]}))
    else:
        print(f"{target}  ({len(written)} files, {result['summary']['frames']} frames; schema: docs/pcap-index.md)")
    return EXIT_OK


def index_folder(state_dir: Path, name: str) -> Path:
    """Where the running daemon keeps the index `name`."""
    if "/" in name or name.startswith("."):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"the daemon named an index {name!r}")
    return state_dir / "pcap" / "index" / name


def export(source: Path, target: Path) -> list[str]:
    """Copy the index's files into `target`, a folder made here (never over one, never through a link): the
    frames table's files (frames/, in frame order) and the other tables; their names, relative to it."""
    missing = [name for name in EXPORTED if not (source / name).is_file()]
    frames = frame_files(source)
    if missing or not frames:
        raise DiagdError(ErrorCode.FILE_NOT_FOUND, f"{source} lacks {', '.join(missing or [FRAMES_DIR])} (evicted "
                                                   "meanwhile, or a daemon of another state directory)",
                         path=str(source))
    try:
        target.mkdir(mode=0o755)
        (target / FRAMES_DIR).mkdir(mode=0o755)
    except FileExistsError:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{target} exists", path=str(target)) from None
    except OSError as exc:
        raise DiagdError(ErrorCode.PERMISSION_DENIED, f"cannot create {target}: {exc.strerror}",
                         path=str(target)) from None
    names = [f"{FRAMES_DIR}/{f.name}" for f in frames] + list(EXPORTED)
    for name in names:
        fd = os.open(target / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with open(source / name, "rb") as src, os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return names
