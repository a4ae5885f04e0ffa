"""`diagd tools [NAME]`, and the tool groups `diagd mcp --tools` may name: stdlib only (start-up time).

`diagd tools` asks the running daemon (a control request), like `diagd call`: the list is what that
daemon serves (its version, its extra back ends, its [mcp] tools), and the command stays fast. When
no daemon runs, cli.py builds the same catalogue from the installed back ends and this config, as a
daemon started now would serve it (daemon/server/server.py `offline_catalogue`: one code path with
the daemon's answer), and says so in one line; nothing is started for it.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from typing import Any

from diagd.daemon.exits import EXIT_OK, EXIT_USAGE
from diagd.protocol.errors import ErrorCode


def known_groups() -> list[str]:
    """The back ends a daemon started with this config loads (their names are the tool groups)."""
    from diagd.daemon import config, discovery

    return discovery.names(config.load().daemon.extra_backends)


def options_line(text: str) -> bytes | None:
    """The MCP connection's options line for `--tools text`; None (the error printed) for an unknown group.

    Checked before connecting: a typo never reaches, or starts, a daemon."""
    from diagd.daemon import tool_groups
    from diagd.protocol.errors import DiagdError

    try:
        return tool_groups.options_line(tool_groups.check(tool_groups.parse_list(text), known_groups()))
    except DiagdError as exc:
        sys.stderr.write(f"diagd mcp: {exc.code}: {exc.message}\n")
        return None


def show(catalogue: dict[str, Any], name: str | None, *, as_json: bool = False, output: bool = False) -> int:
    """Print the daemon's tool list (a table, or JSON), or one tool's input (or whole output) schema."""
    tools = {t["name"]: t for t in catalogue["tools"]}
    if name is not None:
        if name not in tools:
            close = difflib.get_close_matches(name, list(tools), n=3)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            sys.stderr.write(f"diagd tools: {ErrorCode.INVALID_ARGUMENT}: unknown tool {name!r}{hint}\n")
            return EXIT_USAGE
        schema = tools[name]["output_schema" if output else "input_schema"]
        print(json.dumps(schema, indent=2, ensure_ascii=False))
        return EXIT_OK
    if output:
        sys.stderr.write(f"diagd tools: {ErrorCode.INVALID_ARGUMENT}: --output needs a tool's name\n")
        return EXIT_USAGE
    if as_json:
        print(json.dumps(catalogue, indent=2, ensure_ascii=False))
        return EXIT_OK
    configured = catalogue["configured"]
    print(f"groups: {', '.join(catalogue['groups'])}  ([mcp] tools: {', '.join(configured) if configured else 'all'}"
          "; a client chooses with `diagd mcp --tools GROUP,...`)")
    rows = [("TOOL", "GROUP", "DESCRIPTION")] + [(t["name"], t["group"], first_sentence(t["description"]))
                                                  for t in catalogue["tools"]]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    for group, why in off_groups(catalogue).items():
        print(f"off: {group}: {why['reason']}; to turn it on: {why['hint']}")
    for tool, group, text in rows:
        print(f"  {tool.ljust(widths[0])}  {group.ljust(widths[1])}  {text}".rstrip())
    return EXIT_OK


def off_groups(catalogue: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The groups that serve no tool under the catalogue's config, as their back ends declared it:
    {group: {"reason", "hint"}} (an older daemon's catalogue has none)."""
    return dict(catalogue.get("off") or {})


# Words whose period ends no sentence ("e.g. 'ngap.'", "tshark, sharkd etc. read it").
ABBREVIATIONS = frozenset({"e.g.", "i.e.", "etc.", "vs.", "cf.", "approx.", "incl.", "no.", "resp."})
_END = re.compile(r"[.!?](?=\s|$)")


def first_sentence(text: str, limit: int = 100) -> str:
    """The description's first sentence (of its first line), cut to `limit` characters.

    A sentence ends at `.`, `!` or `?` before a space or the end, except after an abbreviation; a
    period inside a word (`2.3`, `ngap.id`, `file.pcap`) is not followed by a space, so ends nothing."""
    line = text.strip().split("\n", 1)[0]
    for end in _END.finditer(line):
        word = line[:end.end()].rsplit(None, 1)[-1].lstrip("([\"'`").lower()
        if word not in ABBREVIATIONS:
            line = line[:end.start()]
            break
    return line if len(line) <= limit else line[:limit - 1].rstrip() + "…"
