"""daemon/ names no back end, none of their tools and none of their settings: back ends declare, the daemon discovers.

What the daemon says of a back end (instructions, timeline sources, reload effects, exports, needs)
the back end declared (`diagd.actors.runtime.Runtime`, daemon/server/declared.py), so renaming a tool, a
tool argument or a setting in a back end cannot silently break the daemon. This greps every line of
daemon/ (code, strings, comments) for the installed back ends' names, the tools they register and
the keys of their config tables: every back end found as the daemon finds it (tests/backends.py), each
turned on (a back end off by default registers no tool).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from diagd.daemon import discovery
from diagd.daemon.config import DaemonConfig, McpConfig
from diagd.daemon.http_settings import HttpConfig
from diagd.daemon.tool_groups import BUILTIN
from tests import backends as found

TOP = Path(__file__).resolve().parent.parent
# The back ends' tables: the dataclasses of each one's settings.py.
TABLES = tuple(table for tables in found.settings_types().values() for table in tables)

# A word that may appear in daemon/ though a back end also uses it, and why.
ALLOWED = {
    "path": "a generic word ([bpftrace] path is its binary's)",
    "capture": "a generic word: a capture is what the pcap tools read (the live-capture back end is named after it)",
    "max_bytes": "a generic parameter name (the audit log's rotation, a log tail's read) besides [capture] max_bytes",
}
# The daemon's own settings: a back end's table may repeat one to override it ([pcap] allowed_dirs,
# [crash] idle_timeout_s) or have one of the same name ([http] max_sessions, [crash] max_sessions).
OWN_SETTINGS = {f.name for table in (DaemonConfig, HttpConfig, McpConfig) for f in dataclasses.fields(table)}


async def registered_tools(tmp_path: Path) -> set[str]:
    """The tools the installed back ends register in a real daemon, each back end turned on."""
    async with found.loaded(tmp_path) as daemon:
        return {spec.name for spec in daemon.registry.specs() if spec.group != BUILTIN}


def occurrences(words: set[str]) -> list[str]:
    found = []
    for path in sorted((TOP / "daemon").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            for word in sorted(words):
                # A whole word: `serial-3` (an actor id) or `diagd.actors` are not the word itself.
                if re.search(rf"(?<![\w.-]){re.escape(word)}(?![\w-])", line):
                    found.append(f"{path.relative_to(TOP)}:{n}: {word!r}: {line.strip()}")
    return found


async def test_daemon_names_no_back_end_tool_or_back_end_setting(tmp_path: Path) -> None:
    backends = {b.name for b in discovery.installed()}
    tools = await registered_tools(tmp_path)
    keys = {f.name for table in TABLES for f in dataclasses.fields(table)} - OWN_SETTINGS
    assert {"pcap", "serial", "bpftrace", "crash", "capture"} <= backends
    assert {"get_log", "pcap_timeline", "start_capture", "diagd_record_start"} <= tools and "baudrate" in keys
    found = occurrences((backends | tools | keys) - set(ALLOWED))
    assert not found, "daemon/ names what a back end should declare:\n" + "\n".join(found)


def test_the_grep_finds_a_name() -> None:
    assert occurrences({"extra_backends"}) and not occurrences({"diagd-no-such-word"})
