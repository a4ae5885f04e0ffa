"""The web view (/ui) in a real Chromium, for tests/e2e/test_ui.py and bench/ui.py: Debian's chromium
through Playwright (no browser download), and a watch in the page that notes the wall-clock time
(Date.now(), the same clock as time.time() here) at which a call's finished row appears."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHROMIUM = "/usr/bin/chromium"

# A MutationObserver on the call list: window.__seen[text] = Date.now() the first time a finished row
# (data-outcome not "started") whose arguments cell holds `text` is there. Installed after the page
# loaded; checks what is there already too.
WATCH = """() => {
  window.__seen = window.__seen || {};
  window.__wanted = window.__wanted || [];
  const look = () => {
    for (const tr of document.querySelectorAll('#calls tbody tr')) {
      if (tr.dataset.outcome === 'started') continue;
      const args = tr.querySelector('td.args');
      if (!args) continue;
      for (const text of window.__wanted) {
        if (!(text in window.__seen) && args.textContent.includes(text)) window.__seen[text] = Date.now();
      }
    }
  };
  window.__look = look;
  new MutationObserver(look).observe(document.querySelector('#calls tbody'),
                                     {childList: true, subtree: true, characterData: true});
  look();
}"""


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Playwright's Browser); `--no-sandbox` when running as root."""
    from playwright.sync_api import sync_playwright

    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            yield browser
        finally:
            browser.close()


def watch(page: Any) -> None:
    page.evaluate(WATCH)


def want(page: Any, text: str) -> None:
    """Watch for a finished row whose arguments hold `text` (before the call is made)."""
    page.evaluate("(text) => { window.__wanted.push(text); window.__look(); }", text)


def seen_at(page: Any, text: str, timeout_ms: float = 10_000) -> float:
    """The wall-clock time (s) the row for `text` appeared; waits for it up to `timeout_ms`."""
    page.wait_for_function("(text) => text in window.__seen", arg=text, timeout=timeout_ms)
    return float(page.evaluate("(text) => window.__seen[text]", text)) / 1000
