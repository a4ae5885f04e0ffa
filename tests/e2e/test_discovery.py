"""A back end installed as a `diagd.backends` entry point is found like the built-in ones, with no daemon change.

The tests' echo back end (tests/support/echo_actor.py) is "installed" the way pip installs one: a
dist-info directory with an entry_points.txt on the daemon's path, and no `extra_backends` in the
config. The daemon discovers it, lists its tools under its group, gives its instructions to a
client that selected it and reads its own diagd_timeline source.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests import backends
from tests.conftest import Env, start_daemon
from tests.e2e.test_mcp import call, mcp_client, payload

pytestmark = pytest.mark.e2e

AT = 1_700_000_000  # 2023-11-14T22:13:20Z


def install_echo(env: Env) -> None:
    site = env.root / "site"
    dist = site / "diagd_echo_test-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: diagd-echo-test\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[diagd.backends]\necho_actor = echo_actor\n")
    env.vars["PYTHONPATH"] = f"{site}:{env.vars['PYTHONPATH']}"  # echo_actor itself: tests/support, already there
    env.write_config("[daemon]\nidle_timeout_s = 600\n\n[echo_actor]\nprefix = \"> \"\n")


async def test_an_installed_back_end_is_discovered_with_its_group_instructions_and_timeline_source(env: Env) -> None:
    install_echo(env)
    daemon = start_daemon(env)
    try:
        listing = env.run("tools", "--json")
        assert listing.returncode == 0, listing.stderr
        catalogue: dict[str, Any] = json.loads(listing.stdout)
        # Every built-in back end besides: serving tools, or off under this config (capture, without interfaces).
        built_in = set(backends.names())
        assert "echo_actor" in catalogue["groups"] and built_in <= {*catalogue["groups"], *catalogue["off"]}
        assert {t["name"]: t["group"] for t in catalogue["tools"]}["echo"] == "echo_actor"
        async with mcp_client(env, "--tools", "echo_actor") as client:  # the shim knows the group too
            assert client.instructions is not None
            assert "echo repeats a message" in client.instructions and "pcap_info" not in client.instructions
            assert "echoed messages" in client.instructions  # what diagd_timeline merges, as declared
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) - {n for n in tools if n.startswith("diagd_")} == {"echo"}
            sources = tools["diagd_timeline"].input_schema["properties"]["sources"]["description"]
            assert "echo_actor" in sources and "message" in sources
            assert "options of some kinds: at, filter" in client.instructions  # its source's own option, as declared
            result = await call(client, "diagd_timeline", {"sources": [
                {"echo_actor": "hi", "at": AT}, {"echo_actor": "later", "at": AT + 1, "offset_ms": -500}]})
            assert not result.is_error, payload(result)
            rows = payload(result)["rows"]
            assert [(r["source"], r["time"], r["echo"]) for r in rows] == [
                ("echo_actor:hi", "2023-11-14T22:13:20.000000Z", "> hi"),
                ("echo_actor:later", "2023-11-14T22:13:20.500000Z", "> later")]
            refused = await call(client, "diagd_timeline", {"sources": [{"echo_actor": "hi", "at": "noon"}]})
            assert refused.is_error and payload(refused)["details"]["path"] == "$.sources[0].at"
    finally:
        daemon.stop()
