"""The back ends the tests cover, found as the daemon finds them: the `diagd.backends` entry points
(daemon/discovery.py), never a list kept by hand that a new back end would be missing from.

A back end may be off by default (it registers no tool and declares itself off): `ALL_ON` is the config
that turns every one on, and `loaded` checks that none is left off, so a new back end off by default is
named here once rather than missed by every check that walks the tools.
"""

from __future__ import annotations

import dataclasses
import importlib
import tomllib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import trio

from diagd.daemon import config as config_mod
from diagd.daemon import discovery
from diagd.daemon.server.server import Daemon

# The tables that turn on the back ends that are off by default, as config.toml text and parsed.
ALL_ON_TOML = '[capture]\nallowed_interfaces = ["lo"]\n'
ALL_ON: dict[str, Any] = tomllib.loads(ALL_ON_TOML)


def names() -> list[str]:
    """Every installed back end's name (its tool group, config table, state dir), sorted."""
    return [backend.name for backend in discovery.installed()]


def modules() -> dict[str, ModuleType]:
    """Every installed back end's package, by name."""
    return {backend.name: importlib.import_module(backend.module) for backend in discovery.installed()}


def submodule(name: str, part: str) -> ModuleType | None:
    """The back end's module `part` (`settings`, `timeline_source`, ...), None when it has none."""
    package = next(b.module for b in discovery.installed() if b.name == name)
    try:
        return importlib.import_module(f"{package}.{part}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{package}.{part}":
            raise
        return None


def settings_types() -> dict[str, tuple[type, ...]]:
    """Each back end's config table types: the dataclasses its `settings.py` defines (every back end has
    one: docs/architecture.md, "Adding a back end"), e.g. serial's table and its per-port one."""
    found = {}
    for name in names():
        module = submodule(name, "settings")
        assert module is not None, f"the {name} back end has no settings.py"
        types = tuple(obj for obj in vars(module).values() if isinstance(obj, type)
                      and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__)
        assert types, f"{module.__name__} defines no settings dataclass"
        found[name] = types
    return found


def timeline_sources() -> dict[str, Any]:
    """The diagd_timeline adapter of each back end that has one (its `timeline_source.SOURCE`)."""
    return {name: module.SOURCE for name in names() if (module := submodule(name, "timeline_source")) is not None}


@asynccontextmanager
async def loaded(tmp_path: Path, tables: Mapping[str, Any] = ALL_ON) -> AsyncIterator[Daemon]:
    """A daemon (not serving) with every installed back end loaded under `tables` (config.toml as a dict);
    under ALL_ON, none may be off."""
    async with trio.open_nursery() as nursery:
        daemon = Daemon(config_mod.parse(dict(tables)), nursery, runtime_dir=tmp_path, state_dir=tmp_path / "state")
        try:
            daemon.load_backends()
            if tables is ALL_ON:
                assert not daemon.declared.off, f"off by default: turn it on in tests/backends.py ALL_ON: " \
                                                f"{daemon.declared.off}"
                assert set(names()) <= set(daemon.registry.groups())
            yield daemon
        finally:
            daemon.audit.close()
            nursery.cancel_scope.cancel()
