"""Whether a whole config may be taken, at start and on `diagd reload`: tables, and refusals worded for people.

`config.load` checks the daemon's own tables ([daemon], [http], [mcp]); each back end checks its own
table through its reload hook (`Runtime.on_reload`, which may raise to refuse). What is left is
here: a table no one reads (a misspelt back end name would otherwise be ignored in silence, and
every call of that back end would run on defaults), and the wording of a refusal: which file, and
that the running config stays in force, so the person who typed the config reads the error, not
the agent on its next call.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from diagd.daemon.config import OWN_TABLES, Config
from diagd.daemon.discovery import module_name
from diagd.daemon.tool_groups import BUILTIN
from diagd.protocol.errors import DiagdError, ErrorCode


def check_tables(config: Config, backends: Iterable[str]) -> None:
    """Refuse a table that neither the daemon nor a back end (`backends`: the loaded ones, or one named in
    extra_backends, loaded at the next start) reads."""
    extra = (module_name(module) for module in config.daemon.extra_backends)
    known = sorted({*OWN_TABLES, *backends, *extra} - {BUILTIN})
    for table in config.backends:
        if table not in known:
            close = difflib.get_close_matches(table, known, n=2)
            hint = f" (did you mean {' or '.join(f'[{c}]' for c in close)}?)" if close else ""
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[{table}] is not a table diagd reads{hint}",
                             setting=f"[{table}]", did_you_mean=close, known=known)


def refused(exc: DiagdError, source: str, *, running: bool) -> DiagdError:
    """`exc` as the refusal of the config file `source`; `running`: a reload, whose old config stays."""
    where = "the config" if source.startswith("<") or source in exc.message else f"config {source}"
    outcome = "refused; the running config stays in force" if running else "refused"
    return DiagdError(exc.code, f"{where} {outcome}: {exc.message}",
                      **{**exc.details, "config": source, "reloaded": False})
