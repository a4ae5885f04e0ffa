"""The `diagd` command. Sub-commands import only what they need: `diagd mcp`, `status` and `call`
must start fast, so nothing here imports trio or mcp at module level."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from diagd import __version__
from diagd.daemon import paths
from diagd.daemon.cli import clients, examples, logtail, setup_cli
from diagd.daemon.exits import EXIT_FAILED, EXIT_NO_DAEMON, EXIT_OK, EXIT_USAGE
from diagd.protocol.errors import DiagdError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--argv-hex"]:  # a command sent by `--ssh` from another host (daemon/cli/remote.py)
        from diagd.daemon.cli import remote

        try:
            argv = remote.decode_argv(argv)
        except DiagdError as exc:
            sys.stderr.write(f"diagd: {exc.code}: {exc.message}\n")
            return EXIT_USAGE
    if any(a.startswith(("--ssh", "--remote-diagd")) for a in argv):  # the same command on another host
        from diagd.daemon.cli import remote

        return remote.main(argv)
    parser = _parser()
    declared = _declared(argv[:1], parser.get_default("declared_commands"))
    # A back end's command parses its own arguments (`--help` included): handed everything after its name.
    args = argparse.Namespace(func=declared, rest=argv[1:]) if declared else parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    name = args.func.__name__.removeprefix("cmd_").replace("_", "-")
    try:
        return int(args.func(args))
    except (_NoDaemon, DiagdError) as exc:  # one line, never a traceback, whatever the command
        return _fail(name, exc)
    except BrokenPipeError:  # `diagd logs | head`
        return EXIT_OK


def _remote_options(s: argparse.ArgumentParser) -> None:
    """Documented here for --help; main() hands a command line holding them to daemon/cli/remote.py."""
    s.add_argument("--ssh", metavar="[USER@]HOST[:PORT]", help="run this command on HOST through OpenSSH")
    s.add_argument("--ssh-option", metavar="OPTION", action="append", help="an extra `ssh -o OPTION` (repeatable)")
    s.add_argument("--remote-diagd", metavar="PATH", help="diagd on the remote host (default: diagd on its PATH)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="diagd", description="diagnostics daemon for AI agents (MCP)")
    p.add_argument("--version", action="version", version=f"diagd {__version__}")
    sub = p.add_subparsers()

    s = sub.add_parser("serve", help="run the daemon in the foreground (systemd runs this)")
    s.add_argument("--log-level", default=os.environ.get("DIAGD_LOG_LEVEL", "info"),
                   help="debug, info, warning or error (default: $DIAGD_LOG_LEVEL, else info)")
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("mcp", help="stdio shim for MCP clients (Claude Desktop, Cursor, ...)")
    s.add_argument("--no-autostart", action="store_true", help="fail instead of starting a daemon")
    s.add_argument("--tools", metavar="GROUPS", help="back ends to list, comma-separated (default: [mcp] tools)")
    _remote_options(s)
    s.set_defaults(func=cmd_mcp)

    s = sub.add_parser("tools", help="list the tools (name, group, description), or print one's input schema")
    s.add_argument("name", nargs="?", help="a tool: print its input schema (JSON)")
    s.add_argument("--json", action="store_true", help="the whole list as JSON")
    s.add_argument("--output", action="store_true",
                   help="with NAME: print its output schema (generated from its reply model, "
                        "as tools/list gives it)")
    s.set_defaults(func=cmd_tools)

    s = sub.add_parser("start", help="start the daemon in the background unless it runs")
    s.set_defaults(func=cmd_start)
    sub.add_parser("stop", help="stop the running daemon").set_defaults(func=cmd_stop)
    sub.add_parser("restart", help="stop the daemon and start it again (systemctl --user restart diagd "
                   "under the user service); MCP sessions carry on").set_defaults(func=cmd_restart)

    s = sub.add_parser("status", help="daemon, actors and per-tool statistics")
    s.add_argument("--json", action="store_true", help="the whole status as JSON")
    s.add_argument("--memory", action="store_true",
                   help="top heap growth by traceback (a daemon started with DIAGD_TRACEMALLOC=N; debug only)")
    _remote_options(s)
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("call", help="call a tool: diagd call TOOL key=value ... (needs a running daemon)")
    s.add_argument("tool", help="the tool's name (diagd tools lists them)")
    s.add_argument("arguments", nargs=argparse.REMAINDER, help="key=value (value parsed as JSON if it parses)")
    s.add_argument("--args-json", help="arguments as one JSON object")
    s.add_argument("--visibility", choices=("verbose", "simple", "off"), default=None,
                   help="banners on stderr: verbose (with arguments), simple, off (default: [daemon] visibility)")
    _remote_options(s)
    s.set_defaults(func=cmd_call)

    s = sub.add_parser("logs", help="show the audit log of tool calls")
    s.add_argument("-f", "--follow", action="store_true", help="keep printing new records (across rotations)")
    s.add_argument("-n", "--lines", type=int, default=20, help="how many of the last records (default: 20)")
    s.add_argument("--json", action="store_true", help="raw JSON lines")
    _remote_options(s)
    s.set_defaults(func=cmd_logs)

    s = sub.add_parser("reload", help="re-read the config file")
    s.set_defaults(func=cmd_reload)
    s = sub.add_parser("stop-actor", help="stop one actor by id")
    s.add_argument("actor_id", help="its id, as diagd status shows it (e.g. serial-3)")
    s.set_defaults(func=cmd_stop_actor)

    s = sub.add_parser("ui", help="open the live web view of the calls and actors in the browser (one-time login "
                       "link; needs [http] listen)")
    s.add_argument("--print", action="store_true", dest="print_only",
                   help="print the one-time login link instead of opening a browser")
    s.set_defaults(func=cmd_ui)

    s = sub.add_parser("doctor", help="check external tools, privileges and directories")
    s.add_argument("--json", action="store_true", help="the checks as JSON")
    _remote_options(s)
    s.set_defaults(func=cmd_doctor)

    _admin_parsers(sub)
    # The back ends' own commands (`diagd.commands` entry points), found by name: kept on the parser.
    p.set_defaults(declared_commands=_declared_commands(sub))
    setup_cli.add_parser(sub)
    return p


def _admin_parsers(sub: Any) -> None:
    """Commands that need no daemon: the version, HTTP tokens, the systemd units, MCP hosts, samples."""
    s = sub.add_parser("version", help="print diagd's version (what `--ssh` compares)")
    s.set_defaults(func=cmd_version)

    s = sub.add_parser("token", help="bearer tokens for MCP over HTTP: add NAME, list, revoke NAME")
    s.add_argument("action", choices=("add", "list", "revoke"), help="add NAME, list, or revoke NAME")
    s.add_argument("name", nargs="?", help="the token's name (add, revoke)")
    s.add_argument("--json", action="store_true", help="as JSON")
    s.set_defaults(func=cmd_token)

    s = sub.add_parser("service", help="install the systemd user unit (--socket: socket activation)")
    s.add_argument("action", choices=("install", "uninstall", "print"), help="install, uninstall, or print the units")
    s.add_argument("--no-start", action="store_true", help="install without enabling and starting it")
    s.add_argument("--socket", action="store_true",
                   help="also diagd.socket: systemd listens and starts the daemon on the first client")
    s.set_defaults(func=cmd_service)

    clients.add_parser(sub, served=served_catalogue)  # diagd client add HOST | remove HOST | list
    examples.add_parser(sub)  # diagd examples [--copy DIR]: the sample captures shipped with diagd


# What `diagd serve` never needs but a library would import if it is installed: structlog imports
# rich and pygments (~6 MB; import-linter, a test dependency, installs them) for a console
# renderer the daemon does not use (it writes JSON lines). A None entry makes `import rich` fail
# in the daemon process only, and structlog goes on without it (issue 12: a lighter daemon).
NOT_IN_DAEMON = ("rich",)


def cmd_serve(args: argparse.Namespace) -> int:
    from diagd.daemon import launch

    launch.settle()  # in `/`, nothing of its start directory on sys.path, before trio or msgpack is imported
    for name in NOT_IN_DAEMON:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    from diagd.daemon import config
    from diagd.daemon.server import logs

    logs.configure(args.log_level)
    import trio

    from diagd.daemon.server import server

    try:
        cfg = config.load()
        trio.run(server.serve, cfg)
    except server.AlreadyRunning as exc:
        sys.stderr.write(f"diagd: {exc}\n")
        return EXIT_OK if os.environ.get("DIAGD_AUTOSTARTED") else EXIT_FAILED
    except DiagdError as exc:
        sys.stderr.write(f"diagd: {exc.code}: {exc.message}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def cmd_mcp(args: argparse.Namespace) -> int:
    from diagd.daemon.cli import toolscli
    from diagd.daemon.shim import shim

    first_line = toolscli.options_line(args.tools) if args.tools is not None else b""
    if first_line is None:
        return EXIT_USAGE
    return shim.run(autostart=not args.no_autostart, prelude=[first_line] if first_line else ())


def cmd_tools(args: argparse.Namespace) -> int:
    """The running daemon's tools; with none running, the installed back ends' under this config (as
    `diagd start` would serve them), built here: no daemon is started for a listing (see _client)."""
    from diagd.daemon.cli import toolscli
    from diagd.protocol import control

    try:
        catalogue = _request(control.ToolsRequest)
    except _NoDaemon:
        catalogue, source = _offline_catalogue()
        sys.stderr.write(f"diagd tools: no daemon runs: the installed back ends' tools under {source}, as a "
                         "daemon started now would serve them\n")
    return toolscli.show(catalogue, args.name, as_json=args.json, output=args.output)


def _offline_catalogue() -> tuple[dict[str, Any], str]:
    """The catalogue a daemon started now with this config would serve, and that config's source: built in
    this process by the daemon's own code (server.offline_catalogue), in a throwaway temporary state and
    runtime dir; no socket, actor or process is started."""
    from diagd.daemon import config
    from diagd.daemon.server import server

    cfg = config.load()
    where = f"the defaults (no {paths.config_file()})" if cfg.source.startswith("<") else cfg.source
    return server.offline_catalogue(cfg), where


def served_catalogue() -> dict[str, Any]:
    """What the running daemon serves, else (none runs, or it refused us) what one started now would:
    `diagd client add` checks its groups against it (daemon/cli/clients.py cannot import the server)."""
    from diagd.protocol import control

    try:
        return dict(_request(control.ToolsRequest))
    except (_NoDaemon, DiagdError):
        return _offline_catalogue()[0]


def cmd_start(args: argparse.Namespace) -> int:
    return _start("start")


def _start(command: str, *, by_systemd: bool = False) -> int:
    """Start the daemon the way the shim autostarts it (`by_systemd`: wait, bounded, for the one the
    user service started); return once its control socket answers, which it does only when every
    listener (HTTP too) accepts."""
    from diagd.daemon import launch
    from diagd.daemon.shim import shim

    try:
        if by_systemd:
            sock = shim.wait_for_socket(paths.control_socket(), shim.AUTOSTART_WAIT_S)
        else:
            sock = shim.connect_or_start(paths.control_socket(), autostart=True)
    except DiagdError as exc:  # e.g. a planted link where its log would go: no daemon was started
        sys.stderr.write(f"diagd {command}: {_describe(exc)}\n")
        return EXIT_NO_DAEMON
    if sock is None and by_systemd:
        sys.stderr.write(f"diagd {command}: the user service did not come back within {shim.AUTOSTART_WAIT_S:g} s;"
                         " see `journalctl --user -u diagd`\n")
        return EXIT_NO_DAEMON
    if sock is None:
        why = launch.last_log_line()  # `diagd serve` ends its log with why it stopped, e.g. a config error
        sys.stderr.write(f"diagd {command}: the daemon did not start ({why}); see {paths.state_dir()}/daemon.log\n")
        return EXIT_NO_DAEMON
    sock.close()
    status = _request("status")
    print(f"diagd running: pid {status['daemon']['pid']}, sockets in {paths.runtime_dir()}")
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    try:
        pid = _request("status")["daemon"]["pid"]
    except _NoDaemon:
        print("diagd is not running")
        return EXIT_OK
    except DiagdError as exc:
        return _fail("stop", exc)
    return _stop(pid, "stop")


STOP_WAIT_S = 20.0  # for actors to release their resources (a capture written out, a dump session ended)


def _stop(pid: int, command: str) -> int:
    """Ask the daemon `pid` to shut down and wait, bounded, until that pid is gone."""
    from diagd.protocol import control

    try:
        _request(control.ShutdownRequest)
    except (_NoDaemon, DiagdError):
        pass  # the daemon may close the connection as it goes down: the pid tells
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print(f"diagd stopped (pid {pid})")
            return EXIT_OK
        time.sleep(0.1)
    sys.stderr.write(f"diagd {command}: pid {pid} still running after {STOP_WAIT_S:g} s; see "
                     f"{paths.state_dir()}/daemon.log\n")
    return EXIT_FAILED


def cmd_restart(args: argparse.Namespace) -> int:
    """The user service's daemon through systemd (which would restart it on its own terms otherwise);
    any other one stopped (its pid gone) and started again as `diagd start` does. HTTP sessions are
    revived from http_sessions.json, stdio shims reconnect and replay: clients carry on."""
    from diagd.daemon.cli import service

    try:
        pid: int | None = _request("status")["daemon"]["pid"]
    except _NoDaemon:
        pid = None
    if pid is not None and service.is_service_daemon(pid):
        if not service.restart():
            sys.stderr.write("diagd restart: systemctl --user restart diagd failed; see "
                             "`journalctl --user -u diagd`\n")
            return EXIT_FAILED
        return _start("restart", by_systemd=True)  # Type=notify: back once READY, every listener accepting
    if pid is not None and (done := _stop(pid, "restart")) != EXIT_OK:
        return done
    return _start("restart")


class _NoDaemon(Exception):
    pass


def _describe(exc: Exception) -> str:
    code = getattr(exc, "code", None)
    return f"{code}: {exc}" if code else str(exc)


def _fail(command: str, exc: Exception) -> int:
    """One line on stderr, and the status: NO_DAEMON when no daemon served the command (none runs, or it
    refused the connection as busy, hung up or did not answer), else FAILED: the daemon, or this command,
    refused what was asked (daemon/exits.py)."""
    from diagd.protocol.control import NotServed

    sys.stderr.write(f"diagd {command}: {_describe(exc)}\n")
    return EXIT_NO_DAEMON if isinstance(exc, (_NoDaemon, NotServed)) else EXIT_FAILED


def _client() -> Any:
    """A control connection to the running daemon; _NoDaemon when none runs.

    Never starts one: `diagd status`, `call`, `reload` ... are one-shot commands, and a daemon
    started as their side effect would run with whatever environment, working directory and
    config that shell had, outside systemd, unnoticed. Starting is explicit (`diagd start`, the
    systemd unit); only the MCP shim autostarts, because an MCP client cannot run a command first.
    """
    from diagd.protocol.control import BlockingClient, NotServed
    from diagd.protocol.errors import ErrorCode

    path = paths.control_socket()
    try:
        return BlockingClient(str(path), client=f"{os.getpid()}")
    except (FileNotFoundError, ConnectionRefusedError):
        raise _NoDaemon(f"diagd is not running (no socket at {path}); start it with `diagd start`") from None
    except OSError as exc:  # e.g. EACCES on a runtime dir that is not ours
        raise NotServed(ErrorCode.BACKEND_UNAVAILABLE, f"cannot connect to {path}: {exc.strerror or exc}"
                        ) from None


COMMANDS = "diagd.commands"  # entry points: a back end's command, a module with main(argv, call_tool, state_dir)


def _declared_commands(sub: Any) -> dict[str, str]:
    """A subcommand per `diagd.commands` entry point (listed in `diagd --help`), its module imported only
    when it runs (a back end's package is heavy; `diagd status` starts fast); main() hands it the rest
    of the command line, which it parses itself."""
    from importlib import metadata

    added = {}
    for point in sorted(metadata.entry_points(group=COMMANDS), key=lambda p: p.name):
        if point.name not in sub.choices:  # never over one of diagd's own
            sub.add_parser(point.name, help=f"a back end's command (diagd {point.name} --help)", add_help=False)
            added[point.name] = point.value
    return added


def _declared(first: list[str], commands: dict[str, str]) -> Any:
    """The function that runs the back end's command named by `first` (None: not one)."""
    module = commands.get(first[0]) if first else None
    if module is None:
        return None

    def run_declared(args: argparse.Namespace) -> int:
        return _run_declared(module, args.rest)
    return run_declared


def _run_declared(module: str, argv: list[str]) -> int:
    import importlib

    state = paths.recorded_daemon_env().get("DIAGD_STATE_DIR")
    main = importlib.import_module(module).main
    return int(main(argv, _call_tool, Path(state) if state else paths.state_dir()))


def _call_tool(tool: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """One tool call through the running daemon, as `diagd call` makes it: (result, is_error)."""
    from diagd.protocol import control

    with _client() as client:
        reply = client.request(control.CallRequest, tool=tool, arguments=arguments, progress=False)
    return reply["result"], bool(reply["is_error"])


def _request(kind: Any, **fields: Any) -> Any:
    from diagd.protocol import control

    make = {"status": control.StatusRequest, "reload": control.ReloadRequest}.get(kind, kind)
    with _client() as client:
        return client.request(make, **fields)


def cmd_status(args: argparse.Namespace) -> int:
    try:
        status = _request("status", memory=True) if args.memory else _request("status")
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
    elif args.memory:
        from diagd.daemon.memtrace import format_report

        print(format_report(status["memory"]))
    else:
        from diagd.daemon.cli.status_text import format_status

        print(format_status(status))
    return EXIT_OK


def cmd_call(args: argparse.Namespace) -> int:
    from diagd.daemon.cli import callcli, progressline
    from diagd.protocol import control

    try:
        tokens, options = callcli.split_options(args.arguments)
        pairs, raw = callcli.split_raw(tokens)
        arguments = callcli.parse_arguments(pairs, options.get("args_json", args.args_json))
    except callcli.ArgumentError as exc:
        sys.stderr.write(f"diagd call: {exc}\n")
        return EXIT_USAGE
    visibility = options.get("visibility") or args.visibility or _configured_visibility()
    line = progressline.for_stderr(visibility)  # None unless stderr is a terminal: then none is asked for
    try:
        client = _client()  # before any banner: with no daemon there is no call to announce
        taken = _take_raw(args.tool, raw, arguments) if raw else []
        if taken is None:
            return EXIT_USAGE
        callcli.banner_before(args.tool, arguments, visibility, taken=taken)
        started = time.monotonic()
        with client:
            reply = client.request(control.CallRequest, tool=args.tool, arguments=arguments,
                                   progress=line is not None, on_progress=line.report if line else None)
    except (_NoDaemon, DiagdError) as exc:  # no result: no result banner
        if line:
            line.clear()
        return _fail("call", exc)
    if line:
        line.clear()
    callcli.banner_after(args.tool, arguments, time.monotonic() - started, visibility)
    sys.stdout.write(json.dumps(reply["result"], separators=(",", ":"), ensure_ascii=False) + "\n")
    if reply["is_error"]:  # on stdout, as any result; an unknown tool is a usage error, as in `diagd tools NAME`
        return EXIT_USAGE if _unknown_tool(args.tool) else EXIT_FAILED
    return EXIT_OK


def _unknown_tool(name: str) -> bool:
    """Whether the running daemon has no tool `name` (False when it cannot be asked)."""
    from diagd.protocol import control

    try:
        return name not in {t["name"] for t in _request(control.ToolsRequest)["tools"]}
    except (_NoDaemon, DiagdError):
        return False


def _take_raw(tool: str, raw: list[str], arguments: dict[str, Any]) -> list[tuple[str, str]] | None:
    """Raw words go to the tool's required arguments not given (its schema from the daemon); None: refused."""
    from diagd.daemon.cli import callcli
    from diagd.protocol import control

    tools = {t["name"]: t for t in _request(control.ToolsRequest)["tools"]}
    schema = tools[tool]["input_schema"] if tool in tools else {}
    try:
        return callcli.take_raw(raw, arguments, schema)
    except callcli.ArgumentError as exc:
        sys.stderr.write(f"diagd call: {exc}\n")
        return None


def _configured_visibility() -> str:
    from diagd.daemon import config

    try:
        return str(config.load().daemon.visibility)
    except DiagdError:
        return "verbose"


def cmd_logs(args: argparse.Namespace) -> int:
    return logtail.run(lines=args.lines, follow_on=args.follow, raw=args.json)


def cmd_reload(args: argparse.Namespace) -> int:

    try:
        print(json.dumps(_request("reload")))
    except (_NoDaemon, DiagdError) as exc:
        return _fail("reload", exc)
    return EXIT_OK


def cmd_stop_actor(args: argparse.Namespace) -> int:
    from diagd.protocol import control

    try:
        print(json.dumps(_request(control.StopActorRequest, actor_id=args.actor_id)))
    except (_NoDaemon, DiagdError) as exc:
        return _fail("stop-actor", exc)
    return EXIT_OK


def cmd_ui(args: argparse.Namespace) -> int:
    from diagd.daemon.cli import ui_cli
    from diagd.protocol import control

    return ui_cli.run(print_only=args.print_only, login=lambda: dict(_request(control.UiLoginRequest)))


def cmd_doctor(args: argparse.Namespace) -> int:
    from diagd.daemon.cli import doctor

    return int(doctor.run(as_json=args.json))


def cmd_version(args: argparse.Namespace) -> int:
    print(f"diagd {__version__}")
    return EXIT_OK


def cmd_token(args: argparse.Namespace) -> int:
    from diagd.daemon.cli import token_cli

    return int(token_cli.run(args.action, args.name, as_json=args.json))


def cmd_service(args: argparse.Namespace) -> int:
    from diagd.daemon.cli import service

    return int(service.run(args.action, start=not args.no_start, socket=args.socket))


if __name__ == "__main__":
    sys.exit(main())
