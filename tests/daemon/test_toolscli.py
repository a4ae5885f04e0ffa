"""`diagd tools`: the first sentence of each description, as the table shows it; the list a daemon serves,
and the same list built without one (the installed back ends under this config); the groups that are off."""

from __future__ import annotations

import json
from typing import Any

import pytest

from diagd.actors.capture import OFF_HINT, OFF_REASON
from diagd.daemon.cli.toolscli import first_sentence, show
from tests.conftest import Env, start_daemon


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Stop an actor. It releases its resource.", "Stop an actor"),
        ("Fields starting with prefix (e.g. 'ngap.'), optionally with keyword.",
         "Fields starting with prefix (e.g. 'ngap.'), optionally with keyword"),
        ("Cut to layers (e.g. ['nas-5gs']); verbosity=full adds hex. More.",
         "Cut to layers (e.g. ['nas-5gs']); verbosity=full adds hex"),
        ("Set DTR/RTS, i.e. the lines. Then more.", "Set DTR/RTS, i.e. the lines"),
        ("bt, log, kmem etc. run as typed. Cached.", "bt, log, kmem etc. run as typed"),
        ("Works with SDK 2.3 and ngap.procedureCode in file.pcap. Second.",
         "Works with SDK 2.3 and ngap.procedureCode in file.pcap"),
        ("Version 1.32. Next sentence.", "Version 1.32"),
        ("Is it open? Then close it.", "Is it open"),
        ("Contexts. view=procedures: each procedure.", "Contexts"),  # a sentence may start lower-case
        ("No period at all", "No period at all"),
        ("First line. \nSecond line.", "First line"),
        ("A first line\nwith more", "A first line"),
        ("x" * 150, "x" * 99 + "…"),
    ],
)
def test_first_sentence_ends_at_a_sentence_end_not_at_an_abbreviation_or_a_dotted_word(text: str,
                                                                                      expected: str) -> None:
    assert first_sentence(text) == expected


# -- with no daemon running: the catalogue built from the installed back ends, as a daemon would serve it

# An off back end's table is read too: [capture] without allowed_interfaces must not refuse the start.
CAPTURE = {"off": "[capture]\nmax_bytes = 1048576\n", "on": '[capture]\nallowed_interfaces = ["lo"]\n'}


def catalogue_of(env: Env) -> dict[str, Any]:
    listing = env.run("tools", "--json")
    assert listing.returncode == 0, listing.stderr
    catalogue: dict[str, Any] = json.loads(listing.stdout)
    return catalogue


def snapshot(env: Env) -> list[tuple[str, int, int]]:
    return sorted((str(p), p.stat().st_mtime_ns, p.stat().st_size) for root in (env.state, env.runtime)
                  if root.exists() for p in [root, *root.rglob("*")])


@pytest.mark.e2e
@pytest.mark.parametrize("capture", ["off", "on"])
def test_without_a_daemon_the_catalogue_is_the_one_a_daemon_with_this_config_serves(env: Env, capture: str) -> None:
    env.write_config(env.config.read_text() + CAPTURE[capture])
    daemon = start_daemon(env)
    try:
        served = catalogue_of(env)
    finally:
        assert daemon.stop() == 0, daemon.log()
    before = snapshot(env)
    offline = env.run("tools", "--json")
    assert snapshot(env) == before  # the daemon's state and runtime dirs: nothing read into being, nothing written
    assert offline.returncode == 0, offline.stderr
    assert "no daemon runs: the installed back ends' tools under " + str(env.config) in offline.stderr
    built = json.loads(offline.stdout)
    assert built == served  # names, groups, descriptions, both schemas, [mcp] tools, the off groups
    assert "echo_actor" in built["groups"] and "echo" in {t["name"] for t in built["tools"]}  # extra_backends too
    capture_tools = {t["name"] for t in built["tools"] if t["group"] == "capture"}
    if capture == "off":
        assert not capture_tools and built["off"] == {"capture": {"reason": OFF_REASON, "hint": OFF_HINT}}
    else:
        assert "start_capture" in capture_tools and built["off"] == {}


def test_the_offline_list_touches_no_state_or_runtime_dir_and_shows_the_off_groups(env: Env) -> None:
    shown = env.run("tools")
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr.startswith("diagd tools: no daemon runs: the installed back ends' tools under")
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("groups: diagd, ")
    assert f"off: capture: {OFF_REASON}; to turn it on: {OFF_HINT}" in lines
    assert "[capture] in config.toml, then `diagd restart`" in OFF_HINT
    assert any(line.split()[:2] == ["pcap_info", "pcap"] for line in lines)
    assert not env.state.exists() and not env.runtime.exists()
    schema = env.run("tools", "pcap_info")
    assert schema.returncode == 0 and json.loads(schema.stdout)["type"] == "object"


def test_show_lists_each_off_group_with_its_reason_and_hint(capsys: pytest.CaptureFixture[str]) -> None:
    catalogue = {"groups": ["diagd"], "configured": None, "tools": [
        {"name": "diagd_status", "group": "diagd", "description": "Daemon status. More."}],
        "off": {"x": {"reason": "x is off: [x] y is empty", "hint": "set [x] y = 1, then `diagd restart`"}}}
    assert show(catalogue, None) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "off: x: x is off: [x] y is empty; to turn it on: set [x] y = 1, then `diagd restart`"
    assert out[-1].split() == ["diagd_status", "diagd", "Daemon", "status"]
    del catalogue["off"]  # an older daemon's answer
    assert show(catalogue, None) == 0 and "off:" not in capsys.readouterr().out
