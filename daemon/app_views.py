"""Where the daemon finds its views (MCP Apps, SEP-1865: docs/views.md), and what `diagd doctor` says of them.

A view is one self-contained HTML file, `<name>.html`, built from daemon/views by scripts/build-views.sh; a
tool names it by `ToolSet.tool(..., ui="ui://diagd/<name>")`. The views' directory is $DIAGD_VIEWS_DIR when
set, else the package's own `views/dist` (where `build-views.sh --install` copies them: an editable install
reads them there, a wheel built afterwards ships them). Without a built view a tool is listed as it always
was, without `_meta.ui`; `diagd doctor` says why. Stdlib only: the CLI imports it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV = "DIAGD_VIEWS_DIR"
SCHEME = "ui://diagd/"
MIME_TYPE = "text/html;profile=mcp-app"  # the MCP Apps profile of HTML
EXTENSION_ID = "io.modelcontextprotocol/ui"
MAX_BYTES = 300 * 1024  # a view larger than this is refused (the build checks it too)
PACKAGED = Path(__file__).resolve().parent / "views" / "dist"
BUILD_HINT = "scripts/build-views.sh --install (needs npm), or set DIAGD_VIEWS_DIR to a built views directory"


@dataclass(frozen=True)
class Place:
    """Where views are looked for, and why there."""

    directory: Path
    why: str  # "DIAGD_VIEWS_DIR" or "package"


def place() -> Place:
    override = os.environ.get(ENV)
    if override:
        return Place(Path(override).expanduser(), ENV)
    return Place(PACKAGED, "package")


def name_of(uri: str) -> str | None:
    """The view a `ui://diagd/<name>` URI names (None: not a diagd view URI)."""
    if not uri.startswith(SCHEME):
        return None
    name = uri[len(SCHEME):]
    ok = name and all(c.isalnum() or c in "-_" for c in name)
    return name if ok else None


def uri_of(name: str) -> str:
    return SCHEME + name


def path_of(uri: str, where: Place | None = None) -> Path | None:
    """The built file of the view `uri`, None when it is not built (or not a diagd view URI)."""
    name = name_of(uri)
    if name is None:
        return None
    found = (where or place()).directory / f"{name}.html"
    try:
        return found if found.is_file() and found.stat().st_size <= MAX_BYTES else None
    except OSError:
        return None


def built(where: Place | None = None) -> list[str]:
    """The names of the views built in the views' directory."""
    here = where or place()
    try:
        return sorted(p.stem for p in here.directory.glob("*.html") if name_of(uri_of(p.stem)) is not None)
    except OSError:
        return []


def status(where: Place | None = None) -> tuple[bool, str]:
    """(views are there, what `diagd doctor` shows)."""
    here = where or place()
    names = built(here)
    source = f"${ENV}" if here.why == ENV else "the package"
    if not names:
        return False, (f"not built: no view in {here.directory} ({source}); tools are listed without "
                       "their MCP Apps view (_meta.ui)")
    return True, f"{', '.join(names)} in {here.directory} ({source})"
