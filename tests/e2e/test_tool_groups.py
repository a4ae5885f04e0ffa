"""Choosing tools end to end: `diagd mcp --tools`, `[mcp] tools`, the options line, `diagd tools`, the budgets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from diagd.daemon import tool_groups
from diagd.daemon.server import tool_listing
from tests.conftest import DaemonProcess, Env, start_daemon
from tests.e2e.test_mcp import call, mcp_client, payload
from tests.e2e.test_serial import AT_END, SimProcess, error, ok
from tests.support import reply_check
from tests.support.raw import RawMCP

pytestmark = pytest.mark.e2e

BACK_ENDS = "pcap,serial,bpftrace,crash"  # every real back end: the test daemon adds its echo back end
FULL_BUDGET, PCAP_BUDGET = 30 * 1024, 14 * 1024


def listed(daemon: DaemonProcess, tools: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(initialize result, tools/list result) of a raw connection that chose `tools`."""
    raw = RawMCP(daemon.mcp_socket, timeout=30)
    try:
        raw.send_bytes(tool_groups.options_line(tool_groups.parse_list(tools)))
        init = raw.initialize()["result"]
        raw.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        reply = raw.read()
    finally:
        raw.close()
    assert reply is not None and "result" in reply, reply
    return init, reply["result"]


async def test_a_client_that_chose_pcap_lists_pcap_and_diagd_tools_only_and_cannot_call_a_crash_tool(
        daemon: DaemonProcess) -> None:
    async with mcp_client(daemon.env, "--tools", "pcap") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"pcap_info", "ngap_ue_sessions", "diagd_status", "diagd_calls"} <= names
        assert all(n.startswith(("pcap_", "ngap_", "diagd_")) for n in names), names
        assert client.instructions is not None and "pcap_info" in client.instructions
        assert "open_vmcore_session" not in client.instructions and "exec_program" not in client.instructions
        # A tool of a group the client did not select is a protocol error (-32602), naming its group.
        with pytest.raises(MCPError) as refused:
            await call(client, "open_vmcore_session", {"vmcore_path": "/x", "vmlinux_path": "/y"})
        assert refused.value.code == -32602 and refused.value.error.data["group"] == "crash"
        assert refused.value.error.data["code"] == "NOT_FOUND" and "--tools" in refused.value.message
        assert not (await call(client, "diagd_status")).is_error


async def test_diagd_timeline_cannot_reach_a_group_the_client_has_not_selected(daemon: DaemonProcess) -> None:
    # diagd_timeline is a diagd tool (every client has it) that calls other back ends' tools: a client held
    # to pcap (an HTTP client under [mcp] tools) must not read serial logs, bpftrace output or a kernel log
    # through it.
    async with mcp_client(daemon.env, "--tools", "pcap") as client:
        for kind, ref in (("serial", "/dev/ttyS0"), ("bpftrace", "exec-1"), ("crash", "session-1")):
            refused = await call(client, "diagd_timeline", {"sources": [{kind: ref}]})
            error = payload(refused)
            assert refused.is_error and error["code"] == "NOT_FOUND", error
            assert error["details"]["group"] == kind and "--tools" in error["message"], error


async def test_mcp_tools_in_the_config_is_every_clients_default_and_a_client_may_choose_others(env: Env) -> None:
    env.write_config('[daemon]\nextra_backends = ["echo_actor"]\n[mcp]\ntools = ["echo_actor"]\n')
    daemon = start_daemon(env)
    try:
        async with mcp_client(env) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert "echo" in names and "diagd_status" in names and "pcap_info" not in names
            with pytest.raises(MCPError) as refused:
                await call(client, "pcap_info", {"pcap_path": "/x.pcap"})
            assert refused.value.code == -32602 and "[mcp] tools" in refused.value.message
        async with mcp_client(env, "--tools", "pcap") as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert "pcap_info" in names and "echo" not in names
        # People's commands are not MCP clients: `diagd call` reaches every tool.
        assert env.run("call", "pcap_config_get", "--visibility", "off").returncode == 0
        shown = env.run("tools")
        assert shown.returncode == 0 and "[mcp] tools: diagd, echo_actor" in shown.stdout
    finally:
        daemon.stop()


def test_an_unknown_group_is_refused_by_the_shim_with_close_matches_before_any_daemon_starts(env: Env) -> None:
    done = env.run("mcp", "--tools", "pcp,crash")
    assert done.returncode == 2 and done.stdout == ""
    assert "INVALID_ARGUMENT" in done.stderr and "did you mean pcap" in done.stderr
    assert not (env.runtime / "mcp.sock").exists()


def first_reply(daemon: DaemonProcess, line: bytes) -> dict[str, Any] | None:
    """The daemon's answer to one first line on a new MCP connection."""
    raw = RawMCP(daemon.mcp_socket)
    try:
        raw.send_bytes(line)
        return raw.read()
    finally:
        raw.close()


def test_an_unknown_group_on_the_socket_closes_the_connection_with_a_coded_error(daemon: DaemonProcess) -> None:
    reply = first_reply(daemon, b'{"diagd":{"v":1,"tools":["pcapp"]}}\n')
    assert reply is not None and reply["id"] is None
    assert reply["error"]["data"]["code"] == "INVALID_ARGUMENT" and reply["error"]["data"]["closing"] is True
    assert reply["error"]["data"]["did_you_mean"] == ["pcap"]


def test_a_group_whose_back_end_is_off_is_refused_with_its_reason_and_how_to_turn_it_on(
        daemon: DaemonProcess) -> None:
    """`diagd mcp --tools capture` while [capture] is off: the daemon says why, not "unknown group"."""
    reply = first_reply(daemon, b'{"diagd":{"v":1,"tools":["capture"]}}\n')
    assert reply is not None and reply["error"]["data"]["code"] == "INVALID_ARGUMENT"
    data = reply["error"]["data"]
    assert data["group"] == "capture" and data["reason"] and "allowed_interfaces" in data["hint"], reply
    assert "serves no tool here" in reply["error"]["message"] and "unknown" not in reply["error"]["message"]


def test_a_deeply_nested_first_line_gets_a_parse_error_and_the_connection_goes_on(daemon: DaemonProcess) -> None:
    """A first line that mentions "diagd" is read as options first; nesting deep enough to exhaust
    Python's recursion (it fits in the 4 KB options limit) once killed the connection handler silently."""
    raw = RawMCP(daemon.mcp_socket)
    try:
        raw.send_bytes(b"[" * 2000 + b'"diagd"\n')
        reply = raw.read()
        assert reply is not None and reply["error"]["code"] == -32700, reply
        assert raw.initialize()["result"]["serverInfo"]["name"] == "diagd"
    finally:
        raw.close()
    assert "connection handler failed" not in daemon.log()


def test_an_unknown_group_in_the_config_stops_the_start_and_is_refused_by_a_reload(env: Env) -> None:
    env.write_config('[mcp]\ntools = ["crsh"]\n')
    refused = env.run("serve")
    assert refused.returncode == 1 and "INVALID_ARGUMENT" in refused.stderr and "crash" in refused.stderr
    env.write_config('[mcp]\ntools = ["crash"]\n')
    daemon = start_daemon(env)
    try:
        env.write_config('[mcp]\ntools = ["crsh"]\n')
        reload = env.run("reload")
        assert reload.returncode != 0 and "[mcp] tools" in reload.stderr
        # by name; capture is off (no [capture] allowed_interfaces), so it has no tools and no group here
        assert env.run("tools").stdout.startswith("groups: diagd, bpftrace, crash, pcap, serial")
        assert "[mcp] tools: crash, diagd" in env.run("tools").stdout  # the old config stays in force
    finally:
        daemon.stop()


def test_diagd_tools_lists_each_tool_with_its_group_and_prints_one_tools_input_schema(daemon: DaemonProcess) -> None:
    table = daemon.env.run("tools")
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line.split()[1] for line in table.stdout.splitlines()[2:]}
    assert rows["pcap_info"] == "pcap" and rows["run_crash_command"] == "crash" and rows["diagd_status"] == "diagd"
    assert rows["echo"] == "echo_actor"
    schema = daemon.env.run("tools", "pcap_timeline")
    assert schema.returncode == 0
    _, result = listed(daemon, BACK_ENDS)
    as_listed = {t["name"]: t["inputSchema"] for t in result["tools"]}
    assert json.loads(schema.stdout) == as_listed["pcap_timeline"]
    unknown = daemon.env.run("tools", "pcap_timelin")
    assert unknown.returncode == 2 and "INVALID_ARGUMENT" in unknown.stderr and "pcap_timeline" in unknown.stderr


def test_tools_list_stays_within_its_size_budgets(daemon: DaemonProcess) -> None:
    """What of tools/list reaches the model (hosts send it with every request): each tool's name,
    description and inputSchema (tool_listing.model_facing_bytes), 30 KiB for every back end, 14 KiB
    for pcap with diagd's own tools. The output schemas, which hosts keep to validate results with,
    are listed whole and not counted (bench/tools_list.py prints both sizes)."""
    sizes = {}
    for tools in (BACK_ENDS, "pcap"):
        _, result = listed(daemon, tools)
        sizes[tools] = tool_listing.model_facing_bytes(result["tools"])
    assert sizes[BACK_ENDS] <= FULL_BUDGET, sizes
    assert sizes["pcap"] <= PCAP_BUDGET, sizes


def test_every_tool_lists_its_whole_output_schema(daemon: DaemonProcess) -> None:
    """tools/list gives each tool's outputSchema as generated from its reply model (`diagd tools NAME
    --output`), the one tests/support/reply_check.py holds every reply of the suite to: the MCP SDK's
    client checks each structured result against the listed schema, the suite against the same one."""
    _, result = listed(daemon, BACK_ENDS + ",echo_actor")
    as_listed = {t["name"]: t.get("outputSchema") for t in result["tools"]}
    declared = {t["name"]: t["output_schema"] for t in json.loads(daemon.env.run("tools", "--json").stdout)["tools"]}
    assert as_listed == declared
    checked = reply_check.validators()
    assert set(as_listed) <= set(checked), set(as_listed) - set(checked)
    assert all(as_listed[name] == checked[name].schema for name in as_listed)
    shown = daemon.env.run("tools", "pcap_info", "--output")
    assert shown.returncode == 0 and json.loads(shown.stdout) == as_listed["pcap_info"]


@pytest.fixture
def groups_daemon(env: Env, tmp_path: Path) -> Iterator[DaemonProcess]:
    # allowed_dirs covers the state dir (as a home directory often does): the boundary must hold anyway.
    config = env.config.read_text().replace("[daemon]\n", f'[daemon]\nallowed_dirs = ["{tmp_path}"]\n')
    env.write_config(config + f'\n[serial]\nallowed_ports = ["{tmp_path}/modem*"]\n')
    daemon = start_daemon(env)
    try:
        yield daemon
    finally:
        daemon.stop()


async def test_a_pcap_client_cannot_stop_read_or_reach_another_groups_actor_calls_or_files(
        groups_daemon: DaemonProcess, sim: SimProcess) -> None:
    env, port = groups_daemon.env, str(sim.link)
    async with mcp_client(env, "--tools", "serial,pcap") as owner, mcp_client(env, "--tools", "pcap") as other:
        await ok(owner, "configure_connection", port=port, line_ending="cr")
        await ok(owner, "send_data", port=port, payload="AT+SECRET=hunter2", stop_pattern=AT_END, timeout_ms=5000)
        export = await ok(owner, "export_serial_pcapng", port=port, name="run1")
        actor = next(a for a in (await ok(owner, "diagd_status"))["actors"] if a["resource"] == port)
        assert actor["group"] == "serial"

        # The actor: not listed, not stoppable (not even told it exists), and still serving its owner.
        status = await ok(other, "diagd_status")
        assert all(a["group"] in ("pcap", "diagd") for a in status["actors"]), status["actors"]
        assert not {"send_data", "configure_connection", "export_serial_pcapng"} & set(status["tools"])
        refused = await error(other, "diagd_stop_actor", actor_id=actor["id"])
        assert refused["code"] == "NOT_FOUND" and actor["id"] not in refused["details"]["known"]
        assert (await ok(owner, "connection_status", port=port))["ports"][0]["state"] == "Connected"

        # The calls: none of another group, so none of its arguments.
        shown = await ok(other, "diagd_calls", limit=500)
        assert {c["tool"] for c in shown["calls"]} <= {"diagd_status", "diagd_stop_actor", "diagd_calls"}
        assert "hunter2" not in json.dumps(shown)

        # The files: the export, the raw log, the audit log, the runtime dir, though allowed_dirs covers
        # the state dir; each refused with PERMISSION_DENIED saying why.
        for path in (export["pcapng_path"], export["log_file"], str(env.state / "audit.jsonl"),
                     str(env.runtime / "mcp.sock"), str(env.state)):
            denied = await error(other, "pcap_info", pcap_path=path)
            assert denied["code"] == "PERMISSION_DENIED", (path, denied)
            assert "diagd's own directories" in denied["message"], denied
        denied = await error(other, "pcap_info", pcap_path=export["pcapng_path"])
        assert "'serial' tool group" in denied["details"]["hint"]
        # The owner selected serial too: its exports are its to analyse.
        assert (await ok(owner, "pcap_info", pcap_path=export["pcapng_path"]))["packet_count"] == export["packets"]


async def test_a_client_of_the_same_group_sees_calls_redacted_and_cannot_stop_a_port_it_does_not_own(
        groups_daemon: DaemonProcess, sim: SimProcess) -> None:
    env, port = groups_daemon.env, str(sim.link)
    async with mcp_client(env, "--tools", "serial") as owner, mcp_client(env, "--tools", "serial") as other:
        await ok(owner, "configure_connection", port=port, line_ending="cr")
        await ok(owner, "send_data", port=port, payload="AT+SECRET=hunter2", stop_pattern=AT_END, timeout_ms=5000)
        actor = next(a for a in (await ok(other, "diagd_status"))["actors"] if a["resource"] == port)
        busy = await error(other, "diagd_stop_actor", actor_id=actor["id"])
        assert busy["code"] == "BUSY" and busy["details"]["owner"].startswith("mcp:"), busy
        assert "force=true" in busy["details"]["hint"]
        assert (await ok(owner, "connection_status", port=port))["ports"][0]["state"] == "Connected"

        sent = (await sent_calls(other))[0]
        assert "hunter2" not in json.dumps(sent) and set(sent["arguments"]) >= {"port", "payload"}
        assert sent["arguments"]["payload"].startswith("<redacted")
        own = (await sent_calls(owner))[0]
        assert own["arguments"]["payload"] == "AT+SECRET=hunter2"  # a client's own calls stay whole

        env.write_config(env.config.read_text() + "\n[mcp]\nshow_other_clients_arguments = true\n")
        assert "[mcp] show_other_clients_arguments" in (await ok(other, "diagd_reload"))["changed"]
        sent = (await sent_calls(other))[0]
        assert sent["arguments"]["payload"] == "AT+SECRET=hunter2"

        # Its owner stops it like any of its own resources.
        assert (await ok(owner, "diagd_stop_actor", actor_id=actor["id"]))["stopped"] == actor["id"]


async def sent_calls(client: Any) -> list[dict[str, Any]]:
    result = await call(client, "diagd_calls", {"tool": "send_data"})
    assert not result.is_error, payload(result)
    calls: list[dict[str, Any]] = payload(result)["calls"]
    return calls
