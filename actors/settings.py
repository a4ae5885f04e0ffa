"""Config tables into frozen dataclasses: one parser for every back end's table and for [daemon].

A table's dataclass declares its keys: every field is a key, its default says its kind (bool, int,
float, str, a path, a list of strings, a table), and `setting()` adds bounds or choices. Parsing
refuses an unknown key (naming close matches) and a value of the wrong kind or out of bounds, always
as INVALID_ARGUMENT naming `[table] key`; checks across keys go in the dataclass's `__post_init__`.
Stdlib only: the CLI reads [daemon] through it.

    @dataclass(frozen=True)
    class SerialConfig:
        allowed_ports: tuple[str, ...] = ()
        baudrate: int = setting(115200, minimum=1)

    config = parse_table(SerialConfig, "serial", runtime.config().table)
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

from diagd.protocol.errors import DiagdError, ErrorCode

T = TypeVar("T")


def setting(default: T, *, minimum: float | None = None, maximum: float | None = None, positive: bool = False,
            choices: Sequence[Any] = (), items: type = str) -> T:
    """A field with checks: `minimum`/`maximum` (inclusive), `positive` (> 0), `choices`, and for a
    list the kind of its `items` (str, or dict for a list of tables)."""
    meta = {"minimum": minimum, "maximum": maximum, "positive": positive, "choices": tuple(choices), "items": items}
    if isinstance(default, dict | list):
        raise TypeError("a mutable default needs dataclasses.field(default_factory=...)")
    return dataclasses.field(default=default, metadata=meta)


def refuse(table: str, key: str, problem: str, **details: Any) -> DiagdError:
    """The error for one setting: INVALID_ARGUMENT, its message and `details.setting` naming `[table] key`."""
    sep = "" if problem.startswith(":") else " "
    return DiagdError(ErrorCode.INVALID_ARGUMENT, f"[{table}] {key}{sep}{problem}", setting=f"[{table}] {key}",
                      **details)


def parse_table(cls: type[T], table: str, raw: Mapping[str, Any], *, inherited: Mapping[str, Any] | None = None,
                source: str = "") -> T:
    """`raw` (a TOML table) as a `cls`; `inherited` gives defaults that come from elsewhere (e.g.
    [daemon] allowed_dirs for a back end's allowed_dirs). DiagdError for anything wrong."""
    if not isinstance(raw, Mapping):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[{table}] must be a table")
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    where = {"source": source} if source else {}
    for key in raw:
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=3)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise refuse(table, str(key), f"is not a setting{hint}", did_you_mean=close, known=sorted(known), **where)
    values = {**(inherited or {}), **raw}
    parsed = {key: _value(table, known[key], value) for key, value in values.items() if key in known}
    return cls(**parsed)


_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string", Path: "a path",
          tuple: "a list", dict: "a table"}


def _kind(f: dataclasses.Field[Any]) -> type:
    factory = cast(Callable[[], Any], f.default_factory)
    default = f.default if f.default is not dataclasses.MISSING else factory()
    for kind in (bool, int, float, str, Path, tuple, dict):
        if isinstance(default, kind):
            return kind
    raise TypeError(f"setting {f.name}: no kind for a default of {type(default).__name__}")


def _value(table: str, f: dataclasses.Field[Any], value: Any) -> Any:
    kind, meta = _kind(f), f.metadata
    items = meta.get("items", str)
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif kind in (str, Path):
        ok = isinstance(value, str | Path)
        value = Path(value) if ok and kind is Path else value
    elif kind is dict:
        ok = isinstance(value, Mapping)
        value = dict(value) if ok else value
    else:
        ok = isinstance(value, list | tuple) and all(isinstance(v, dict if items is dict else str) for v in value)
        value = tuple(dict(v) if isinstance(v, Mapping) else v for v in value) if ok else value
    if not ok:
        wanted = _KINDS[kind] if kind is not tuple else "a list of " + ("tables" if items is dict else "strings")
        raise refuse(table, f.name, f"must be {wanted}, not {value!r}", value=repr(value))
    _check_bounds(table, f.name, meta, value)
    return value


def _check_bounds(table: str, key: str, meta: Mapping[str, Any], value: Any) -> None:
    if meta.get("positive") and not value > 0:
        raise refuse(table, key, f"must be positive, not {value!r}", value=value)
    if meta.get("minimum") is not None and value < meta["minimum"]:
        raise refuse(table, key, f"must be at least {meta['minimum']:g}, not {value!r}", value=value)
    if meta.get("maximum") is not None and value > meta["maximum"]:
        raise refuse(table, key, f"must be at most {meta['maximum']:g}, not {value!r}", value=value)
    if meta.get("choices") and value not in meta["choices"]:
        raise refuse(table, key, f"must be one of {list(meta['choices'])}, not {value!r}", value=value)
