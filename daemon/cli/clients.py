"""`diagd client add|remove HOST` / `diagd client list`: diagd in the MCP configuration of desktop and editor hosts.

Each host keeps its MCP servers in a JSON file, under a key of its own:

    claude-desktop  ~/.config/Claude/claude_desktop_config.json (macOS: ~/Library/Application Support/Claude/)
                    {"mcpServers": {"diagd": {"command": ..., "args": [...]}}}
    claude-code     user: ~/.claude.json, project: ./.mcp.json (what `claude mcp add --scope user|project`
                    writes)   {"mcpServers": {"diagd": {"type": "stdio", "command": ..., "args": [...], "env": {}}}}
    cursor          user: ~/.cursor/mcp.json, project: ./.cursor/mcp.json      {"mcpServers": {...}}
    vscode          user: ~/.config/Code/User/mcp.json (macOS: ~/Library/Application Support/Code/User/),
                    project: ./.vscode/mcp.json          {"servers": {"diagd": {"type": "stdio", ...}}}
                    (JSONC: comments and trailing commas allowed)
    windsurf        ~/.codeium/windsurf/mcp_config.json                        {"mcpServers": {...}}

`add` sets one entry in the file and `remove` takes one out (only an entry that runs diagd): only that
member's text changes (daemon/cli/jsonedit.py), so every other key, server, comment and the layout stay
as they were. Every read and write goes through daemon/cli/hostfile.py: regular files only, a link
followed once (never out of the project in project scope), strict JSON, a fresh backup
(`<file>.diagd-backup-<time>-<random>`), an atomic replacement with the old file's mode. A file diagd
will not edit is left as it is, and the error shows the entry to add by hand. The entry runs this diagd
by its absolute path (hosts start servers with a bare PATH) as `diagd mcp`, with `--tools GROUPS` when
chosen, and the DIAGD_* variables set in this shell (the host would not pass them: without them its
diagd would look for another daemon). A group the daemon serves nothing of is refused, with why and what
turns it on as its back end declared them (`Runtime.declare_off`): the host could not start that entry.
The served groups come from the running daemon, else from the catalogue a daemon started now would
serve (cli.py's `served_catalogue`, handed in: this module does not import the server). Stdlib only.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagd.actors import interpreter
from diagd.daemon.cli import hostfile, jsonedit
from diagd.daemon.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from diagd.protocol.errors import DiagdError, ErrorCode

SCOPES = ("user", "project")
PASSED_ENV = ("DIAGD_CONFIG", "DIAGD_RUNTIME_DIR", "DIAGD_STATE_DIR")


@dataclass(frozen=True)
class Host:
    name: str
    title: str
    key: str  # the object in the file that maps server names to their entries
    typed: bool  # entries say "type": "stdio"
    user: tuple[str, ...]  # the user file, relative to HOME (Linux)
    mac: tuple[str, ...] | None = None  # ... on macOS, where it differs
    project: tuple[str, ...] | None = None  # the project file, relative to the working directory
    jsonc: bool = False  # the file may hold comments and trailing commas

    def path(self, scope: str, home: Path, cwd: Path) -> Path:
        if scope == "project":
            if self.project is None:
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{self.title} has no project configuration; "
                                 "use --scope user", host=self.name)
            return cwd.joinpath(*self.project)
        if sys.platform == "darwin" and self.mac is not None:
            return home.joinpath(*self.mac)
        if self.user[0] == ".config" and os.environ.get("XDG_CONFIG_HOME"):
            return Path(os.environ["XDG_CONFIG_HOME"]).joinpath(*self.user[1:])
        return home.joinpath(*self.user)


_APP_SUPPORT = ("Library", "Application Support")
HOSTS: dict[str, Host] = {h.name: h for h in (
    Host("claude-desktop", "Claude Desktop", "mcpServers", False, (".config", "Claude", "claude_desktop_config.json"),
         mac=(*_APP_SUPPORT, "Claude", "claude_desktop_config.json")),
    Host("claude-code", "Claude Code", "mcpServers", True, (".claude.json",), project=(".mcp.json",)),
    Host("cursor", "Cursor", "mcpServers", False, (".cursor", "mcp.json"), project=(".cursor", "mcp.json")),
    Host("vscode", "VS Code", "servers", True, (".config", "Code", "User", "mcp.json"),
         mac=(*_APP_SUPPORT, "Code", "User", "mcp.json"), project=(".vscode", "mcp.json"), jsonc=True),
    Host("windsurf", "Windsurf", "mcpServers", False, (".codeium", "windsurf", "mcp_config.json")),
)}


def diagd_command() -> list[str]:
    """This diagd, by an absolute path a host can start with a bare PATH (the link a tool installer
    made, not its target, so an upgrade keeps it valid)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "diagd" and os.path.isfile(argv0):
        return [os.path.abspath(argv0)]
    found = shutil.which("diagd")
    if found:
        return [os.path.abspath(found)]
    return interpreter.module_argv("diagd.daemon.cli")  # -P: never the host's working directory


# Where one-off runners keep what they run (`uvx diagd`, `pipx run diagd`): gone after a cache clean.
_CACHES = (("uv", "uv's cache (uvx)"), ("pipx", "pipx's cache (pipx run)"))


def in_a_cache(command: str) -> str | None:
    """Which tool's cache the diagd command lives in (None: not in one), by the cache folders uv and pipx
    use: `$XDG_CACHE_HOME` or `~/.cache`, `UV_CACHE_DIR`, and pipx's `.cache` under its home."""
    path = os.path.realpath(command)
    roots = [os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")]
    found = []
    for tool, what in _CACHES:
        dirs = [os.path.join(root, tool) for root in roots]
        if tool == "uv" and os.environ.get("UV_CACHE_DIR"):
            dirs.append(os.environ["UV_CACHE_DIR"])
        if tool == "pipx":
            dirs.append(os.path.join(os.environ.get("PIPX_HOME") or os.path.expanduser("~/.local/pipx"), ".cache"))
        found += [what for d in dirs if path.startswith(os.path.realpath(d) + os.sep)]
    return found[0] if found else None


def entry(host: Host, tools: list[str]) -> dict[str, Any]:
    command, *prefix = diagd_command()
    args = [*prefix, "mcp", *(["--tools", ",".join(tools)] if tools else [])]
    env = {name: os.environ[name] for name in PASSED_ENV if os.environ.get(name)}
    out: dict[str, Any] = {"type": "stdio"} if host.typed else {}
    out |= {"command": command, "args": args}
    if env or host.name == "claude-code":  # `claude mcp add` always writes env
        out["env"] = env
    return out


def read(path: Path, host: Host, inside: Path | None = None) -> tuple[hostfile.Snapshot, dict[str, Any]]:
    """The file and its JSON object ({} when there is none); DiagdError for one diagd must not rewrite.
    `inside`: the project directory, for a project's file (no link out of it is followed)."""
    snap = hostfile.read(path, inside=inside)
    try:
        data = jsonedit.loads(snap.text, comments=host.jsonc)
    except jsonedit.JsonError as exc:
        kind = "JSON, comments and trailing commas allowed" if host.jsonc else "JSON"
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path} is not valid {kind} ({exc}); diagd leaves it as it is",
                         path=str(path)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path} holds a JSON {type(data).__name__}, not an object; "
                         "diagd leaves it as it is", path=str(path))
    if not isinstance(data.get(host.key, {}), dict):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: \"{host.key}\" is not an object; diagd leaves "
                         "the file as it is", path=str(path))
    return snap, data


def write(snap: hostfile.Snapshot, host: Host, data: dict[str, Any],
          edit: Callable[[str], str | None]) -> tuple[Path | None, str]:
    """Replace the file with `edit` of its text (or, when that cannot be done in place, `data` as plain
    JSON); returns the backup of the old file and a note for the user ("" or what was not kept)."""
    text = edit(snap.text) if snap.text.strip() else None
    note = ""
    if text is None:
        text = jsonedit.dumps(data) + "\n"
        if host.jsonc and jsonedit.has_comments(snap.text):
            note = "; its comments were not kept (the old file has them)"
    return hostfile.replace(snap, text), note


def _inside(scope: str) -> Path | None:
    return Path.cwd() if scope == "project" else None


# What the daemon serves: cli.py's served_catalogue (the running daemon's `diagd tools --json`, else the
# one a daemon started now with this config would serve).
Served = Callable[[], dict[str, Any]]


def add(host_name: str, *, tools: str | None, scope: str, name: str, print_only: bool, served: Served) -> int:
    off: list[str] = []  # the groups the host will not get (every group asked for): said once it is done
    done = _add(host_name, tools=tools, scope=scope, name=name, print_only=print_only, served=served, off=off)
    if done == EXIT_OK:
        for note in off:
            sys.stderr.write(f"diagd client add: note: {note}\n")
    return done


def _add(host_name: str, *, tools: str | None, scope: str, name: str, print_only: bool, served: Served,
         off: list[str]) -> int:
    try:
        host = _host(host_name)
        groups = _groups(tools)
        path = host.path(scope, Path.home(), Path.cwd())
        if (off_note := _served(groups, served())) is not None:
            off.append(off_note)
        new = entry(host, groups)
        if (cache := in_a_cache(new["command"])) is not None:
            sys.stderr.write(f"diagd client add: warning: {new['command']} is inside {cache}; the entry stops working "
                             "when that cache is cleaned. Install diagd for good (`uv tool install diagd` or "
                             "`pipx install diagd`) and run `diagd client add` from there\n")
        if print_only:
            sys.stderr.write(f"# {host.title}: put this in {path} (merged into \"{host.key}\")\n")
            print(jsonedit.dumps({host.key: {name: new}}))
            return EXIT_OK
        snap, data = _readable(path, host, name, new, _inside(scope))
        servers = data.setdefault(host.key, {})
        before = servers.get(name)
        if before == new:
            print(f"{host.title}: {path} already runs diagd as {name!r}; nothing to change")
            return EXIT_OK
        servers[name] = new
        backup, note = write(snap, host, data,
                             lambda text: jsonedit.set_member(text, (host.key, name), new, comments=host.jsonc))
        if (twin := _other_scope_entry(host, scope, name)) is not None:
            off.append(twin)
    except DiagdError as exc:
        return _failed("add", exc)
    what = "updated" if before is not None else "added"
    kept = f"; the old file is {backup}" if backup else ""
    print(f"{host.title}: {what} {name!r} in {_shown(snap)}: {' '.join([new['command'], *new['args']])}{kept}{note}")
    print(f"restart {host.title} (or reload its MCP servers) to start it")
    return EXIT_OK


def _other_scope_entry(host: Host, scope: str, name: str) -> str | None:
    """A note when the host's other scope has an entry of the same name: the host then sees two servers
    called `name` (which one wins is the host's rule), so the user should keep one."""
    home, cwd = Path.home(), Path.cwd()
    for other in SCOPES:
        if other == scope or (other == "project" and host.project is None):
            continue
        try:
            path = host.path(other, home, cwd)
            if path == host.path(scope, home, cwd):
                continue
            servers = read(path, host, cwd if other == "project" else None)[1].get(host.key, {})
        except DiagdError:
            continue  # an unreadable other file is that scope's problem, not this add's
        if name in servers:
            return (f"{host.title}'s {other} scope ({path}) also has a server named {name!r}; the host sees both "
                    f"and picks one by its own rule: keep one (`diagd client remove {host.name} --scope {other}`)")
    return None


def remove(host_name: str, *, scope: str, name: str, print_only: bool) -> int:
    try:
        host = _host(host_name)
        path = host.path(scope, Path.home(), Path.cwd())
        snap, data = read(path, host, _inside(scope))
        servers = data.get(host.key, {})
        if name not in servers:
            there = "no file" if snap.data is None else f"no {name!r} in \"{host.key}\""
            print(f"{host.title}: {path}: {there}; nothing to remove")
            return EXIT_OK
        old = servers[name]
        if not _runs_diagd(name, old):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{name!r} in {path} does not run diagd; diagd leaves it "
                             "(remove it by hand if you mean to)", path=str(path))
        if print_only:
            sys.stderr.write(f"# {host.title}: this would be taken out of {path} (\"{host.key}\")\n")
            print(jsonedit.dumps({host.key: {name: old}}))
            return EXIT_OK
        del servers[name]
        backup, note = write(snap, host, data,
                             lambda text: jsonedit.remove_member(text, (host.key, name), comments=host.jsonc))
    except DiagdError as exc:
        return _failed("remove", exc)
    print(f"{host.title}: removed {name!r} from {_shown(snap)}; the old file is {backup}{note}")
    print(f"restart {host.title} (or reload its MCP servers) to stop it")
    return EXIT_OK


def _shown(snap: hostfile.Snapshot) -> str:
    return f"{snap.path} (a link: written to {snap.target})" if snap.link is not None else str(snap.path)


def _failed(action: str, exc: DiagdError) -> int:
    sys.stderr.write(f"diagd client {action}: {exc.code}: {exc.message}\n")
    return EXIT_USAGE if exc.details.get("usage") or "group" in exc.details else EXIT_FAILED  # unknown host, group


def _readable(path: Path, host: Host, name: str, new: dict[str, Any],
              inside: Path | None) -> tuple[hostfile.Snapshot, dict[str, Any]]:
    try:
        return read(path, host, inside)
    except DiagdError as exc:
        snippet = json.dumps({host.key: {name: new}}, ensure_ascii=False)
        raise DiagdError(exc.code, f"{exc.message}; add this by hand: {snippet} (or print it: --print)",
                         **exc.details) from None


def _host(name: str) -> Host:
    if name in HOSTS:
        return HOSTS[name]
    import difflib

    close = difflib.get_close_matches(name, list(HOSTS), n=2)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"unknown host {name!r}{hint}; the hosts are {', '.join(HOSTS)}",
                     usage=True)


def _groups(text: str | None) -> list[str]:
    """The groups of `--tools` (checked against the back ends this config loads), in the order given."""
    if not text:
        return []
    from diagd.daemon import tool_groups
    from diagd.daemon.cli import toolscli

    names = tool_groups.parse_list(text)
    tool_groups.check(names, toolscli.known_groups())
    return names


def _served(groups: list[str], catalogue: dict[str, Any]) -> str | None:
    """Refuse a chosen group that serves no tool under the daemon's config (INVALID_ARGUMENT, a usage
    error): its back end's reason and the setting that turns it on. Without --tools (every group), the
    note naming the groups the host will not get (None: every group serves)."""
    from diagd.daemon.cli import toolscli

    off = toolscli.off_groups(catalogue)
    for group in groups:
        if group in off:
            why = off[group]
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"--tools: the {group!r} group serves no tool, so the host "
                             f"could not start this entry: {why['reason']}; to turn it on: {why['hint']}; then "
                             "add the client again", usage=True, group=group, reason=why["reason"], hint=why["hint"])
    if groups or not off:
        return None
    return f"the host gets every group but {', '.join(off)}, off under this config: " + " | ".join(
        f"{group}: {why['reason']}; to turn it on: {why['hint']}" for group, why in off.items())


def configured(home: Path, cwd: Path) -> list[dict[str, Any]]:
    """Every host file (user, and project in `cwd`) and the diagd servers in it."""
    found = []
    for host in HOSTS.values():
        for scope in SCOPES:
            if scope == "project" and host.project is None:
                continue
            path = host.path(scope, home, cwd)
            if scope == "project" and path == host.path("user", home, cwd):
                continue  # run in HOME: the project file is the user's
            row: dict[str, Any] = {"host": host.name, "scope": scope, "path": str(path), "exists": path.is_symlink()
                                   or path.exists(),
                                   "servers": {}, "error": None}
            try:
                servers = read(path, host, cwd if scope == "project" else None)[1].get(host.key, {})
            except DiagdError as exc:
                row["error"] = exc.message
                servers = {}
            row["servers"] = {n: e for n, e in servers.items() if _runs_diagd(n, e)}
            found.append(row)
    return found


def _runs_diagd(name: str, server: Any) -> bool:
    if not isinstance(server, dict):
        return False
    command = [str(server.get("command", "")), *map(str, server.get("args") or [])]
    return name == "diagd" or os.path.basename(command[0]) == "diagd" or "diagd.daemon.cli" in command


def list_(*, as_json: bool) -> int:
    rows = configured(Path.home(), Path.cwd())
    if as_json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return EXIT_OK
    for row in rows:
        title = f"{HOSTS[row['host']].title} ({row['scope']})"
        if row["error"]:
            print(f"{title:<26} {row['path']}: {row['error']}")
        elif not row["servers"]:
            print(f"{title:<26} {row['path']}: {'no diagd' if row['exists'] else 'no file'}")
        for name, server in row["servers"].items():
            command = " ".join([str(server.get("command")), *map(str, server.get("args") or [])])
            print(f"{title:<26} {row['path']}: {name}: {command}")
    return EXIT_OK


def add_parser(sub: Any, *, served: Served) -> None:
    """`diagd client ...` for daemon/cli/cli.py's sub-commands; `served`: what the daemon serves (cli.py)."""
    s = sub.add_parser("client", help="put diagd in an MCP host's configuration (add), take it out (remove), "
                       "or show where it is (list)")
    actions = s.add_subparsers(dest="client_action", required=True)
    a = actions.add_parser("add", help="write (or --print) the diagd entry of HOST's MCP configuration file")
    a.add_argument("--tools", metavar="GROUPS", help="tool groups the host sees, comma-separated (default: all)")
    a.set_defaults(served=served)
    r = actions.add_parser("remove", help="take the diagd entry out of HOST's MCP configuration file (or --print it)")
    for parser, printed in ((a, "the entry (JSON)"), (r, "the entry (JSON) it would take out")):
        parser.add_argument("host", metavar="HOST", help="the MCP host: " + ", ".join(HOSTS))
        parser.add_argument("--print", "--dry-run", dest="print_only", action="store_true",
                            help=f"print {printed} instead of writing the file")
        parser.add_argument("--scope", choices=SCOPES, default="user",
                            help="user: the host's file in HOME (default); project: the one in this directory")
        parser.add_argument("--name", default="diagd", help="the server's name in the file (default: diagd)")
        parser.set_defaults(func=cmd_client)
    listing = actions.add_parser("list", help="show each host's configuration file and the diagd servers in it")
    listing.add_argument("--json", action="store_true", help="as JSON")
    listing.set_defaults(func=cmd_client)


def cmd_client(args: Any) -> int:
    try:
        if args.client_action == "add":
            return add(args.host, tools=args.tools, scope=args.scope, name=args.name, print_only=args.print_only,
                       served=args.served)
        if args.client_action == "remove":
            return remove(args.host, scope=args.scope, name=args.name, print_only=args.print_only)
        return list_(as_json=args.json)
    except OSError as exc:  # hostfile turns the files' own errors into DiagdError; this is the rest (no cwd, ...)
        sys.stderr.write(f"diagd client {args.client_action}: {exc}\n")
        return EXIT_FAILED
