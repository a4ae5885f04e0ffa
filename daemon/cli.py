"""The `diagd` command. Sub-commands import only what they need: `diagd mcp`, `status` and `call`
must start fast, so nothing here imports trio or mcp at module level."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from diagd.daemon import logtail, paths
from diagd.protocol.errors import DiagdError

# EXIT_NO_DAEMON also covers a daemon that refused us (busy) or closed the connection early.
EXIT_OK, EXIT_TOOL_ERROR, EXIT_USAGE, EXIT_NO_DAEMON = 0, 1, 2, 3


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    name = args.func.__name__.removeprefix("cmd_").replace("_", "-")
    try:
        return int(args.func(args))
    except _NoDaemon as exc:  # one line, never a traceback, whatever the command
        sys.stderr.write(f"diagd {name}: {exc}\n")
    except DiagdError as exc:
        sys.stderr.write(f"diagd {name}: {_describe(exc)}\n")
    except BrokenPipeError:  # `diagd logs | head`
        return EXIT_OK
    return EXIT_NO_DAEMON


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="diagd", description="diagnostics daemon for AI agents (MCP)")
    sub = p.add_subparsers()

    s = sub.add_parser("serve", help="run the daemon in the foreground (systemd runs this)")
    s.add_argument("--log-level", default=os.environ.get("DIAGD_LOG_LEVEL", "info"))
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("mcp", help="stdio shim for MCP clients (Claude Desktop, Cursor, ...)")
    s.add_argument("--no-autostart", action="store_true", help="fail instead of starting a daemon")
    s.add_argument("--tools", metavar="GROUPS", help="back ends to list, e.g. pcap,crash (default: [mcp] tools)")
    s.set_defaults(func=cmd_mcp)

    s = sub.add_parser("tools", help="list the tools (name, group, description), or print one's input schema")
    s.add_argument("name", nargs="?")
    s.add_argument("--json", action="store_true", help="the whole list as JSON")
    s.set_defaults(func=cmd_tools)

    s = sub.add_parser("start", help="start the daemon in the background unless it runs")
    s.set_defaults(func=cmd_start)
    s = sub.add_parser("stop", help="stop the running daemon")
    s.set_defaults(func=cmd_stop)

    s = sub.add_parser("status", help="daemon, actors and per-tool statistics")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("call", help="call a tool: diagd call TOOL key=value ... (needs a running daemon)")
    s.add_argument("tool")
    s.add_argument("arguments", nargs=argparse.REMAINDER, help="key=value (value parsed as JSON if it parses)")
    s.add_argument("--args-json", help="arguments as one JSON object")
    s.add_argument("--visibility", choices=("verbose", "simple", "off"), default=None)
    s.set_defaults(func=cmd_call)

    s = sub.add_parser("logs", help="show the audit log of tool calls")
    s.add_argument("-f", "--follow", action="store_true")
    s.add_argument("-n", "--lines", type=int, default=20)
    s.add_argument("--json", action="store_true", help="raw JSON lines")
    s.set_defaults(func=cmd_logs)

    s = sub.add_parser("reload", help="re-read the config file")
    s.set_defaults(func=cmd_reload)
    s = sub.add_parser("stop-actor", help="stop one actor by id")
    s.add_argument("actor_id")
    s.set_defaults(func=cmd_stop_actor)

    s = sub.add_parser("doctor", help="check external tools, privileges and directories")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_doctor)

    s = sub.add_parser("service", help="install the systemd user unit")
    s.add_argument("action", choices=("install", "uninstall", "print"))
    s.add_argument("--no-start", action="store_true")
    s.set_defaults(func=cmd_service)
    return p


# What `diagd serve` never needs but a library would import if it is installed: structlog imports
# rich and pygments (~6 MB; import-linter, a test dependency, installs them) for a console
# renderer the daemon does not use (it writes JSON lines). A None entry makes `import rich` fail
# in the daemon process only, and structlog goes on without it (issue 12: a lighter daemon).
NOT_IN_DAEMON = ("rich",)


def cmd_serve(args: argparse.Namespace) -> int:
    for name in NOT_IN_DAEMON:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    from diagd.daemon import config, logs

    logs.configure(args.log_level)
    import trio

    from diagd.daemon import server
    from diagd.protocol.errors import DiagdError

    try:
        cfg = config.load()
        trio.run(server.serve, cfg)
    except server.AlreadyRunning as exc:
        sys.stderr.write(f"diagd: {exc}\n")
        return 0 if os.environ.get("DIAGD_AUTOSTARTED") else 1
    except DiagdError as exc:
        sys.stderr.write(f"diagd: {exc.code}: {exc.message}\n")
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    from diagd.daemon import shim, toolscli

    first_line = toolscli.options_line(args.tools) if args.tools is not None else b""
    if first_line is None:
        return EXIT_USAGE
    return shim.run(autostart=not args.no_autostart, first_line=first_line)


def cmd_tools(args: argparse.Namespace) -> int:
    from diagd.daemon import toolscli
    from diagd.protocol import control

    return toolscli.show(_request(control.ToolsRequest), args.name, as_json=args.json)


def cmd_start(args: argparse.Namespace) -> int:
    from diagd.daemon import shim

    sock = shim.connect_or_start(paths.control_socket(), autostart=True)
    if sock is None:
        sys.stderr.write(f"diagd: the daemon did not start; see {paths.state_dir()}/daemon.log\n")
        return EXIT_NO_DAEMON
    sock.close()
    status = _request("status")
    print(f"diagd running: pid {status['daemon']['pid']}, sockets in {paths.runtime_dir()}")
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    from diagd.protocol import control
    from diagd.protocol.errors import DiagdError

    try:
        pid = _request("status")["daemon"]["pid"]
    except _NoDaemon:
        print("diagd is not running")
        return EXIT_OK
    except DiagdError as exc:
        return _fail("stop", exc)
    try:
        _request(control.ShutdownRequest)
    except DiagdError:
        pass  # the daemon may close the connection as it goes down: the pid tells
    for _ in range(200):  # up to 20 s for actors to release their resources
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print(f"diagd stopped (pid {pid})")
            return EXIT_OK
        time.sleep(0.1)
    sys.stderr.write(f"diagd: pid {pid} still running after 20 s\n")
    return EXIT_TOOL_ERROR


class _NoDaemon(Exception):
    pass


def _describe(exc: Exception) -> str:
    code = getattr(exc, "code", None)
    return f"{code}: {exc}" if code else str(exc)


def _fail(command: str, exc: Exception) -> int:
    sys.stderr.write(f"diagd {command}: {_describe(exc)}\n")
    return EXIT_NO_DAEMON


def _client() -> Any:
    """A control connection to the running daemon; _NoDaemon when none runs.

    Never starts one: `diagd status`, `call`, `reload` ... are one-shot commands, and a daemon
    started as their side effect would run with whatever environment, working directory and
    config that shell had, outside systemd, unnoticed. Starting is explicit (`diagd start`, the
    systemd unit); only the MCP shim autostarts, because an MCP client cannot run a command first.
    """
    from diagd.protocol.control import BlockingClient
    from diagd.protocol.errors import ErrorCode

    path = paths.control_socket()
    try:
        return BlockingClient(str(path), client=f"{os.getpid()}")
    except (FileNotFoundError, ConnectionRefusedError):
        raise _NoDaemon(f"diagd is not running (no socket at {path}); start it with `diagd start`") from None
    except OSError as exc:  # e.g. EACCES on a runtime dir that is not ours
        raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"cannot connect to {path}: {exc.strerror or exc}"
                         ) from None


def _request(kind: Any, **fields: Any) -> Any:
    from diagd.protocol import control

    make = {"status": control.StatusRequest, "reload": control.ReloadRequest}.get(kind, kind)
    with _client() as client:
        return client.request(make, **fields)


def cmd_status(args: argparse.Namespace) -> int:
    try:
        status = _request("status")
    except _NoDaemon as exc:
        if args.json:
            print(json.dumps({"running": False, "socket": str(paths.control_socket())}))
        else:
            print(str(exc))
        return EXIT_NO_DAEMON
    except DiagdError as exc:  # running, but refused us (busy) or hung up
        if args.json:
            print(json.dumps({"running": True, "error": exc.to_wire()}))
        return _fail("status", exc)
    if args.json:
        print(json.dumps({"running": True, **status}, indent=2))
    else:
        print(format_status(status))
    return EXIT_OK


def format_status(status: dict[str, Any]) -> str:
    d = status["daemon"]
    lines = [
        f"diagd {d['version']}  pid {d['pid']}  up {_duration(d['uptime_s'])}  since {d['started_at']}",
        f"config: {d['config']}   state: {d['state_dir']}",
        "sockets: " + "  ".join(f"{k}={v}" for k, v in d["sockets"].items()),
        f"clients ({len(d['clients'])}): "
        + (", ".join(f"{c['kind']}:{c['pid']} {c.get('state', '?')} since {c['connected_at']}" for c in d["clients"])
           or "none"),
        _memory_line(d),
        f"actors ({len(status['actors'])}):",
    ]
    rows: list[tuple[str, ...]] = [("ID", "KIND", "RESOURCE", "STATE", "INBOX", "IDLE LEFT", "RESTARTS")]
    for a in status["actors"]:
        idle = "-" if a["idle_s_left"] is None else _duration(a["idle_s_left"])
        rows.append((a["id"], a["kind"], a["resource"], a["state"], str(a["inbox_depth"]), idle, str(a["restarts"])))
    lines += _table(rows) if len(rows) > 1 else ["  none"]
    workers = [("PID", "ROLE", "ACTOR", "RSS")] + [
        (str(w["pid"]), w["role"], a["id"], _mb(w.get("rss_bytes")))
        for a in status["actors"] for w in a.get("details", {}).get("workers", [])]
    if len(workers) > 1:
        lines.append(f"workers ({len(workers) - 1}):")
        lines += _table(workers)
    lines.append(f"tools ({d['calls_total']} calls):")
    rows = [("TOOL", "COUNT", "P50 MS", "P95 MS", "FAIL %")]
    for name, t in status["tools"].items():
        rows.append((name, str(t["count"]), _ms(t["p50_ms"]), _ms(t["p95_ms"]), f"{t['failure_rate'] * 100:.1f}"))
    lines += _table(rows) if len(rows) > 1 else ["  no calls yet"]
    return "\n".join(lines)


def _memory_line(d: dict[str, Any]) -> str:
    """The daemon's own RSS and its workers' (sharkd, crash, drgn, bpftrace) added up."""
    return (f"memory: daemon rss {_mb(d.get('rss_bytes'))}, {d.get('workers', 0)} workers rss "
            f"{_mb(d.get('workers_rss_bytes'))}")


def _mb(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.1f} MB"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def cmd_call(args: argparse.Namespace) -> int:
    from diagd.daemon import callcli
    from diagd.protocol import control
    from diagd.protocol.errors import DiagdError

    try:
        tokens, options = callcli.split_options(args.arguments)
        arguments = callcli.parse_arguments(tokens, options.get("args_json", args.args_json))
    except callcli.ArgumentError as exc:
        sys.stderr.write(f"diagd call: {exc}\n")
        return EXIT_USAGE
    visibility = options.get("visibility") or args.visibility or _configured_visibility()
    callcli.banner_before(args.tool, arguments, visibility)
    started = time.monotonic()
    try:
        reply = _request(control.CallRequest, tool=args.tool, arguments=arguments)
    except (_NoDaemon, DiagdError) as exc:
        callcli.banner_after(args.tool, arguments, time.monotonic() - started, visibility)
        sys.stderr.write(f"diagd call: {_describe(exc)}\n")
        return EXIT_NO_DAEMON
    callcli.banner_after(args.tool, arguments, time.monotonic() - started, visibility)
    sys.stdout.write(json.dumps(reply["result"], separators=(",", ":"), ensure_ascii=False) + "\n")
    return EXIT_TOOL_ERROR if reply["is_error"] else EXIT_OK


def _configured_visibility() -> str:
    from diagd.daemon import config
    from diagd.protocol.errors import DiagdError

    try:
        return str(config.load().daemon.visibility)
    except DiagdError:
        return "verbose"


def cmd_logs(args: argparse.Namespace) -> int:
    state = paths.state_dir()
    if problem := paths.private_dir_problem(state):  # records from a dir someone else controls prove nothing
        sys.stderr.write(f"diagd logs: refusing state directory {state}: {problem}\n")
        return EXIT_TOOL_ERROR
    path = state / "audit.jsonl"
    if not path.exists():
        sys.stderr.write(f"no audit log yet at {path}\n")
        return EXIT_OK if not args.follow else logtail.follow(path, raw=args.json)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            tail = f.readlines()[-args.lines:] if args.lines > 0 else []
    except OSError as exc:
        sys.stderr.write(f"diagd logs: cannot read {path}: {exc.strerror or exc}\n")
        return EXIT_TOOL_ERROR
    for line in tail:
        logtail.print_record(line, raw=args.json)
    if args.follow:
        return logtail.follow(path, raw=args.json)
    return EXIT_OK


def cmd_reload(args: argparse.Namespace) -> int:
    from diagd.protocol.errors import DiagdError

    try:
        print(json.dumps(_request("reload")))
    except (_NoDaemon, DiagdError) as exc:
        sys.stderr.write(f"diagd reload: {_describe(exc)}\n")
        return EXIT_TOOL_ERROR
    return EXIT_OK


def cmd_stop_actor(args: argparse.Namespace) -> int:
    from diagd.protocol import control
    from diagd.protocol.errors import DiagdError

    try:
        print(json.dumps(_request(control.StopActorRequest, actor_id=args.actor_id)))
    except (_NoDaemon, DiagdError) as exc:
        sys.stderr.write(f"diagd stop-actor: {_describe(exc)}\n")
        return EXIT_TOOL_ERROR
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    from diagd.daemon import doctor

    return int(doctor.run(as_json=args.json))


def cmd_service(args: argparse.Namespace) -> int:
    from diagd.daemon import service

    return int(service.run(args.action, start=not args.no_start))


if __name__ == "__main__":
    sys.exit(main())
