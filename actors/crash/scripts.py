"""What a crash session can run from disk: drgn analysis scripts and the pykdump crash extension.

`list_scripts` finds the analysis scripts in [crash] script_dirs (one `*.py` each, the first of a
name wins, `_private.py` files are skipped) and describes each by its docstring's first line,
without importing it (it reads every script: call it through trio.to_thread). `find_pykdump`
looks for the `mpykdump*.so` extension that `pykdump:` commands need.
"""

from __future__ import annotations

import ast
from pathlib import Path

from diagd.actors.crash.replies import Script

PYKDUMP_DIRS = ("/usr/lib/crash/extensions", "/usr/lib64/crash/extensions", "/usr/local/lib/crash/extensions",
                "~/.crash.d")


def list_scripts(dirs: tuple[str, ...]) -> dict[str, Script]:
    scripts: dict[str, Script] = {}
    for d in dirs:
        root = Path(d).expanduser()
        if not root.is_dir():
            continue
        for path in sorted(root.glob("*.py")):
            if path.stem in scripts or path.name.startswith("_"):
                continue
            try:
                source = path.read_text(errors="replace")
                doc = ast.get_docstring(ast.parse(source)) or ""
            except (OSError, SyntaxError) as exc:
                doc = f"(unreadable: {exc})"
            scripts[path.stem] = {"name": path.stem, "path": str(path), "description": doc.strip().split("\n")[0],
                                  "bytes": path.stat().st_size}
    return scripts


def find_pykdump(configured: str) -> str | None:
    candidates = [configured] if configured else []
    for d in PYKDUMP_DIRS:
        root = Path(d).expanduser()
        if root.is_dir():
            candidates += [str(p) for p in sorted(root.glob("mpykdump*.so"))]
    for c in candidates:
        if c and Path(c).is_file():
            return c
    return None
