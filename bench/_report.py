"""How the single-figure benches (ui.py, views.py) print their result: one name-value row per line."""

from __future__ import annotations


def print_rows(rows: list[tuple[str, str]]) -> None:
    """The rows as two left-aligned columns."""
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")
