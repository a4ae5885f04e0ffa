"""The crash tools against a fake runtime (tests/support/fake_runtime.py): what is registered and how,
the stored-output tools, the script tools, and the coded errors that come before any session.

No crash or drgn runs here: sessions themselves are covered by test_session.py (a scripted fake
crash) and tests/e2e/test_crash.py (the real one on the cached vmcore).
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from diagd.actors import crash
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.support.fake_runtime import fake_runtime

CORE_TOOLS = {"open_vmcore_session", "close_vmcore_session", "list_vmcore_sessions", "run_crash_command",
              "run_drgn_command", "get_command_output", "search_command_output", "get_crash_info",
              "load_module_debuginfo"}
SCRIPT_TOOLS = {"list_analysis_scripts", "run_analysis_script"}


async def test_every_tool_states_its_output_and_the_script_tools_need_script_dirs(tmp_path: Path) -> None:
    async with fake_runtime(tmp_path, "crash") as rt:
        crash.register(rt)
        specs = {spec.name: spec for spec in rt.registry.specs()}
        assert set(specs) == CORE_TOOLS
        for spec in specs.values():
            assert spec.output_schema is not None, spec.name
            jsonschema.Draft202012Validator.check_schema(spec.output_schema)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    async with fake_runtime(tmp_path, "crash", {"script_dirs": [str(scripts)]}) as rt:
        crash.register(rt)
        specs = {spec.name: spec for spec in rt.registry.specs()}
        assert set(specs) == CORE_TOOLS | SCRIPT_TOOLS
        assert str(scripts) in specs["list_analysis_scripts"].description


async def test_call_limits_follow_a_reload(tmp_path: Path) -> None:
    async with fake_runtime(tmp_path, "crash", {"command_timeout_s": 60, "interrupt_grace_s": 5}) as rt:
        crash.register(rt)
        spec = rt.registry.get("run_crash_command")
        assert callable(spec.timeout_s) and spec.timeout_s() == 60 + 5 + 15
        assert rt.set_table({"command_timeout_s": 200, "interrupt_grace_s": 5}) == []  # no session open
        assert spec.timeout_s() == 200 + 5 + 15


async def test_stored_outputs_are_paged_and_searched_with_the_schema_defaults(tmp_path: Path) -> None:
    async with fake_runtime(tmp_path, "crash") as rt:
        backend = crash.register(rt)
        backend.store.create_session("abcd1234-000001", {"vmcore": "/x"})
        text = "\n".join(f"line {i}" + (" Kernel panic" if i == 150 else "") for i in range(300)) + "\n"
        meta = backend.store.write("abcd1234-000001", 1, text, {"engine": "crash", "command": "log"})
        page = await rt.call("get_command_output", {"command_id": meta["command_id"]})
        jsonschema.validate(page, rt.registry.get("get_command_output").output_schema)
        assert page["output"].splitlines()[0] == "line 0" and len(page["output"].splitlines()) == 100
        assert page["total_lines"] == 300 and page["has_more"]
        found = await rt.call("search_command_output", {"command_id": meta["command_id"], "query": "kernel PANIC"})
        jsonschema.validate(found, rt.registry.get("search_command_output").output_schema)
        assert found["match_count"] == 1 and found["matches"][0]["line_number"] == 150


async def test_without_a_session_calls_say_so_with_a_code(tmp_path: Path) -> None:
    async with fake_runtime(tmp_path, "crash") as rt:
        crash.register(rt)
        listing = await rt.call("list_vmcore_sessions")
        jsonschema.validate(listing, rt.registry.get("list_vmcore_sessions").output_schema)
        assert listing == {"sessions": [], "default_for_this_client": None}
        for tool, args in (("run_crash_command", {"command": "bt"}), ("run_drgn_command", {"code": "1"}),
                           ("get_crash_info", {}), ("close_vmcore_session", {"session_id": "nope"})):
            with pytest.raises(DiagdError) as err:
                await rt.call(tool, args)
            assert err.value.code == ErrorCode.NOT_FOUND, tool


async def test_analysis_scripts_are_listed_and_an_unknown_one_is_refused(tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "tasks.py").write_text('"""Count the tasks.\n\nMore text."""\nprint(1)\n')
    (scripts / "_helper.py").write_text("x = 1\n")
    async with fake_runtime(tmp_path, "crash", {"script_dirs": [str(scripts)]}) as rt:
        crash.register(rt)
        listed = await rt.call("list_analysis_scripts")
        jsonschema.validate(listed, rt.registry.get("list_analysis_scripts").output_schema)
        assert [(s["name"], s["description"]) for s in listed["scripts"]] == [("tasks", "Count the tasks.")]
        with pytest.raises(DiagdError) as err:
            await rt.call("run_analysis_script", {"name": "missing"})
        assert err.value.code == ErrorCode.NOT_FOUND and err.value.details["known"] == ["tasks"]
