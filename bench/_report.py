"""How the benches report their result: the single-figure ones (ui.py, views.py) as JSON or one name-value row per
line; the row benches (pcap_index.py, pcap_narrowed.py) as JSON or one `key=value | ...` line per row."""

from __future__ import annotations

import json
import statistics


def print_rows(rows: list[tuple[str, str]]) -> None:
    """The rows as two left-aligned columns."""
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")


def report(samples: list[float], *, count: str, label: str, unit: str, digits: int, target: float, judged: str,
           as_json: bool) -> int:
    """Median, min and max of `samples` (in `unit`, rounded to `digits`) against `target`, as JSON or as rows;
    the exit status is 0 when the `judged` figure ("median" or "max") is within the target."""
    figures = {count: len(samples), f"median_{unit}": round(statistics.median(samples), digits),
               f"min_{unit}": round(min(samples), digits), f"max_{unit}": round(max(samples), digits),
               f"target_{unit}": target}
    if as_json:
        print(json.dumps(figures))
        return 0
    print_rows([(f"{count} measured", str(len(samples))),
                (f"{label}, median", f"{figures[f'median_{unit}']} {unit}"),
                ("min / max", f"{figures[f'min_{unit}']} / {figures[f'max_{unit}']} {unit}"),
                ("target", f"<= {target:g} {unit}")])
    return 0 if figures[f"{judged}_{unit}"] <= target else 1


def finish_rows(rows: list[dict[str, object]], as_json: bool) -> int:
    """Print a row bench's rows (JSON, or one `key=value | ...` line each); its exit status: 0 when every row
    with a target met it."""
    if as_json:
        print(json.dumps(rows, indent=1))
    else:
        for row in rows:
            print(" | ".join(f"{k}={v}" for k, v in row.items()))
    return 0 if all(r.get("met", True) for r in rows) else 1
