"""Schemas an agent can read, through a real MCP client: every argument described and typed, and the
daemon holding agents to those types, naming a misspelt argument before anything else."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests import backends
from tests.conftest import DaemonProcess, Env, start_daemon
from tests.e2e.test_mcp import call, mcp_client, payload

pytestmark = pytest.mark.e2e

BACK_ENDS = ",".join(backends.names())  # every installed back end (the test daemon adds its echo back end)


@pytest.fixture
def daemon(env: Env) -> Iterator[DaemonProcess]:
    """The test daemon with every back end on (one off by default lists no tool, and a client that selects
    its group is refused): their tools are all checked."""
    env.write_config(env.config.read_text() + "\n" + backends.ALL_ON_TOML)
    d = start_daemon(env)
    yield d
    d.stop()
JSON_TYPES = {"string", "integer", "number", "boolean", "array", "object", "null"}


def nodes(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema an argument (or a part of one: items, nested properties) is checked against."""
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")


async def test_every_argument_of_every_tool_has_a_description_and_a_type(daemon: DaemonProcess) -> None:
    async with mcp_client(daemon.env, "--tools", BACK_ENDS) as client:
        tools = (await client.list_tools()).tools
    arguments = [(tool.name, name, prop) for tool in tools for name, prop in tool.input_schema["properties"].items()]
    assert len(arguments) > 150 and {t.name for t in tools} >= {"pcap_info", "send_data", "exec_program",
                                                                 "run_crash_command", "diagd_timeline",
                                                                 "start_capture", "diagd_record_start"}
    undescribed = [f"{tool}.{name}" for tool, name, prop in arguments
                   if not (isinstance(prop.get("description"), str) and prop["description"].strip())]
    assert undescribed == [], f"{len(undescribed)} of {len(arguments)} arguments have no description"
    untyped = []
    for tool in tools:
        for path, schema in nodes(tool.input_schema, tool.name):
            kinds = schema.get("type")
            named = set(kinds) if isinstance(kinds, list) else {kinds} if kinds else set()
            if not (named or "enum" in schema) or not named <= JSON_TYPES:
                untyped.append(f"{path}: {schema}")
    assert untyped == []
    by_name = {t.name: t.input_schema["properties"] for t in tools}
    assert by_name["pcap_info"]["pcap_path"]["type"] == "string"
    assert by_name["diagd_timeline"]["start"]["type"] == ["number", "string"]


async def test_a_wrong_type_and_a_misspelt_argument_are_refused_with_what_to_send(daemon: DaemonProcess) -> None:
    async with mcp_client(daemon.env) as client:
        wrong = payload(await call(client, "pcap_info", {"pcap_path": 5}))
        assert wrong["code"] == "INVALID_ARGUMENT" and wrong["details"]["path"] == "$.pcap_path", wrong
        assert "string" in wrong["message"]
        # The misspelt name, not the required argument it was meant to be.
        misspelt = payload(await call(client, "pcap_frame_detail", {"pcap_pth": "x.pcap", "frame_numbers": [1]}))
        assert misspelt["code"] == "INVALID_ARGUMENT", misspelt
        assert misspelt["message"] == "unknown argument 'pcap_pth' (did you mean 'pcap_path'?)"
        assert misspelt["details"]["did_you_mean"] == ["pcap_path"]
        start = payload(await call(client, "diagd_timeline", {"sources": [{"pcap": "x.pcap"}], "start": True}))
        assert start["code"] == "INVALID_ARGUMENT" and start["details"]["path"] == "$.start", start


def test_a_number_typed_on_the_command_line_where_text_is_wanted_is_the_text_typed(daemon: DaemonProcess) -> None:
    # `diagd call` parses `tool=5` as JSON (5); the person meant the text, which MCP clients must send as text.
    done = daemon.env.run("call", "diagd_calls", "tool=5", "--visibility", "off")
    assert done.returncode == 0, done.stderr
    misspelt = daemon.env.run("call", "diagd_calls", "limt=5", "--visibility", "off")
    assert misspelt.returncode != 0 and "unknown argument 'limt' (did you mean 'limit'?)" in misspelt.stdout
