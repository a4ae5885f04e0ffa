"""Probe names for `list_probes`: bpftrace's probe-type aliases, filters (matched here when bpftrace 0.17
would abort on them), and tracepoint fields read from tracefs instead of running `bpftrace -lv`.
"""

from __future__ import annotations

import fnmatch

from diagd.actors import system

PROBE_ALIASES = {
    "t": "tracepoint", "k": "kprobe", "kr": "kretprobe", "u": "uprobe", "ur": "uretprobe", "U": "usdt",
    "s": "software", "h": "hardware", "p": "profile", "i": "interval", "f": "kfunc", "fr": "kretfunc",
    "w": "watchpoint", "aw": "asyncwatchpoint", "it": "iter",
}
PROBE_TYPES = frozenset({*PROBE_ALIASES.values(), "BEGIN", "END"})


def normalize_filter(raw: str) -> tuple[str | None, str]:
    """(the pattern to hand to `bpftrace -l`, or None to filter the full listing; the shown filter).

    bpftrace 0.17 aborts (SIGABRT) on `-l` patterns without a probe type such as `syscalls:*read*`,
    so those are matched here against the full listing instead.
    """
    text = raw.strip()
    head, sep, rest = text.partition(":")
    if sep and (head in PROBE_TYPES or head in PROBE_ALIASES):
        normalized = f"{PROBE_ALIASES.get(head, head)}:{rest}"
        return normalized, normalized
    return None, text


def listing_warning(message: str) -> str:
    if "available_filter_functions" in message:
        return f"kprobe functions cannot be listed: {message}"
    if "available_events" in message:
        return f"tracepoints cannot be listed: {message}"
    return message


def match_listing(probes: list[str], pattern: str) -> list[str]:
    if not pattern:
        return probes
    if not any(c in pattern for c in "*?["):
        pattern = f"*{pattern}*"
    return [p for p in probes if fnmatch.fnmatchcase(p, pattern) or fnmatch.fnmatchcase(p.partition(":")[2], pattern)]


def tracepoint_args(probe: str) -> list[str] | None:
    """A tracepoint's fields from tracefs (what `bpftrace -lv` prints), without the common_ ones."""
    root = system.tracefs_dir()
    kind, _, rest = probe.partition(":")
    category, _, name = rest.partition(":")
    if root is None or kind != "tracepoint" or not name:
        return None
    try:
        text = (root / "events" / category / name / "format").read_text()
    except OSError:
        return None
    decls = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("field:"):
            decl = line[len("field:"):].split(";", 1)[0].strip()
            if not decl.rsplit(" ", 1)[-1].lstrip("*").startswith("common_"):
                decls.append(decl)
    return decls
