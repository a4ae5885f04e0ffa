"""A test-only back end that needs a Debian package no machine has: what `diagd setup` would install.

Loaded with `[daemon] extra_backends = ["needy_backend"]` (tests/support on PYTHONPATH); it
registers no tool.
"""

from __future__ import annotations

from diagd.actors.runtime import Runtime
from diagd.actors.system import Needs, Tool

PACKAGE = "diagd-test-absent-package"
SYSTEM_NEEDS = Needs(tools=(Tool("diagd-test-absent-tool", ("--version",), PACKAGE),),
                     note="a note only this back end prints")


def register(runtime: Runtime) -> None:
    del runtime
