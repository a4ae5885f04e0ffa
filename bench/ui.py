"""The web view (/ui): how long after a call ends, for its client, its row appears in the browser.

Run from the repository root:

    .venv/bin/python bench/ui.py [--calls 100] [--json]

It starts an isolated daemon (bench/_daemon.py) with `[http] listen` on a free loopback port, logs a
headless Chromium (Debian's /usr/bin/chromium through Playwright) into /ui with the one-time link of
`diagd ui --print`, and makes `--calls` calls of `diagd_calls` (each with an argument of its own) over
the control socket, one after another. For each, the time from the reply's arrival (time.time() in
this process) to the moment a MutationObserver in the page sees the call's finished row (Date.now(),
the same clock) is one sample: the registry's observer, the event stream, the browser's parsing and
the DOM update, everything the engineer waits for. Warm-up calls come first (not counted); the page
keeps up to 500 rows, as in use. Target: at most 0.5 s.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from _daemon import isolated_daemon
from _proc import free_port
from _report import report

from diagd.protocol import control
from tests.support import ui_browser

DIAGD = str(Path(sys.executable).parent / "diagd")
WARMUP_CALLS = 20
TARGET_MS = 500.0


def measure(calls: int) -> list[float]:
    """Milliseconds from each call's end to its row in the page."""
    port = free_port()
    with isolated_daemon("ui", config=f'[http]\nlisten = "127.0.0.1:{port}"\n') as daemon:
        link = subprocess.run([DIAGD, "ui", "--print"], env=daemon.env, capture_output=True, text=True,
                              check=True).stdout.strip()
        with ui_browser.chromium() as browser:
            page = browser.new_page()
            page.goto(link)
            page.wait_for_url(f"http://127.0.0.1:{port}/ui")
            page.wait_for_selector("#live.on")
            ui_browser.watch(page)
            samples = []
            with control.BlockingClient(str(daemon.control_socket), client="bench-ui", timeout=60) as client:
                for i in range(WARMUP_CALLS + calls):
                    text = f"bench-{i}"
                    ui_browser.want(page, text)
                    reply = client.request(control.CallRequest, tool="diagd_calls", arguments={"tool": text})
                    ended = time.time()
                    if reply["is_error"]:
                        raise RuntimeError(f"tool error: {reply}")
                    seen = ui_browser.seen_at(page, text)
                    if i >= WARMUP_CALLS:
                        samples.append((seen - ended) * 1000)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    return report(measure(args.calls), count="calls", label="call end -> row in Chromium", unit="ms", digits=1,
                  target=TARGET_MS, judged="max", as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
