"""The tools a back end calls of other groups (`Runtime.uses_tool`): checked against those tools once every back
end is loaded, so a renamed tool or argument stops the start (naming both) instead of a recording's call;
and `Runtime.call` refuses a call its back end did not declare, so the declaration cannot drift from the calls.
"""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from diagd.actors.capture import recording
from diagd.actors.runtime import DAEMON_GROUP
from diagd.actors.tooling import ToolSpec
from diagd.daemon.server.backends import BackendRuntime
from diagd.daemon.tool_groups import BUILTIN
from diagd.protocol.errors import DiagdError, ErrorCode
from tests import backends
from tests.conftest import DIAGD, Env


def test_the_daemon_group_a_back_end_names_is_the_daemons() -> None:
    assert DAEMON_GROUP == BUILTIN


async def test_every_declared_use_is_a_real_tool_taking_those_arguments(tmp_path: Path) -> None:
    async with backends.loaded(tmp_path) as daemon:  # load_backends checked them: it returned
        uses = daemon.declared.uses
    assert set(uses["capture"].values()) == set(recording.USES)  # the recording declares each tool it calls


def rename(monkeypatch: pytest.MonkeyPatch, tool: str, change: Any) -> None:
    """The back end registering `tool` registers `change(spec)` instead (a release that renamed something)."""
    register = BackendRuntime.register_tool

    def changed(self: BackendRuntime, spec: ToolSpec) -> None:
        register(self, change(spec) if spec.name == tool else spec)

    monkeypatch.setattr(BackendRuntime, "register_tool", changed)


def renamed_argument(spec: ToolSpec, old: str, new: str) -> ToolSpec:
    schema = dict(spec.input_schema)
    schema["properties"] = {new if name == old else name: prop for name, prop in schema["properties"].items()}
    schema["required"] = [new if name == old else name for name in schema.get("required", [])]
    return replace(spec, input_schema=schema)


async def refusal(tmp_path: Path) -> DiagdError:
    """The one coded error loading the back ends raised (inside the daemon's nursery, which wraps it)."""
    with pytest.raises(BaseExceptionGroup) as refused:
        async with backends.loaded(tmp_path):
            pass
    leaves = refused.value.exceptions
    while len(leaves) == 1 and isinstance(leaves[0], BaseExceptionGroup):
        leaves = leaves[0].exceptions
    assert len(leaves) == 1 and isinstance(leaves[0], DiagdError), refused.value
    assert leaves[0].code == ErrorCode.BACKEND_UNAVAILABLE
    return leaves[0]


async def test_an_argument_renamed_in_the_tool_a_recording_calls_stops_the_start_naming_both(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rename(monkeypatch, "configure_connection", lambda spec: renamed_argument(spec, "port", "device"))
    error = await refusal(tmp_path)
    assert error.message.startswith("the capture back end calls configure_connection of the serial group with the "
                                    "argument 'port', which configure_connection does not take (it takes ")
    assert error.details["argument"] == "port" and "device" in error.details["arguments"]
    assert (error.details["backend"], error.details["tool"], error.details["group"]) == (
        "capture", "configure_connection", "serial")


async def test_a_renamed_tool_and_a_new_required_argument_stop_the_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rename(monkeypatch, "export_serial_pcapng", lambda spec: replace(spec, name="export_serial_session"))
    assert (await refusal(tmp_path)).message == ("the capture back end calls export_serial_pcapng of the serial "
                                                 "group, but no back end registered it")
    monkeypatch.undo()

    def requires_a_cursor(spec: ToolSpec) -> ToolSpec:
        schema = {**spec.input_schema, "required": [*spec.input_schema.get("required", []), "cursor"]}
        schema["properties"] = {**schema["properties"], "cursor": {"type": "string"}}
        return replace(spec, input_schema=schema)

    rename(monkeypatch, "get_result", requires_a_cursor)
    error = await refusal(tmp_path)
    assert error.message == ("the capture back end calls get_result of the bpftrace group without 'cursor', an "
                             "argument get_result requires")


async def test_a_use_of_another_group_or_of_a_group_that_is_off(tmp_path: Path) -> None:
    async with backends.loaded(tmp_path, {}) as daemon:  # capture off: its tools are not there to call
        daemon.runtime("probe").uses_tool("capture", "start_capture", ("interfaces",))
        daemon.declared.check_uses(daemon.registry.specs())
        daemon.runtime("probe").uses_tool("crash", "pcap_info", ("pcap_path",))
        with pytest.raises(DiagdError) as refused:
            daemon.declared.check_uses(daemon.registry.specs())
        assert refused.value.message == ("the probe back end calls pcap_info of the crash group, but the pcap "
                                         "group has it")


async def test_a_call_not_declared_is_refused_before_it_reaches_the_tool(tmp_path: Path) -> None:
    async with backends.loaded(tmp_path) as daemon:
        capture = daemon.runtime("capture")
        with pytest.raises(DiagdError) as undeclared:
            await capture.call("pcap_info", {"pcap_path": "x.pcap"})
        assert undeclared.value.code == ErrorCode.INTERNAL_ERROR
        assert undeclared.value.message == ("the capture back end called pcap_info, which it did not declare "
                                            "(Runtime.uses_tool)")
        with pytest.raises(DiagdError) as argument:
            await capture.call("stop_capture", {"capture_id": "cap-0000aaaa", "force": True})
        assert argument.value.details["argument"] == "force" and argument.value.details["declared"] == ["capture_id"]
        # Declared, and passing the caller's own arguments through: past the declaration (not inside a call here).
        with pytest.raises(DiagdError) as outside:
            await capture.call("configure_connection", {"port": "/dev/ttyS1", "baudrate": 9600})
        assert outside.value.message == "configure_connection was called outside a tool call"


def test_diagd_serve_refuses_to_start_with_one_coded_line(env: Env, tmp_path: Path) -> None:
    """A back end (an extra one here, as a third party's would be) that calls an argument no tool takes."""
    (tmp_path / "stale_backend.py").write_text(
        "def register(runtime):\n"
        "    runtime.uses_tool('serial', 'configure_connection', ('port', 'parity_bits'))\n")
    env.vars["PYTHONPATH"] = f"{tmp_path}:{env.vars['PYTHONPATH']}"
    env.write_config('[daemon]\nextra_backends = ["stale_backend"]\n')
    done = subprocess.run([DIAGD, "serve"], env=env.vars, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    last = [line for line in done.stderr.splitlines() if line.startswith("diagd")]
    assert len(last) == 1 and "BACKEND_UNAVAILABLE" in last[0], done.stderr
    assert "stale_backend back end calls configure_connection of the serial group with the argument " \
           "'parity_bits'" in last[0]
    assert not (env.runtime / "mcp.sock").exists()
