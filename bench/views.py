"""The ladder view (MCP Apps, docs/views.md): how long Chromium takes to draw 2,000 messages.

Run from the repository root:

    .venv/bin/python bench/views.py [--runs 10] [--json]

It builds the views (scripts/build-views.sh), starts an isolated daemon (bench/_daemon.py) serving them,
and, as an MCP client declaring MCP Apps through the `diagd mcp` shim, reads the ladder view
(resources/read) and two pages of `pcap_sequence_diagram` on the corpus' heplify_fax_call_t38_sip.pcap
(`udp`, max_arrows 1000: frames 1-1000, then offset 1000). A headless Chromium (Debian's, through
Playwright) loads the test-only MCP Apps host (daemon/views/test/host.ts) and, per run, renders the view
with the first page, then clicks its "Load more": the host answers the view's tools/call with the second
page, already fetched (no daemon time is counted), and the view draws all 2,000 arrows anew. One sample:
from the click to the 2,000th arrow in the view's DOM and two animation frames after it (painted). The
first run warms up and is not counted. Target (issue 45): at most 1 s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio
from _daemon import DIAGD, isolated_daemon
from _proc import REPO
from _report import report
from mcp import Client
from mcp.client.extension import advertise
from mcp.client.stdio import StdioServerParameters

from diagd.daemon import app_views
from tests.pcaps import PCAPS  # the test corpus' cache (_proc put the repository on sys.path)

CHROMIUM = "/usr/bin/chromium"
SIP = PCAPS / "heplify_fax_call_t38_sip.pcap"
PAGE = 1000
TARGET_S = 1.0
HANG_GUARD_S = 120  # not a measurement: only stops a wait that hangs


def dumped(result: Any) -> dict[str, Any]:
    out: dict[str, Any] = result.model_dump(by_alias=True, exclude_none=True, mode="json")
    return out


async def fetch(env: dict[str, str], args: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The ladder view's HTML and the two pages, as an MCP Apps host gets them."""
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=env)
    apps = [advertise(app_views.EXTENSION_ID, {"mimeTypes": [app_views.MIME_TYPE]})]
    async with Client(params, mode="legacy", extensions=apps) as client:
        html = dumped(await client.read_resource("ui://diagd/ladder"))["contents"][0]["text"]
        first = dumped(await client.call_tool("pcap_sequence_diagram", args))
        second = dumped(await client.call_tool("pcap_sequence_diagram", {**args, "offset": PAGE}))
    for page in (first, second):
        if page.get("isError") or len(page["structuredContent"]["messages"]) != PAGE:
            raise RuntimeError(f"not a page of {PAGE} messages: {json.dumps(page)[:500]}")
    return html, first, second


def measure(runs: int) -> list[float]:
    views = Path(subprocess.run([str(REPO / "scripts/build-views.sh")], check=True, capture_output=True, text=True,
                                timeout=600).stdout.strip().splitlines()[-1])
    args = {"pcap_path": str(SIP), "display_filter": "udp", "max_arrows": PAGE}
    with isolated_daemon("views", config=f'[daemon]\nallowed_dirs = ["{PCAPS}"]\n',
                         extra_env={app_views.ENV: str(views)}) as daemon:
        html, first, second = trio.run(fetch, daemon.env, args)
    from playwright.sync_api import sync_playwright

    def call_tool(params: str) -> str:
        asked = json.loads(params)
        if asked["name"] != "pcap_sequence_diagram" or asked["arguments"].get("offset") != PAGE:
            raise RuntimeError(f"unexpected call {asked}")
        return json.dumps(second)

    samples = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(HANG_GUARD_S * 1000)
            page.expose_function("diagdCallTool", call_tool)
            page.goto((views.parent / "test" / "host.html").as_uri())
            for _ in range(runs + 1):
                page.evaluate("o => window.diagdHost.load(o)", {"html": html, "toolName": "pcap_sequence_diagram",
                                                                "args": args, "result": first, "csp": None})
                frame = page.frame_locator("#view")
                frame.locator(f"svg.ladder g.arrow >> nth={PAGE - 1}").wait_for(state="attached")
                started = time.monotonic()
                frame.locator("#more").click()
                frame.locator(f"svg.ladder g.arrow >> nth={2 * PAGE - 1}").wait_for(state="attached")
                view = next(f for f in page.frames if f != page.main_frame)
                view.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
                samples.append(time.monotonic() - started)
                if view.evaluate("() => document.querySelectorAll('svg.ladder g.arrow').length") != 2 * PAGE:
                    raise RuntimeError("the view did not draw 2,000 arrows")
        finally:
            browser.close()
    return samples[1:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not SIP.exists():
        sys.exit(f"the shared capture corpus is not in {PCAPS}")
    return report(measure(args.runs), count="runs", label="ladder: 2,000 messages drawn", unit="s", digits=3,
                  target=TARGET_S, judged="median", as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
