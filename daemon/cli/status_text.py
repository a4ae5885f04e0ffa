"""`diagd status` as text: the daemon, its sockets and memory, actors, workers and per-tool figures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def format_status(status: dict[str, Any]) -> str:
    d = status["daemon"]
    lines = [
        f"diagd {d['version']}  pid {d['pid']}  up {_duration(d['uptime_s'])}  since {d['started_at']}",
        f"config: {d['config']}   state: {d['state_dir']}",
        _sockets_line(d),
        *(f"WARNING: {w}" for w in d.get("warnings", [])),
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
    rows = [("TOOL", "COUNT", "MEAN MS", "P50 MS", "P95 MS", "FAIL %")]
    for name, t in status["tools"].items():
        rows.append((name, str(t["count"]), _ms(t.get("mean_ms")), _ms(t["p50_ms"]), _ms(t["p95_ms"]),
                     f"{t['failure_rate'] * 100:.1f}"))
    lines += _table(rows) if len(rows) > 1 else ["  no calls yet"]
    for backend, part in (status.get("backends") or {}).items():
        for name, found in part.items():
            lines.append(f"{backend} {name} ({len(found)}):")
            lines += _rows_table(found) if found else ["  none"]
    return "\n".join(lines)


def _rows_table(found: list[dict[str, Any]]) -> list[str]:
    """A back end's rows (Runtime.add_status) as a table: a column per key, in order of first appearance;
    sizes (`*bytes`) in MB, durations (`*_s`, `*_s_ago`) as durations."""
    keys = list(dict.fromkeys(k for row in found for k in row))
    rows: list[tuple[str, ...]] = [tuple(k.upper() for k in keys)]
    for row in found:
        rows.append(tuple(_cell(k, row.get(k)) for k in keys))
    return _table(rows)


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("bytes") and isinstance(value, int | float):
        return _mb(int(value))
    if (key.endswith("_s") or key.endswith("_s_ago")) and isinstance(value, int | float):
        return _duration(float(value))
    return str(value)


def _sockets_line(d: dict[str, Any]) -> str:
    """Where the daemon listens, and which sockets systemd handed it (socket activation)."""
    from_systemd = d.get("sockets_from_systemd") or []
    line = "sockets: " + "  ".join(f"{k}={v}" for k, v in d["sockets"].items())
    return line + (f"  (from systemd: {', '.join(from_systemd)})" if from_systemd else "")


def _memory_line(d: dict[str, Any]) -> str:
    """The daemon's own RSS and its workers' (the processes its actors own) added up."""
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
