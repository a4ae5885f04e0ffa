"""Hypothesis fuzzing of every tool's arguments through a real daemon, on both sockets.

Arguments come from the input schemas the daemon lists (tools/list), steered to real inputs (real
captures, the simulated modem's pty, the open crash session, a stored command output, a finished
bpftrace run) and mutated into junk (wrong types, NULs, surrogates, extreme numbers, unknown keys,
hostile paths, 100 kB strings). After every example: the answer is a result that matches the tool's
output schema or a coded error (never INTERNAL_ERROR, never a traceback), and the daemon still
answers diagd_status on another connection.

Bounds (so the whole file takes a minute or two): DIAGD_FUZZ_EXAMPLES examples per tool on the
control socket (default 20) and a quarter of that over MCP; bpftrace runs and waits are kept short
by `RealInputs.bounded` and the fixture's [bpftrace] max_run_s. Nothing here stops the daemon: the
control socket's `shutdown` request is not a tool and is left out on purpose, and diagd_stop_actor
only ever gets ids that name no actor (a real one would end the session the crash examples use).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fault.conftest import SMALL_PCAP, RichDaemon
from tests.fault.helpers import ControlClient, assert_coded_error, declared_tools, listed_tools
from tests.fault.strategies import HOSTILE_PATHS, RealInputs, tool_arguments
from tests.pcaps import PCAPS
from tests.support.procs import zombies
from tests.support.raw import RawMCP

pytestmark = [pytest.mark.e2e, pytest.mark.fault]

# Every tool the daemon lists; test_every_listed_tool_is_fuzzed keeps this list honest.
TOOLS = [
    "diagd_status", "diagd_calls", "diagd_stop_actor", "diagd_reload", "diagd_timeline",
    "pcap_info", "pcap_index", "pcap_frames_by_filter", "pcap_timeline", "pcap_frame_detail", "pcap_text_search",
    "pcap_follow",
    "pcap_packet_list", "pcap_extract_subcapture", "ngap_ue_sessions", "ngap_pdu_session_summary",
    "pcap_list_fields", "pcap_fields_search", "pcap_config_get", "pcap_sequence_diagram",
    "pcap_stats",
    "list_ports", "configure_connection", "connection_status", "send_data", "read_urc", "set_signals", "get_log",
    "export_serial_pcapng",
    "list_probes", "list_helpers", "exec_program", "get_result", "stop_execution", "list_executions",
    "open_vmcore_session", "close_vmcore_session", "list_vmcore_sessions", "run_crash_command", "run_drgn_command",
    "get_command_output", "search_command_output", "get_crash_info", "load_module_debuginfo",
    "list_interfaces", "start_capture", "capture_status", "stop_capture", "list_captures",
    "diagd_record_start", "diagd_record_stop",
]

EXAMPLES = int(os.environ.get("DIAGD_FUZZ_EXAMPLES", "20"))
settings.register_profile(
    "diagd-fault", deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
PROFILE = settings.get_profile("diagd-fault")
CONTROL_SETTINGS = settings(PROFILE, max_examples=EXAMPLES)
MCP_SETTINGS = settings(PROFILE, max_examples=max(2, EXAMPLES // 4))

REAL_CAPTURES = [SMALL_PCAP, "adrian_sandbox_n4.pcap", "heplify_sip_ipv4_tcp.pcap"]
CRASH_VERBS = ["sys", "bt", "ps", "help", "sym", "p", "whatis", "struct", "mach", "kmem -i", "task", "nosuchcmd"]
DRGN_CODE = ["1", "prog['init_task'].comm", "len(list(for_each_task(prog)))", "prog.crashed_thread().tid",
             "print('x' * 100)", "raise ValueError('fuzz')", "def f(:", "prog['no_such_symbol']", "None"]
BPF_PROGRAMS = ['BEGIN { printf("fuzz\\n"); exit(); }', "interval:ms:100 { exit(); }",
                "tracepoint:sched:sched_switch { @n = count(); exit(); }", 'BEGIN { @x[1] = 2; print(@x); exit(); }',
                "kprobe:no_such_function_xyz { }", "BEGIN { exit() }}}", 'BEGIN { cat("/nonexistent"); exit(); }']


@pytest.fixture(scope="module")
def tool_schemas(rich_daemon: RichDaemon) -> dict[str, dict[str, Any]]:
    """As listed, with the declared output schemas: results are checked against their whole shape."""
    declared = declared_tools(rich_daemon.daemon)
    return {name: {**spec, "declaredOutputSchema": declared[name]["output_schema"]}
            for name, spec in listed_tools(rich_daemon.daemon).items()}


@pytest.fixture(scope="module")
def real_inputs(rich_daemon: RichDaemon) -> RealInputs:
    root = rich_daemon.root
    (root / "shadow.pcap").unlink(missing_ok=True)
    (root / "shadow.pcap").symlink_to("/etc/shadow")  # inside an allowed dir, pointing out of it
    (root / "text.pcap").write_text("not a capture\n" * 10)
    captures = [str(PCAPS / name) for name in REAL_CAPTURES if (PCAPS / name).exists()]
    paths = [*captures, str(root / "shadow.pcap"), str(root / "text.pcap"), str(root / "missing.pcap")]
    with rich_daemon.control(client="setup") as c:
        run = c.ok("exec_program", {"program": 'BEGIN { printf("done\\n"); exit(); }'})
        c.ok("get_result", {"execution_id": run["execution_id"], "wait_s": 10, "until": "done"})
        command_ids = []
        if rich_daemon.session_id:
            command_ids.append(c.ok("run_crash_command", {"command": "log", "session_id": rich_daemon.session_id})
                               ["command_id"])
            command_ids.append(c.ok("run_drgn_command", {"code": "print('w' * 50)",
                                                         "session_id": rich_daemon.session_id})["command_id"])
    fixture = rich_daemon.fixture
    modem = rich_daemon.modem
    sessions = [rich_daemon.session_id] if rich_daemon.session_id else []
    short_floats = st.floats(min_value=0, max_value=0.3)
    return RealInputs(
        by_name={
            "pcap_path": st.sampled_from(paths),
            "display_filter": st.sampled_from(["", "ngap", "sip", "pfcp", "frame.number <= 5", "tcp || sctp",
                                               "ngap &&", 'frame contains "REGISTER"', "nosuch.field == 1"]),
            "fields": st.sampled_from([["frame.number"], ["frame.number", "frame.time_relative", "ip.src"],
                                       ["ngap.procedureCode"], ["no.such.field"]]),
            "frame_number": st.integers(1, 40),
            "frame_numbers": st.lists(st.integers(1, 40), min_size=1, max_size=5),
            "layers": st.sampled_from([[], ["ngap"], ["nas-5gs", "sctp"], ["nosuchproto"]]),
            "query": st.sampled_from(["REGISTER", "ngap", "a", ".*", "(", "[", "\\", "sysrq", "panic"]),
            "prefix": st.sampled_from(["ngap", "sip.", "frame", "x"]),
            "interfaces": st.sampled_from([["lo"], ["diagd-fuzz-none0"], ["eth0", "lo"], ["*"]]),
            "port": st.sampled_from([str(modem.link), modem.path]),
            "payload": st.sampled_from(["AT", "ATI", "AT+CSQ", "", "7E01027E", "AT+CMGS=\"1\""]),
            "stop_pattern": st.sampled_from(["OK\r\n", ["OK\r\n", "ERROR\r\n"], "\x00"]),
            "program": st.sampled_from(BPF_PROGRAMS),
            "execution_id": st.just(run["execution_id"]),
            "vmcore_path": st.sampled_from([str(fixture.vmcore)] if fixture else ["/nonexistent"]),
            "vmlinux_path": st.sampled_from([str(fixture.vmlinux), str(root / "text.pcap")] if fixture else ["/x"]),
            "session_id": st.sampled_from(sessions) if sessions else st.just("nosession-0"),
            "command": st.tuples(st.sampled_from(CRASH_VERBS), st.sampled_from(["", " ", " 1", " -x", " init_task",
                                                                                  " \x00"]))
                         .map("".join),
            "code": st.sampled_from(DRGN_CODE),
            "command_id": st.sampled_from(command_ids) if command_ids else st.just("nosession-0:1"),
            "sources": st.sampled_from([[{"pcap": paths[0]}], [{"pcap": paths[0], "filter": "ngap &&"}],
                                        [{"serial": str(modem.link)}], [{"bpftrace": run["execution_id"]}],
                                        [{"crash": sessions[0] if sessions else "nosession-0"}], [{"nosuch": 1}],
                                        [{"pcap": paths[0], "offset_ms": 1e300}], []]),
            "dir": st.sampled_from([str(fixture.vmcore.parent) if fixture else "/nonexistent", "/etc", "/proc/self"]),
        },
        plain={
            "pcap_path": paths[0], "fields": ["frame.number"], "frame_numbers": [1], "frame_number": 1,
            "query": "a", "prefix": "ngap", "port": str(modem.link), "payload": "AT",
            "execution_id": run["execution_id"], "program": 'BEGIN { printf("x\\n"); exit(); }',
            "vmcore_path": str(fixture.vmcore) if fixture else "/nonexistent",
            "vmlinux_path": str(fixture.vmlinux) if fixture else "/nonexistent",
            "command": "sys", "code": "1", "command_id": command_ids[0] if command_ids else "nosession-0:1",
            "actor_id": "no-such-actor", "session_id": sessions[0] if sessions else "nosession-0",
            "sources": [{"pcap": paths[0]}], "dir": str(fixture.vmcore.parent) if fixture else "/nonexistent",
            "kind": "expert",
            # Capture is on with a pattern no interface matches: every start is refused, nothing captured.
            "interfaces": ["diagd-fuzz-none0"], "capture_id": "cap-00000000", "recording_id": "rec-00000000",
        },
        by_tool={
            # Never the shared session: closing it would end what every other crash example uses.
            ("close_vmcore_session", "session_id"): st.text(max_size=20),
            # The names issue 20's attack wrote the agent's bytes under, beside fresh stems.
            ("export_serial_pcapng", "name"): st.sampled_from(
                ["run1", "authorized_keys", ".bashrc", "a\nb", "../x", str(root / "authorized_keys"), "k.sh",
                 *HOSTILE_PATHS]),
        },
        bounded={
            "wait_s": short_floats,
            "timeout_ms": st.integers(0, 300),
            "break_ms": st.integers(1, 50),
            "timeout": st.floats(min_value=0.1, max_value=1.5),
            # Allow-listed crash options open a new 10-25 s session: only refused ones and the shared
            # session's own (none, which joins it) are used.
            "crash_args": st.sampled_from([[], ["-i", "/etc/shadow"], ["--no_crashrc"], ["--hex; id"],
                                           ["--kaslr", "$(id)"], ["-p"], ["/etc/shadow"]]),
        },
    )


def test_every_listed_tool_is_fuzzed(tool_schemas: dict[str, dict[str, Any]]) -> None:
    assert sorted(tool_schemas) == sorted(TOOLS)


def test_every_listed_tool_declares_an_output_schema(tool_schemas: dict[str, dict[str, Any]]) -> None:
    """Issue 11: a client can check every result, so every tool says what it returns."""
    missing = [name for name, spec in tool_schemas.items() if not spec.get("outputSchema")]
    assert missing == []


# Integers to JSON Schema (no fractional part), floats to Python: a handler that slices or ranges with
# one fails unless the registry hands it an int.
INTEGRAL_FLOATS = [5.0, 1e308, 2.0**70]
NUL_TEXT = "a\x00b"


@pytest.mark.parametrize("tool", TOOLS)
def test_integral_floats_and_nul_bytes_in_each_argument_get_a_result_or_a_coded_error(
        tool: str, rich_daemon: RichDaemon, tool_schemas: dict[str, dict[str, Any]], real_inputs: RealInputs) -> None:
    """A deterministic sweep beside the random fuzzing: every numeric argument as an integral float and
    every free-text argument with a NUL byte, the rest of the call valid."""
    spec = tool_schemas[tool]
    props: dict[str, Any] = spec["inputSchema"].get("properties", {})
    base = {name: real_inputs.plain[name] for name in spec["inputSchema"].get("required", [])}
    if "session_id" in props and tool != "close_vmcore_session":
        base["session_id"] = real_inputs.plain["session_id"]
    cases = []
    for name, sub in props.items():
        if sub.get("type") in ("integer", "number"):
            cases += [{**base, name: value} for value in INTEGRAL_FLOATS]
        if sub.get("type") == "string" and "enum" not in sub and "pattern" not in sub:
            cases.append({**base, name: NUL_TEXT})
    with rich_daemon.control(client=f"sweep-{tool}") as client, rich_daemon.control(client="watch") as watch:
        for args in cases:
            is_error, payload = client.call(tool, args)
            check_answer(tool, args, is_error, payload, spec)
            assert_still_serving(rich_daemon, watch)


def check_answer(tool: str, args: Any, is_error: bool, payload: Any, spec: dict[str, Any]) -> None:
    context = f"{tool}({json.dumps(args, default=repr)[:400]})"
    if is_error:
        assert_coded_error(payload, context=context)
        return
    assert isinstance(payload, dict), f"{context}: result is not an object: {payload!r}"
    for schema in (spec.get("outputSchema"), spec.get("declaredOutputSchema")):
        if not schema:
            continue
        try:
            jsonschema.validate(payload, schema)
        except jsonschema.ValidationError as exc:
            raise AssertionError(f"{context}: result breaks the output schema: {exc.message}") from None


def assert_still_serving(rich: RichDaemon, watch: ControlClient) -> None:
    assert rich.daemon.proc.poll() is None, f"the daemon died: {rich.daemon.log()[-3000:]}"
    assert watch.ok("diagd_status")["daemon"]["pid"] == rich.pid


@pytest.mark.parametrize("tool", TOOLS)
def test_fuzzed_arguments_over_the_control_socket_get_a_result_or_a_coded_error(
        tool: str, rich_daemon: RichDaemon, tool_schemas: dict[str, dict[str, Any]], real_inputs: RealInputs) -> None:
    spec = tool_schemas[tool]
    # One client name per tool: no tool's examples can act on another tool's defaults (crash's
    # "this client's last session").
    with rich_daemon.control(client=f"fuzz-{tool}") as client, rich_daemon.control(client="watch") as watch:

        @CONTROL_SETTINGS
        @given(tool_arguments(tool, spec["inputSchema"], real_inputs, json_wire=False))
        def example(args: dict[str, Any]) -> None:
            is_error, payload = client.call(tool, args)
            check_answer(tool, args, is_error, payload, spec)
            assert_still_serving(rich_daemon, watch)

        example()


def strict_json(text: str) -> Any:
    """JSON as the spec has it: NaN and Infinity (which Python's json writes by default) are not JSON."""
    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} in a JSON text: {text[:500]}")

    return json.loads(text, parse_constant=refuse)


def read_reply(raw: RawMCP, request_id: int) -> dict[str, Any]:
    """The answer to our one outstanding request (notifications are skipped)."""
    while True:
        message = raw.read()
        assert message is not None, f"the daemon closed the MCP connection instead of answering {request_id}"
        if "method" in message and "id" not in message:
            continue
        return message


@pytest.mark.parametrize("tool", TOOLS)
def test_fuzzed_arguments_over_mcp_get_a_result_or_a_coded_error(
        tool: str, rich_daemon: RichDaemon, tool_schemas: dict[str, dict[str, Any]], real_inputs: RealInputs) -> None:
    spec = tool_schemas[tool]
    ids = itertools.count(1)
    raw = RawMCP(rich_daemon.daemon.mcp_socket, timeout=90)
    try:
        raw.initialize()
        with rich_daemon.control(client="watch") as watch:

            @MCP_SETTINGS
            @given(tool_arguments(tool, spec["inputSchema"], real_inputs, json_wire=True))
            def example(args: dict[str, Any]) -> None:
                request_id = next(ids)
                raw.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                          "params": {"name": tool, "arguments": args}})
                reply = read_reply(raw, request_id)
                assert reply.get("id") == request_id, f"{tool}: answer with the wrong id: {reply}"
                if "error" in reply:
                    # A JSON-RPC error is fine for what the SDK refuses itself, but never its "unhandled
                    # exception" code 0 or an internal error.
                    error = reply["error"]
                    assert isinstance(error.get("code"), int) and isinstance(error.get("message"), str), reply
                    assert error["code"] not in (0, -32603), f"{tool}: {reply}"
                else:
                    result = reply["result"]
                    payload = strict_json(result["content"][0]["text"])
                    check_answer(tool, args, bool(result.get("isError")), payload, spec)
                    if not result.get("isError"):
                        assert result.get("structuredContent") == payload
                assert_still_serving(rich_daemon, watch)

            example()
    finally:
        raw.close()


def test_the_fuzzed_daemon_left_no_zombies_and_its_log_no_tracebacks(rich_daemon: RichDaemon) -> None:
    deadline = time.monotonic() + 5
    while zombies(rich_daemon.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert zombies(rich_daemon.pid) == []
    log = rich_daemon.daemon.log()
    assert "tool crashed" not in log, log[log.index("tool crashed") - 200:][:3000]
    for line in (rich_daemon.daemon.env.state / "audit.jsonl").read_text().splitlines():
        strict_json(line)  # every audit record stays JSON, whatever the arguments were


def test_the_fuzzed_daemon_wrote_files_only_under_names_it_made(rich_daemon: RichDaemon) -> None:
    # Every file a tool wrote is in an exports dir under diagd's safe alphabet and extension; none in
    # the allowed dirs the fuzzed arguments pointed at.
    state = rich_daemon.daemon.env.state
    for exports, extensions in ((state / "serial" / "exports", {".pcapng"}),
                                (state / "pcap" / "exports", {".pcapng", ".tsv"})):
        for path in exports.iterdir() if exports.is_dir() else []:
            assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", path.stem) and path.suffix in extensions, path
    assert not (rich_daemon.root / "authorized_keys").exists()
