"""`diagd doctor`: check every external tool, privilege and directory; say how to fix each.

The probes back ends share (tools, privileges, tracefs, the sandbox) live in `diagd.actors.system`;
each back end says which it needs (`SYSTEM_NEEDS`, read by `backend_needs`), and the report groups
them under its name with the `diagd setup NAME` that installs what is missing. The daemon's own
checks (runtime dir, config, a running daemon) are here.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, replace

from diagd.actors import system
from diagd.actors.system import Check
from diagd.daemon import app_views, paths
from diagd.daemon.exits import EXIT_FAILED, EXIT_OK


def check_runtime_dir() -> Check:
    rd = paths.runtime_dir()
    if not rd.exists():
        return Check("runtime dir", True, f"{rd} (created with mode 0700 when the daemon starts)", required=True)
    st = rd.stat()
    problems = []
    if st.st_uid != os.getuid():
        problems.append(f"owned by uid {st.st_uid}")
    if stat.S_IMODE(st.st_mode) != 0o700:
        problems.append(f"mode {stat.S_IMODE(st.st_mode):o}")
    for sock in rd.glob("*.sock"):
        mode = stat.S_IMODE(sock.stat().st_mode)
        if mode != 0o600:
            problems.append(f"{sock.name} mode {mode:o}")
    if problems:
        return Check("runtime dir", False, f"{rd}: " + ", ".join(problems),
                     f"chmod 700 {rd}; or stop diagd and remove {rd}", required=True)
    return Check("runtime dir", True, f"{rd} (0700, sockets 0600)", required=True)


def check_config() -> Check:
    from diagd.daemon import config
    from diagd.protocol.errors import DiagdError

    try:
        cfg = config.load()
    except DiagdError as exc:
        return Check("config", False, exc.message, "fix the TOML file (see docs/configuration.md)", True)
    return Check("config", True, cfg.source, required=True)


def check_daemon() -> Check:
    from diagd.daemon.shim.shim import connect

    sock = connect(paths.control_socket())
    if sock is None:
        return Check("daemon", False, "not running", "diagd start   (or: systemctl --user start diagd)")
    sock.close()
    return Check("daemon", True, f"listening on {paths.control_socket()}")


def check_views() -> Check:
    """The tools' MCP Apps views (docs/views.md): without them tools are listed without `_meta.ui`."""
    ok, detail = app_views.status()
    return Check("views", ok, detail, "" if ok else app_views.BUILD_HINT)


def daemon_checks() -> list[Check]:
    return [
        *(system.check_python_module(m) for m in ("trio", "mcp", "msgpack", "structlog", "jsonschema")),
        *system.check_sandbox(),
        check_runtime_dir(),
        check_config(),
        check_daemon(),
        check_views(),
    ]


def backend_checks() -> dict[str, list[Check]]:
    """Back-end name -> its checks; a missing tool's fix is `diagd setup NAME`."""
    from diagd.daemon.cli import backend_needs

    grouped: dict[str, list[Check]] = {}
    for name, needs in backend_needs.declared().items():
        tools = {t.command: t.package for t in needs.tools}
        grouped[name] = [replace(c, fix=f"diagd setup {name}   (apt: {tools[c.name]})") if c.name in tools and not c.ok
                         else c for c in needs.run_checks()]
    return grouped


def all_checks() -> list[tuple[str, Check]]:
    """(group, check): "diagd" for the daemon's own, else the back end's name."""
    return [*(("diagd", c) for c in daemon_checks()),
            *((name, c) for name, checks in backend_checks().items() for c in checks)]


def run(*, as_json: bool = False) -> int:
    checks = all_checks()
    if as_json:
        print(json.dumps([{**asdict(c), "group": group} for group, c in checks], indent=2))
    else:
        shown = None
        for group, c in checks:
            if group != shown:
                failed = [x.name for g, x in checks if g == group and not x.ok]
                print(f"{group}: " + (f"needs attention ({', '.join(failed)})" if failed else "ready"))
                shown = group
            mark = "ok  " if c.ok else ("FAIL" if c.required else "warn")
            print(f"  [{mark}] {c.name:<22} {c.detail}")
            if not c.ok and c.fix:
                print(f"         fix: {c.fix}")
    return EXIT_FAILED if any(c.required and not c.ok for _, c in checks) else EXIT_OK
