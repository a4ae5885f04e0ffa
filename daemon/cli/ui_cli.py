"""`diagd ui [--print]`: log a browser into the web view (/ui on the HTTP listener) with a one-time link.

The running daemon mints the link (control socket, `ui_login`): `/ui/login?once=<secret>`, good once
and for two minutes. `--print` writes it to stdout; otherwise it opens in the browser (`webbrowser`)
through a redirect file in the owner-only runtime directory, the way Jupyter does, so the secret never
appears on a command line other users can read (`ps`); without a graphical session or `$BROWSER`, or
when no browser starts, the link is printed instead. With `[http] listen` unset, it says which setting
turns the listener on (exit FAILED). Stdlib only: no Trio, no MCP SDK.
"""

from __future__ import annotations

import html
import os
import sys
from collections.abc import Callable
from typing import Any

from diagd.daemon import config, paths
from diagd.daemon.exits import EXIT_FAILED, EXIT_OK
from diagd.protocol.errors import ErrorCode

REDIRECT_FILE = "ui-login.html"
HTTP_OFF = ('the web view is served by the HTTP listener, which is off: set `listen = "127.0.0.1:8765"` in the '
            '[http] table of {config} (and a token: `diagd token add NAME` for MCP clients), then `diagd restart`')


def run(*, print_only: bool, login: Callable[[], dict[str, Any]]) -> int:
    """`login` asks the running daemon for a link (raising as the CLI's requests do when none runs)."""
    cfg = config.load()
    if not cfg.http.enabled:
        where = cfg.source if not cfg.source.startswith("<") else str(paths.config_file())
        sys.stderr.write(f"diagd ui: {ErrorCode.BACKEND_UNAVAILABLE}: {HTTP_OFF.format(config=where)}\n")
        return EXIT_FAILED
    link = login()
    url, view, ttl = str(link["url"]), str(link["view"]), float(link["expires_in_s"])
    if not print_only and _open(url):
        sys.stderr.write(f"diagd ui: the web view ({view}) opened in your browser; if it did not, "
                         "run `diagd ui --print` and open the link it prints\n")
        return EXIT_OK
    print(url)  # stdout: the link alone, for a script or another machine's browser (through a tunnel)
    sys.stderr.write(f"diagd ui: open this link within {ttl:g} s; it logs one browser in, once ({view})\n")
    return EXIT_OK


def _open(url: str) -> bool:
    """Open `url` in the user's browser through a redirect file; False when there is no browser to open."""
    if not (os.environ.get("BROWSER") or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return False  # no graphical session: webbrowser would start a text browser in this terminal
    import webbrowser

    page = (f'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={html.escape(url)}">'
            f'<title>diagd</title><a href="{html.escape(url)}">diagd web view</a>\n')
    rundir = paths.open_private_dir(paths.runtime_dir(), what="runtime directory")
    try:
        fd = rundir.open(REDIRECT_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with os.fdopen(fd, "w") as out:
            out.write(page)
        target = (rundir.path / REDIRECT_FILE).as_uri()
    finally:
        rundir.close()
    try:
        return webbrowser.open(target)
    except webbrowser.Error:
        return False
