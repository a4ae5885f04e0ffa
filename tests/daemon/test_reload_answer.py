"""`diagd reload` says what changed and what of it does not reach what is already running."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from diagd.actors import crash
from diagd.actors.crash.messages import SPAWN_SETTINGS
from diagd.actors.crash.settings import CrashSettings
from diagd.daemon import config as config_mod
from diagd.daemon.server import reload as reload_notes
from diagd.daemon.server.server import Daemon
from diagd.protocol.errors import DiagdError, ErrorCode
from tests import backends

# What the back ends declare through `Runtime.defer_on_reload` (serial, bpftrace and capture: their DEFERRED;
# crash notes its own from a hook).
DECLARED = {name: module.DEFERRED for name, module in backends.modules().items() if hasattr(module, "DEFERRED")}


def test_changed_keys_and_the_settings_fixed_into_running_things_are_named() -> None:
    old = config_mod.parse({"daemon": {"max_line_bytes": 1000}, "serial": {"max_reply_bytes": 10, "baudrate": 9600},
                            "bpftrace": {"max_lines": 5}, "pcap": {"max_loaded": 2}})
    new = config_mod.parse({"daemon": {"max_line_bytes": 2000, "call_timeout_s": 5},
                            "serial": {"max_reply_bytes": 20, "baudrate": 9600}, "bpftrace": {"max_lines": 6},
                            "pcap": {"max_loaded": 3}})
    assert reload_notes.changed_keys(old, new) == [
        "[daemon] call_timeout_s", "[daemon] max_line_bytes", "[bpftrace] max_lines", "[pcap] max_loaded",
        "[serial] max_reply_bytes"]
    notes = {n["setting"]: n for n in reload_notes.static_notes(old, new, DECLARED)}
    assert set(notes) == {"[daemon] max_line_bytes", "[serial] max_reply_bytes", "[bpftrace] max_lines"}
    assert "ports opened after the reload" in notes["[serial] max_reply_bytes"]["applies_to"]
    assert "executions started after" in notes["[bpftrace] max_lines"]["applies_to"]
    assert reload_notes.static_notes(old, old, DECLARED) == []


async def test_every_deferred_key_is_a_real_setting_of_its_back_end(tmp_path: Path) -> None:
    from diagd.daemon.config import DaemonConfig

    known = {name: {key for table in tables for key in table.__dataclass_fields__}
             for name, tables in backends.settings_types().items()}
    for deferred in reload_notes.DAEMON:
        assert set(deferred.keys) <= set(DaemonConfig.__dataclass_fields__)
    async with backends.loaded(tmp_path) as daemon:  # what every back end declares, each turned on
        declared = daemon.declared.deferred
    assert {name: tuple(table) for name, table in declared.items()} == DECLARED
    for section, table in declared.items():
        for deferred in table:
            assert set(deferred.keys) <= known[section], section
    assert set(SPAWN_SETTINGS) <= set(CrashSettings.__dataclass_fields__)


async def test_a_reload_with_a_broken_crash_table_is_refused_and_the_old_config_stays(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[crash]\noutput_lines = 5\n")
    async with trio.open_nursery() as nursery:
        daemon = Daemon(config_mod.load(path), nursery, runtime_dir=tmp_path, state_dir=tmp_path / "state")
        try:
            crash.register(daemon.runtime("crash"))
            path.write_text("[crash]\noutput_lines = 7\ncommand_timeout_s = 300\n")
            answer = daemon.reload()
            assert answer["changed"] == ["[crash] command_timeout_s", "[crash] output_lines"]
            assert answer["not_yet_applied"] == []  # per-call settings, and no session is open
            spec = daemon.registry.get("run_crash_command")
            assert callable(spec.timeout_s) and spec.timeout_s() == 300 + 10 + 15  # the call limit followed
            path.write_text("[crash]\noutput_lines = 7\ncomand_timeout_s = 1\n")  # a typo
            with pytest.raises(DiagdError) as refused:
                daemon.reload()
            assert refused.value.code == ErrorCode.INVALID_ARGUMENT and "comand_timeout_s" in refused.value.message
            assert daemon.config.backend("crash") == {"output_lines": 7, "command_timeout_s": 300}
        finally:
            daemon.audit.close()
            nursery.cancel_scope.cancel()
