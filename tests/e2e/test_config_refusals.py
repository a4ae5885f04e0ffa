"""A config with an error is the person's to fix: `diagd reload` (CLI, control socket, the diagd_reload
tool) refuses it whole and keeps the running one; `diagd serve` does not start on it. Real daemons."""

from __future__ import annotations

import json

import pytest

from tests.conftest import DaemonProcess, Env, start_daemon

pytestmark = pytest.mark.e2e

GOOD = '[daemon]\nextra_backends = ["echo_actor"]\nidle_timeout_s = 600\n'

# (what the file adds, what the refusal says)
MISTAKES = [
    ("[serial]\nbaudrat = 9600\n", "[serial] baudrat is not a setting (did you mean baudrate?)"),
    ('[serial.ports."/dev/ttyUSB0"]\nline_ending = "CRLF"\n',
     "[serial.ports.\"/dev/ttyUSB0\"] line_ending must be one of ['none', 'cr', 'lf', 'crlf'], not 'CRLF'"),
    ("[seriall]\nbaudrate = 9600\n", "[seriall] is not a table diagd reads (did you mean [serial]?)"),
    ("[pcap]\nmax_loaded = \"4\"\n", "[pcap] max_loaded must be an integer, not '4'"),
    ("[bpftrace]\nmax_lines = 0\n", "[bpftrace] max_lines must be positive, not 0"),
    ("[crash]\nallow_shel = true\n", "[crash] allow_shel is not a setting (did you mean allow_shell or allow_extend?)"),
    ("[mcp]\ntools = [\"pcapp\"]\n", "[mcp] tools"),
]


def test_reload_refuses_each_mistake_keeps_the_running_config_and_says_so(env: Env) -> None:
    env.write_config(GOOD + "[serial]\nbaudrate = 57600\n")
    daemon = start_daemon(env)
    try:
        for mistake, says in MISTAKES:
            env.write_config(GOOD + mistake)
            refused = env.run("reload")
            assert refused.returncode == 1 and refused.stdout == "", mistake
            prefix = f"diagd reload: INVALID_ARGUMENT: config {env.config} refused; the running config stays in force: "
            assert refused.stderr.startswith(prefix + says), refused.stderr
            assert len(refused.stderr.splitlines()) == 1
            tool = json.loads(env.run("call", "diagd_reload", "--visibility=off").stdout)
            assert tool["code"] == "INVALID_ARGUMENT" and says in tool["message"]
            assert tool["details"]["reloaded"] is False
        # The first config is still the one in force, and the back ends still work on it.
        ports = env.run("call", "list_ports", "--visibility=off")
        assert ports.returncode == 0, ports.stderr
        env.write_config(GOOD + "[serial]\nbaudrate = 9600\n")
        done = env.run("reload")
        assert done.returncode == 0 and json.loads(done.stdout)["changed"] == ["[serial] baudrate"]
        assert_alive(daemon)
    finally:
        daemon.stop()


def test_a_setting_outside_any_table_is_refused_too(daemon: DaemonProcess) -> None:
    daemon.env.write_config("call_timeout_s = 5\n" + GOOD)
    refused = daemon.env.run("reload")
    assert refused.returncode == 1
    assert "call_timeout_s is outside any table: settings go under a table such as [daemon] (did you mean " \
           "[daemon] call_timeout_s?)" in refused.stderr


@pytest.mark.parametrize(("mistake", "says"), MISTAKES[:3])
def test_serve_does_not_start_on_a_config_with_an_error(env: Env, mistake: str, says: str) -> None:
    env.write_config(GOOD + mistake)
    served = env.run("serve")
    assert served.returncode == 1
    last = served.stderr.splitlines()[-1]
    assert last == f"diagd: INVALID_ARGUMENT: config {env.config} refused: {says}", served.stderr
    assert not (env.runtime / "control.sock").exists()


def assert_alive(daemon: DaemonProcess) -> None:
    assert daemon.proc.poll() is None
    assert daemon.env.run("status").returncode == 0


def test_start_says_why_the_daemon_did_not_start(env: Env) -> None:
    env.write_config(GOOD + MISTAKES[0][0])
    started = env.run("start")
    assert started.returncode == 3
    assert started.stderr.startswith(f"diagd start: the daemon did not start (diagd: INVALID_ARGUMENT: config "
                                     f"{env.config} refused: {MISTAKES[0][1]}); see ")


def test_start_says_which_extra_back_end_it_could_not_import_in_one_line(env: Env) -> None:
    env.write_config('[daemon]\nextra_backends = ["echo_actor", "no_such_backend_mod"]\n')
    started = env.run("start")
    assert started.returncode == 3 and "Traceback" not in started.stderr
    assert started.stderr.startswith("diagd start: the daemon did not start (diagd: INVALID_ARGUMENT: [daemon] "
                                     "extra_backends: cannot import 'no_such_backend_mod' (No module named "
                                     "'no_such_backend_mod'); is it on the daemon's PYTHONPATH?); see "), started.stderr
