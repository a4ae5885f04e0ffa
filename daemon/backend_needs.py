"""What each back end needs of the machine: its `SYSTEM_NEEDS`, read through the back-end registry.

The back ends declare them (`diagd.actors.<name>.SYSTEM_NEEDS`, a `system.Needs`); the daemon
knows no back-end names beyond `diagd.actors.BACKENDS` and `[daemon] extra_backends`. `diagd setup`
installs their Debian packages, `diagd doctor` runs their checks.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess

from diagd.actors import BACKENDS
from diagd.actors.system import Needs
from diagd.daemon.backends import backend_name


def backend_modules() -> list[str]:
    """Every back end a daemon started now would load (a broken config: the built-in ones)."""
    from diagd.daemon import config
    from diagd.protocol.errors import DiagdError

    try:
        extra = config.load().daemon.extra_backends
    except DiagdError:
        extra = ()
    return [*BACKENDS, *extra]


def names() -> list[str]:
    return [backend_name(m) for m in backend_modules()]


def declared(only: list[str] | None = None) -> dict[str, Needs]:
    """Back-end name -> its Needs (empty when it declares none), in registry order."""
    found: dict[str, Needs] = {}
    for module in backend_modules():
        name = backend_name(module)
        if only is None or name in only:
            found[name] = getattr(importlib.import_module(module), "SYSTEM_NEEDS", Needs())
    return found


def installed(package: str) -> bool | None:
    """Whether dpkg has `package` installed; None where there is no dpkg (not Debian)."""
    if shutil.which("dpkg-query") is None:
        return None
    done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True,
                          timeout=30, check=False)
    return done.returncode == 0 and done.stdout.endswith("install ok installed")
