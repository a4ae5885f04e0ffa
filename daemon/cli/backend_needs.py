"""What each back end needs of the machine: its `SYSTEM_NEEDS`, read through the back-end registry.

The back ends declare them (`SYSTEM_NEEDS` in a back end's module, a `system.Needs`: read without
starting the back end, which `register(runtime)` would); the back ends are those found by
daemon/discovery.py. `diagd setup` installs their Debian packages, `diagd doctor` runs their checks.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess

from diagd.actors.system import Needs
from diagd.daemon import discovery


def backends() -> list[discovery.Backend]:
    """Every back end a daemon started now would load (a broken config: the installed ones)."""
    from diagd.daemon import config
    from diagd.protocol.errors import DiagdError

    try:
        return discovery.backends(config.load().daemon.extra_backends)
    except DiagdError:
        return discovery.backends()


def names() -> list[str]:
    return [b.name for b in backends()]


def declared(only: list[str] | None = None) -> dict[str, Needs]:
    """Back-end name -> its Needs (empty when it declares none), in load order."""
    return {b.name: getattr(importlib.import_module(b.module), "SYSTEM_NEEDS", Needs())
            for b in backends() if only is None or b.name in only}


def installed(package: str) -> bool | None:
    """Whether dpkg has `package` installed; None where there is no dpkg (not Debian)."""
    if shutil.which("dpkg-query") is None:
        return None
    done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True,
                          timeout=30, check=False)
    return done.returncode == 0 and done.stdout.endswith("install ok installed")
