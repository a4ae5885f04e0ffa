"""What the daemon does not load until it is needed (issue 12: a lighter daemon)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("mcp", "mcp_types", "pydantic", "starlette", "httpx2", "uvicorn", "cryptography", "anyio")


def loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(sorted(n for n, m in sys.modules.items() if m is not None)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    return set(done.stdout.split())


def test_the_daemon_and_its_back_ends_load_without_the_mcp_sdk() -> None:
    # What `diagd serve` imports before its first MCP client: the server, every back end's tools.
    modules = loaded_after("import diagd.daemon.server.server\nimport importlib\nfrom diagd.daemon import discovery\n"
                           "for b in discovery.installed(): importlib.import_module(b.module)")
    assert not {m.split(".")[0] for m in modules} & set(HEAVY)


def test_the_mcp_front_end_still_brings_the_sdk() -> None:
    # The check above means something: the module the daemon imports on the first MCP connection.
    assert "mcp" in loaded_after("import diagd.daemon.server.mcp.front")


def test_serve_keeps_rich_out() -> None:
    # structlog imports rich when it is installed; `diagd serve` refuses it (daemon/cli/cli.py NOT_IN_DAEMON).
    modules = loaded_after("import sys\nfrom diagd.daemon.cli import cli\n"
                           "for name in cli.NOT_IN_DAEMON: sys.modules.setdefault(name, None)\n"
                           "import diagd.daemon.server.server")
    assert "rich" not in modules and "pygments" not in modules


def test_the_mcp_front_end_leaves_the_sdks_client_and_high_level_server_out() -> None:
    # daemon/server/mcp/sdk.py: the SDK's package __init__s would bring its client, httpx and MCPServer (~12 MB).
    modules = loaded_after("from diagd.daemon.server import server\nserver._import_front()")
    assert "mcp.server.lowlevel.server" in modules and "diagd.daemon.server.mcp.front" in modules
    assert not {"mcp.client", "mcp.client.streamable_http", "mcp.server.mcpserver", "httpx2", "cryptography"} & modules


def test_the_whole_sdk_is_still_there_when_asked_for() -> None:
    modules = loaded_after("from diagd.daemon.server import server\nserver._import_front()\nfrom mcp import Client\n"
                           "from mcp.server import MCPServer, Server\n"
                           "from mcp.server.lowlevel.server import Server as LowLevel\n"
                           "assert Server is LowLevel and Client.__module__ == 'mcp.client.client'")
    assert "mcp.client" in modules and "mcp.server.mcpserver" in modules


def test_lean_leaves_an_sdk_already_imported_as_it_is() -> None:
    modules = loaded_after("import mcp, sys\nfrom diagd.daemon.server.mcp import sdk\nsdk.lean()\n"
                           "assert sys.modules['mcp'] is mcp")
    assert "mcp.client" in modules


def test_the_http_stack_stays_out_of_a_daemon_without_http() -> None:
    # [http] listen unset: the MCP front end alone must not bring hypercorn and its h11/h2 stack.
    modules = loaded_after("from diagd.daemon.server import server\nserver._import_front()")
    assert not {m.split(".")[0] for m in modules} & {"hypercorn", "h11", "h2", "wsproto"}
    assert "hypercorn" in loaded_after("import diagd.daemon.server.http.front")
