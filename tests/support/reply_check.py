"""Every reply a real MCP client receives in the suite, checked against its tool's whole outputSchema.

tests/conftest.py wraps the MCP SDK's `Client.call_tool` with `check`: each successful call's
`structuredContent` is validated (jsonschema, Draft 2020-12) against the schema generated from the
tool's reply model, the one `diagd tools NAME --output` prints and tools/list gives (the SDK's client
checks the listed one too, and raises on a mismatch; tests/e2e/test_tool_groups.py shows the two are
the same). This check does not depend on the client having listed the tools, and names every
failing path. A tool this module does not know fails the call: no tool goes unchecked.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import jsonschema

from diagd.actors.tooling import ToolSet

# Every module that declares tools on a ToolSet (the daemon's own, each back end's, the test back end's).
MODULES = ("diagd.daemon.server.builtin_tools", "diagd.actors.pcap.tools", "diagd.actors.pcap.sequence_tool",
           "diagd.actors.serial.tools", "diagd.actors.bpftrace.tools", "diagd.actors.crash.tools",
           "diagd.actors.capture.tools", "diagd.actors.capture.record_tools", "tests.support.echo_actor")


@functools.cache
def validators() -> dict[str, jsonschema.protocols.Validator]:
    """name -> a validator of its whole output schema, for every declared tool."""
    out: dict[str, jsonschema.protocols.Validator] = {}
    for name in MODULES:
        module = importlib.import_module(name)
        for toolset in (v for v in vars(module).values() if isinstance(v, ToolSet)):
            for spec in toolset.specs(None):
                assert spec.output_schema is not None, spec.name
                jsonschema.Draft202012Validator.check_schema(spec.output_schema)
                out[spec.name] = jsonschema.Draft202012Validator(spec.output_schema)
    return out


def check(name: str, result: Any) -> None:
    """Fail unless a successful result's structuredContent is valid for `name`'s output schema."""
    if result.is_error or result.structured_content is None:
        return
    known = validators()
    assert name in known, f"{name}: no declared tool of that name (add its module to reply_check.MODULES)"
    errors = sorted(known[name].iter_errors(result.structured_content), key=lambda e: list(e.absolute_path))
    assert not errors, f"{name}: its reply does not match its output schema: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path)) or '$'}: {e.message[:200]}" for e in errors[:5])
