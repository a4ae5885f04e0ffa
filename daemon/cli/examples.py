"""`diagd examples [--copy DIR]`: the sample captures shipped with diagd (diagd/samples/), listed with
what each shows and its licence, or copied to a folder of the user's (never over a file). Needs no daemon."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from diagd.daemon.exits import EXIT_FAILED, EXIT_OK
from diagd.protocol.errors import DiagdError, ErrorCode
from diagd.samples import FOLDER, NOTICE, SAMPLES, files


def add_parser(sub: Any) -> None:
    s = sub.add_parser("examples", help="the sample captures shipped with diagd: list them, or --copy DIR",
                       description="List the real public captures shipped with diagd (what each shows, its "
                                   "licence; sources in the NOTICE beside them), or copy them with their NOTICE "
                                   "and licence texts into DIR. README's first prompts use them.")
    s.add_argument("--copy", metavar="DIR", help="copy the samples, NOTICE and licence texts into DIR (made if "
                                                 "missing); refused if any of them is there already")
    s.add_argument("--json", action="store_true", help="as JSON")
    s.set_defaults(func=cmd_examples)


def cmd_examples(args: argparse.Namespace) -> int:
    try:
        if args.copy is not None:
            copied = copy(Path(args.copy).expanduser())
            show_copied(copied, as_json=args.json)
        else:
            listing(as_json=args.json)
    except DiagdError as exc:
        sys.stderr.write(f"diagd examples: {exc.code}: {exc.message}\n")
        return EXIT_FAILED
    return EXIT_OK


def rows() -> list[dict[str, Any]]:
    out = []
    for s in SAMPLES:
        if not s.path.is_file():
            raise DiagdError(ErrorCode.FILE_NOT_FOUND, f"{s.path} is missing: this diagd was installed without its "
                                                       "samples (reinstall it from a wheel)", path=str(s.path))
        out.append({"name": s.name, "path": str(s.path), "size": s.path.stat().st_size, "shows": s.shows,
                    "licence": s.licence, "source": s.source})
    return out


def listing(*, as_json: bool) -> None:
    found = rows()
    notice = FOLDER / NOTICE
    if as_json:
        print(json.dumps({"folder": str(FOLDER), "notice": str(notice), "samples": found}))
        return
    width = max(len(r["name"]) for r in found)
    print(f"{'NAME'.ljust(width)}  {'SIZE':>7}  {'LICENCE':<12}  SHOWS")
    for r in found:
        print(f"{r['name'].ljust(width)}  {_size(r['size']):>7}  {r['licence']:<12}  {r['shows']}")
    print(f"\nin {FOLDER} (sources and licences: {notice}); `diagd examples --copy DIR` copies them")


def copy(target: Path) -> list[Path]:
    """Every sample file into `target`; nothing copied if one of them is there already."""
    rows()  # a broken install is said before anything is written
    names = files()
    there = [n for n in names if (target / n).exists() or (target / n).is_symlink()]
    if there:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{target} already holds {', '.join(there)}: diagd examples "
                         "never overwrites a file (choose another folder, or remove them)", path=str(target))
    copied = []
    try:
        target.mkdir(parents=True, exist_ok=True)
        for name in names:
            with (FOLDER / name).open("rb") as src, (target / name).open("xb") as dst:
                shutil.copyfileobj(src, dst)
            copied.append(target / name)
    except FileExistsError as exc:  # made between the check and the copy
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{exc.filename} appeared meanwhile: not overwritten",
                         path=str(exc.filename)) from None
    except OSError as exc:
        raise DiagdError(ErrorCode.PERMISSION_DENIED, f"cannot copy into {target}: {exc.strerror or exc}",
                         path=str(target)) from None
    return copied


def show_copied(copied: list[Path], *, as_json: bool) -> None:
    captures = [str(p) for p in copied if p.name in {s.name for s in SAMPLES}]
    if as_json:
        print(json.dumps({"copied": [str(p) for p in copied], "captures": captures}))
        return
    print(f"copied {len(captures)} captures (with NOTICE and the licence texts) into {copied[0].parent}:")
    for path in captures:
        print(f"  {path}")


def _size(n: int) -> str:
    return f"{n / 1024:.0f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.1f} MiB"
