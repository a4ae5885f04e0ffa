"""The tools' views (MCP Apps, SEP-1865: docs/views.md) end to end, in a real browser.

scripts/build-views.sh builds the views and a test-only MCP Apps host (daemon/views/test/host.ts: the
AppBridge of @modelcontextprotocol/ext-apps). A real daemon serves the views through the real shim
(resources/read, to a client that declares MCP Apps); Chromium (Playwright, Debian's build) loads the host,
which renders each view in a sandboxed iframe under the CSP its `_meta.ui.csp` asks for, sends it the tool's
input and result, and forwards the view's own tools/call to the daemon (`window.diagdCallTool`, exposed
here). The DOM is then checked against tshark's own answers for the same frames. Screenshots are kept under
the test's tmp_path (printed). No view may fetch anything: every request the page makes is recorded.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client
from mcp.client.extension import advertise
from mcp.client.stdio import StdioServerParameters

from diagd.daemon import app_views
from tests.conftest import DIAGD, DaemonProcess, start_daemon
from tests.e2e.test_pcap import make_env
from tests.pcaps import PCAPS
from tests.support import stats_oracle as oracle
from tests.support.pcapedit import PCAP_MAGICS, packets

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]

TOP = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
SIP = PCAPS / "heplify_fax_call_t38_sip.pcap"  # 7217 UDP frames: SIP, Megaco, T.38, RTP
REJECT = PCAPS / "adrian_registration_reject.pcap"  # a 5G registration ending in a REGISTRATION REJECT
XSS = "<img src=x onerror=window.__xss=1>"
# The CSP a host derives from `_meta.ui.csp = {}` (no outside origin): the spec's default.
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
       "media-src data:; connect-src 'none'; frame-src 'none'; base-uri 'none'")
APPS = [advertise(app_views.EXTENSION_ID, {"mimeTypes": [app_views.MIME_TYPE]})]
HANG_GUARD_S = 60  # not a measurement: only stops a wait that hangs


def tshark_frames(path: Path, flt: str) -> list[int]:
    out = subprocess.run(["tshark", "-r", str(path), "-n", "-Y", flt, "-T", "fields", "-e", "frame.number"],
                         check=True, capture_output=True, text=True).stdout
    return [int(line) for line in out.split()]


@pytest.fixture(scope="module")
def views_dir() -> Path:
    """The built views (scripts/build-views.sh: cached by a hash of daemon/views)."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: the views cannot be built (scripts/build-views.sh)")
    built = subprocess.run([str(TOP / "scripts/build-views.sh")], check=True, capture_output=True, text=True,
                           timeout=600)
    return Path(built.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def views_daemon(tmp_path_factory: pytest.TempPathFactory, views_dir: Path) -> Iterator[DaemonProcess]:
    if not SIP.exists() or not REJECT.exists():
        pytest.skip(f"the shared capture corpus is not in {PCAPS}")
    root = tmp_path_factory.mktemp("viewsd")
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}", "{root}"]\n'
                         f'[serial]\nallowed_ports = ["{root}/tty*"]\n')
    daemon = start_daemon(env, {app_views.ENV: str(views_dir)})
    yield daemon
    daemon.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


class DaemonClient:
    """An MCP client of the daemon through the real shim, in a Trio thread of its own, for the synchronous
    Playwright test and the page's calls. `apps`: it declares MCP Apps (as a host that renders views)."""

    def __init__(self, daemon: DaemonProcess, *, apps: bool = True) -> None:
        self.params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=daemon.env.vars)
        self.apps = apps
        self.client: Client | None = None
        self.token: trio.lowlevel.TrioToken | None = None
        self.ready = threading.Event()
        self.stop: trio.Event | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        async def main() -> None:
            async with Client(self.params, mode="legacy", extensions=APPS if self.apps else None) as client:
                self.client, self.token, self.stop = client, trio.lowlevel.current_trio_token(), trio.Event()
                self.ready.set()
                await self.stop.wait()
        try:
            trio.run(main)
        except BaseException as exc:  # shown by the test that waits for it
            self.error = exc
            self.ready.set()

    def __enter__(self) -> DaemonClient:
        self.thread.start()
        assert self.ready.wait(60) and self.error is None, self.error
        return self

    def __exit__(self, *exc: object) -> None:
        if self.stop is not None and self.token is not None:
            trio.from_thread.run_sync(self.stop.set, trio_token=self.token)
        self.thread.join(30)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        async def bounded() -> Any:
            with trio.fail_after(HANG_GUARD_S):
                return await fn(*args)
        return trio.from_thread.run(bounded, trio_token=self.token)

    def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        assert self.client is not None
        result = self.run(self.client.call_tool, name, args)
        dumped: dict[str, Any] = result.model_dump(by_alias=True, exclude_none=True, mode="json")
        return dumped

    def tools(self) -> list[dict[str, Any]]:
        assert self.client is not None
        listed = self.run(self.client.list_tools)
        return [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in listed.tools]

    def read(self, uri: str) -> dict[str, Any]:
        assert self.client is not None
        read: dict[str, Any] = self.run(self.client.read_resource, uri).model_dump(
            by_alias=True, exclude_none=True, mode="json")
        return read


@pytest.fixture
def apps(views_daemon: DaemonProcess) -> Iterator[DaemonClient]:
    with DaemonClient(views_daemon) as client:
        yield client


class Host:
    """The test host page in Chromium, joined to the daemon: what it requested, and its view's frame."""

    def __init__(self, page: Any, client: DaemonClient, shots: Path) -> None:
        self.page, self.client, self.shots = page, client, shots
        self.requests: list[str] = []
        self.calls: list[str] = []
        page.on("request", lambda request: self.requests.append(request.url))

        def call_tool(params: str) -> str:
            asked = json.loads(params)
            self.calls.append(asked["name"])
            return json.dumps(client.call(asked["name"], asked.get("arguments") or {}))

        page.expose_function("diagdCallTool", call_tool)
        page.goto((shots.parent / "host.html").as_uri())
        self.home = page.url

    def show(self, tool: str, args: dict[str, Any], *, csp: str | None = CSP,
             result: dict[str, Any] | None = None) -> Any:
        """Render `tool`'s view (read from the daemon, as a host reads it) with the tool's real result (or
        with `result`, a reply no capture could produce)."""
        uri = next(t["_meta"]["ui"]["resourceUri"] for t in self.client.tools() if t["name"] == tool)
        html = self.client.read(uri)["contents"][0]["text"]
        result = self.client.call(tool, args) if result is None else result
        assert not result.get("isError"), result
        self.page.evaluate("o => window.diagdHost.load(o)",
                           {"html": html, "toolName": tool, "args": args, "result": result, "csp": csp})
        return self.page.frame_locator("#view")

    def frame(self) -> Any:
        """The view's frame (for evaluating in its window)."""
        return next(f for f in self.page.frames if f != self.page.main_frame)

    def shot(self, name: str) -> None:
        """The view's iframe as drawn (after the view's next two frames: a fresh tree or page is painted)."""
        path = self.shots / f"{name}.png"
        self.frame().evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        self.page.locator("#view").screenshot(path=str(path))
        print(f"screenshot: {path}")

    def fetched(self) -> list[str]:
        """Every request but the host page itself: a view must fetch nothing."""
        return [url for url in self.requests if url != self.home]


@pytest.fixture
def host(apps: DaemonClient, views_dir: Path, tmp_path: Path) -> Iterator[Host]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt install chromium)")
    from playwright.sync_api import sync_playwright

    shots = tmp_path / "screenshots"
    shots.mkdir()
    shutil.copy(views_dir.parent / "test" / "host.html", tmp_path / "host.html")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(HANG_GUARD_S * 1000)
            yield Host(page, apps, shots)
        finally:
            browser.close()


def numbers(view: Any, selector: str) -> list[int]:
    return [int(n) for n in view.locator(selector).evaluate_all("rows => rows.map(r => r.dataset.frame)")]


# ---------------------------------------------------------------------------------------------
# What the daemon serves


def test_only_apps_hosts_see_views_and_each_is_one_inline_html(views_daemon: DaemonProcess,
                                                              apps: DaemonClient) -> None:
    with DaemonClient(views_daemon, apps=False) as plain:
        before = plain.tools()
    after = apps.tools()
    assert not any("_meta" in t for t in before)  # a host without MCP Apps: the tools as they always were
    shown = {t["name"]: t["_meta"]["ui"]["resourceUri"] for t in after if "_meta" in t}
    assert shown == {"pcap_frames_by_filter": "ui://diagd/packet-list", "pcap_sequence_diagram": "ui://diagd/ladder",
                     "pcap_stats": "ui://diagd/stats", "ngap_ue_sessions": "ui://diagd/ue-procedures",
                     "get_log": "ui://diagd/serial-console"}
    assert [{k: v for k, v in t.items() if k != "_meta"} for t in after] == before

    assert apps.client is not None
    listed = apps.run(apps.client.list_resources).model_dump(by_alias=True, exclude_none=True, mode="json")
    assert sorted(r["uri"] for r in listed["resources"]) == sorted(shown.values())
    for uri in shown.values():
        content = apps.read(uri)["contents"][0]
        html = content["text"]
        assert content["mimeType"] == "text/html;profile=mcp-app"
        assert content["_meta"]["ui"]["csp"] == {}  # no connect, resource, frame or base-uri origin
        assert len(html.encode()) <= 300 * 1024
        # Inline only: no element loads anything from anywhere.
        assert not re.search(r"<(script|link|img|iframe)[^>]*\b(src|href)\s*=", html, re.IGNORECASE), uri
        assert "<script type=\"module\">" in html


def test_only_apps_hosts_get_the_ladders_data_and_the_rest_of_the_reply_is_the_same(
        views_daemon: DaemonProcess, apps: DaemonClient) -> None:
    """`messages` (the arrows as data) is the ladder view's: a host without MCP Apps gets the reply as it
    always was, an Apps host the same reply plus `messages`, one per arrow of `diagram`."""
    args = {"pcap_path": str(REJECT), "display_filter": "ngap"}
    with DaemonClient(views_daemon, apps=False) as plain:
        before = plain.call("pcap_sequence_diagram", args)["structuredContent"]
    after = apps.call("pcap_sequence_diagram", args)["structuredContent"]
    assert "messages" not in before
    messages = after.pop("messages")
    assert after == before
    assert len(messages) == before["arrows"] == before["diagram"].count("->>") + before["diagram"].count("-x")


def test_an_unknown_view_is_a_protocol_error_with_close_matches(apps: DaemonClient) -> None:
    from mcp.shared.exceptions import MCPError

    with pytest.raises(MCPError) as refused:
        apps.read("ui://diagd/packet-lst")
    assert refused.value.error.code == -32602
    assert refused.value.error.data["did_you_mean"] == ["ui://diagd/packet-list"]


# ---------------------------------------------------------------------------------------------
# The packet list


def test_packet_list_pages_filters_and_opens_a_frame(host: Host) -> None:
    sip = tshark_frames(SIP, "sip")
    args = {"pcap_path": str(SIP), "display_filter": "sip", "limit": 50}
    view = host.show("pcap_frames_by_filter", args)
    rows = view.locator("#rows tr")
    rows.first.wait_for()
    assert numbers(view, "#rows tr") == sip[:50]  # the daemon's page, as tshark counts it
    assert view.locator("#head th").all_inner_texts()[:7] == [
        "No.", "Time", "Source", "Destination", "Protocol", "Length", "Info"]
    # The total as the daemon knew it: exact, or a lower bound while the capture still loads.
    shown = re.fullmatch(r"1–50 of (at least )?(\d+)", view.locator("#range").inner_text())
    assert shown and (int(shown[2]) == len(sip) if not shown[1] else 50 < int(shown[2]) <= len(sip)), shown
    host.shot("packet-list")

    view.locator("#next").click()  # the next page, through the host
    view.locator(f"#rows tr[data-frame='{sip[50]}']").wait_for()
    assert numbers(view, "#rows tr") == sip[50:100]

    ok = tshark_frames(SIP, "sip.Status-Code >= 200")
    view.locator("#filter").fill("sip.Status-Code >= 200")
    view.locator("#apply").click()
    view.locator(f"#rows tr[data-frame='{ok[0]}']").wait_for()
    assert numbers(view, "#rows tr") == ok[:50]

    view.locator(f"#rows tr[data-frame='{ok[0]}']").click()
    tree = view.locator(f"#detail section[data-frame='{ok[0]}']")
    tree.wait_for()
    assert "Session Initiation Protocol" in tree.inner_text()
    host.shot("packet-list-detail")
    assert host.calls == ["pcap_frames_by_filter", "pcap_frames_by_filter", "pcap_frame_detail"]
    assert host.fetched() == []


def test_a_bad_filter_is_shown_as_the_daemons_error(host: Host) -> None:
    view = host.show("pcap_frames_by_filter", {"pcap_path": str(SIP), "display_filter": "sip", "limit": 5})
    view.locator("#rows tr").first.wait_for()
    view.locator("#filter").fill("sip.nonsense_field == 1")
    view.locator("#apply").click()
    status = view.locator("#status.error")
    status.wait_for()
    assert "INVALID_FILTER" in status.inner_text()


# ---------------------------------------------------------------------------------------------
# The ladder diagram


def test_ladder_draws_every_message_marks_the_reject_and_opens_a_frame(host: Host) -> None:
    args = {"pcap_path": str(REJECT), "display_filter": "ngap"}
    answer = host.client.call("pcap_sequence_diagram", args)["structuredContent"]
    view = host.show("pcap_sequence_diagram", args)
    arrows = view.locator("svg.ladder g.arrow")
    arrows.first.wait_for()
    expected = tshark_frames(REJECT, "ngap")
    assert numbers(view, "svg.ladder g.arrow") == expected == [m["frame"] for m in answer["messages"]]
    assert answer["diagram"].count("->>") + answer["diagram"].count("-x") == len(expected)
    assert view.locator("svg.ladder g.participant").count() == len(answer["participants"])
    failed = numbers(view, "svg.ladder g.arrow.failed")
    assert failed and failed == [f["frame"] for f in answer["failures"]]
    reject = view.locator(f"svg.ladder g.arrow[data-frame='{failed[0]}'] title")
    assert "REGISTRATION REJECT" in reject.text_content().upper()
    host.shot("ladder")

    view.locator(f"svg.ladder g.arrow[data-frame='{failed[0]}'] rect.hit").click()
    tree = view.locator(f"#detail section[data-frame='{failed[0]}']")
    tree.wait_for()
    assert "NG Application Protocol" in tree.inner_text()
    host.shot("ladder-detail")
    assert host.calls == ["pcap_frame_detail"]
    assert host.fetched() == []


def test_ladder_takes_two_thousand_messages(host: Host) -> None:
    args = {"pcap_path": str(SIP), "display_filter": "udp", "max_arrows": 1000}
    view = host.show("pcap_sequence_diagram", args)
    arrows = view.locator("svg.ladder g.arrow")
    arrows.first.wait_for()
    assert arrows.count() == 1000
    started = time.monotonic()
    view.locator("#more").click()  # the next 1000, appended
    view.locator("svg.ladder g.arrow >> nth=1999").wait_for()
    took = time.monotonic() - started
    assert numbers(view, "svg.ladder g.arrow") == tshark_frames(SIP, "udp")[:2000]
    view.locator("#zoom-out").click()
    view.locator("#zoom-out").click()
    scroller = view.locator("#scroller")
    scroller.evaluate("s => { s.scrollTop = s.scrollHeight; }")
    assert scroller.evaluate("s => s.scrollTop") > 0
    print(f"2000 messages: page fetched and drawn in {took:.2f} s")
    host.shot("ladder-2000")


# ---------------------------------------------------------------------------------------------
# Untrusted text stays text


def sip_with_markup(dst: Path) -> int:
    """Frames 23..34 of the SIP capture (classic pcap, Ethernet/IPv4/UDP) with frame 25's status line
    made `SIP/2.0 488 <img ...>`: lengths and the IPv4 checksum fixed, the UDP checksum left out (0).
    Returns the edited frame's number in the new file."""
    data = bytearray(SIP.read_bytes())
    endian = PCAP_MAGICS[bytes(data[:4])]
    out = bytearray(data[:24])
    for number, packet in enumerate(packets(data), start=1):
        if not 23 <= number <= 34:
            continue
        frame = bytearray(data[packet.offset:packet.offset + packet.caplen])
        if number == 25:
            ip = 14
            head = (frame[ip] & 0x0F) * 4
            udp = ip + head
            payload = bytes(frame[udp + 8:])
            first, rest = payload.split(b"\r\n", 1)
            assert first.startswith(b"SIP/2.0 100"), first
            payload = f"SIP/2.0 488 {XSS}".encode() + b"\r\n" + rest
            frame = frame[:udp + 8] + payload
            struct.pack_into(">H", frame, ip + 2, head + 8 + len(payload))
            struct.pack_into(">HH", frame, udp + 4, 8 + len(payload), 0)
            struct.pack_into(">H", frame, ip + 10, 0)
            total = sum(struct.unpack_from(f">{head // 2}H", frame, ip))
            while total > 0xFFFF:
                total = (total & 0xFFFF) + (total >> 16)
            struct.pack_into(">H", frame, ip + 10, ~total & 0xFFFF)
        seconds, micros = struct.unpack_from(endian + "II", data, packet.header)
        out += struct.pack(endian + "IIII", seconds, micros, len(frame), len(frame)) + frame
    dst.write_bytes(bytes(out))
    return 3


@pytest.fixture(scope="module")
def markup_capture(views_daemon: DaemonProcess) -> tuple[Path, int]:
    path = views_daemon.env.root / "sip_markup.pcap"
    frame = sip_with_markup(path)
    assert XSS in subprocess.run(["tshark", "-r", str(path), "-Y", f"frame.number == {frame}"],
                                 check=True, capture_output=True, text=True).stdout
    return path, frame


def no_script_ran(host: Host) -> None:
    assert host.frame().evaluate("() => window.__xss") is None
    assert host.page.evaluate("() => window.__xss") is None
    assert host.fetched() == []  # not even the <img src=x> was requested


def test_packet_list_shows_markup_as_text(host: Host, markup_capture: tuple[Path, int]) -> None:
    path, frame = markup_capture
    view = host.show("pcap_frames_by_filter", {"pcap_path": str(path), "display_filter": "sip"}, csp=None)
    row = view.locator(f"#rows tr[data-frame='{frame}']")
    row.wait_for()
    assert XSS in row.inner_text()
    assert view.locator("#rows img").count() == 0
    row.click()
    tree = view.locator(f"#detail section[data-frame='{frame}']")
    tree.wait_for()
    assert XSS in tree.inner_text()
    assert view.locator("#detail img").count() == 0
    host.shot("packet-list-xss")
    no_script_ran(host)


def test_ladder_shows_markup_as_text(host: Host, markup_capture: tuple[Path, int]) -> None:
    path, frame = markup_capture
    view = host.show("pcap_sequence_diagram", {"pcap_path": str(path), "display_filter": "sip"}, csp=None)
    arrow = view.locator(f"svg.ladder g.arrow[data-frame='{frame}']")
    arrow.wait_for()
    assert "img src=x onerror" in arrow.locator("text.comment").text_content()
    arrow.locator("rect.hit").click()
    tree = view.locator(f"#detail section[data-frame='{frame}']")
    tree.wait_for()
    assert XSS in tree.inner_text()
    assert view.locator("img").count() == 0
    host.shot("ladder-xss")
    no_script_ran(host)


# ---------------------------------------------------------------------------------------------
# The statistics graphs


def data(view: Any, selector: str, *keys: str) -> list[tuple[str, ...]]:
    """Each element's data-<key> attributes, in document order."""
    return [tuple(row) for row in view.locator(selector).evaluate_all(
        "(nodes, keys) => nodes.map(n => keys.map(k => n.dataset[k]))", list(keys))]


def test_stats_io_bars_are_tsharks_bins_and_the_kind_switcher_asks_again(host: Host) -> None:
    args = {"pcap_path": str(SIP), "kind": "io", "interval_ms": 1000, "limit": 5000}
    answer = host.client.call("pcap_stats", args)["structuredContent"]
    view = host.show("pcap_stats", args)
    bars = view.locator("svg.io rect.bar")
    bars.first.wait_for()
    # Wireshark's own bins, independently: tshark -q -z io,stat,1 (frames and bytes per second).
    theirs = oracle.io(oracle.tshark(SIP, "-q", "-z", "io,stat,1"))
    shown = [(int(f), int(b)) for f, b in data(view, "svg.io rect.bar", "frames", "bytes")]
    assert shown == [(r["frames"], r["bytes"]) for r in answer["rows"]] == [(f, b) for _, f, b in theirs]
    assert [float(v) for (v,) in data(view, "svg.io rect.bar", "value")] == [f for f, _ in shown]
    busiest = max(range(len(shown)), key=lambda i: shown[i][0])
    # Each bar's height is its count on one linear scale.
    heights = [float(h) for h in bars.evaluate_all("bars => bars.map(b => b.getAttribute('height'))")]
    top = shown[busiest][0]
    assert all(abs(h - heights[busiest] * f / top) < 1e-6 * heights[busiest]
               for h, (f, _) in zip(heights, shown, strict=True))
    assert view.locator("svg.io .axis text").count() > 4
    host.shot("stats-io")
    view.locator(f"svg.io rect.bar[data-interval='{busiest}']").hover()
    assert view.locator("svg.io text.readout").text_content() == (
        f"{busiest}–{busiest + 1} s: {shown[busiest][0]} frames, {shown[busiest][1]} bytes")

    view.locator("#metric").select_option("bytes")  # redrawn from the same rows: no call
    assert [float(v) for (v,) in data(view, "svg.io rect.bar", "value")] == [b for _, b in shown]

    view.locator("#protocol").fill("sip")  # response times, through the host
    view.locator("#kind").select_option("srt")
    view.locator("svg.srt g.srt").first.wait_for()
    srt = host.client.call("pcap_stats", {"pcap_path": str(SIP), "kind": "srt", "protocol": "sip",
                                          "limit": 5000})["structuredContent"]
    assert srt["rows"]
    assert [(p, int(c), *(float(v) if v else None for v in rest))
            for p, c, *rest in data(view, "svg.srt g.srt", "procedure", "count", "min", "avg", "max")] == [
        (r["procedure"], r["count"], *(r.get(k) for k in ("min_s", "avg_s", "max_s"))) for r in srt["rows"]]
    head = view.locator("#head th").all_inner_texts()
    cells = [dict(zip(head, row, strict=True)) for row in view.locator("#rows tr").evaluate_all(
        "rows => rows.map(r => [...r.cells].map(c => c.textContent))")]
    assert [(c["procedure"], c["count"]) for c in cells] == [(r["procedure"], str(r["count"])) for r in srt["rows"]]
    paired = next(r for r in srt["rows"] if r["count"])
    title = view.locator(f"svg.srt g.srt[data-procedure='{paired['procedure']}'] > title").text_content()
    assert title.startswith(f"{paired['procedure']}: {paired['count']} paired, min ")
    host.shot("stats-srt")

    view.locator("#protocol").fill("udp")  # any other kind: a table
    view.locator("#kind").select_option("conversations")
    udp = host.client.call("pcap_stats", {"pcap_path": str(SIP), "kind": "conversations", "protocol": "udp",
                                          "limit": 5000})["structuredContent"]
    view.locator("#summary").filter(has_text="conversations of udp").wait_for()
    assert view.locator("#rows tr").count() == udp["total"] and view.locator("svg").count() == 0
    host.shot("stats-conversations")
    assert host.calls == ["pcap_stats"] * 2
    assert host.fetched() == []


def test_stats_load_more_appends_the_next_page(host: Host) -> None:
    args = {"pcap_path": str(SIP), "kind": "io", "interval_ms": 1000, "limit": 40}
    view = host.show("pcap_stats", args)
    view.locator("svg.io rect.bar").first.wait_for()
    assert view.locator("svg.io rect.bar").count() == 40
    view.locator("#more").click()
    view.locator("svg.io rect.bar >> nth=79").wait_for()
    everything = host.client.call("pcap_stats", {**args, "limit": 5000})["structuredContent"]["rows"]
    assert [int(f) for (f,) in data(view, "svg.io rect.bar", "frames")] == [r["frames"] for r in everything[:80]]
    assert host.calls == ["pcap_stats"]


def test_stats_shows_markup_as_text(host: Host, markup_capture: tuple[Path, int]) -> None:
    path, _ = markup_capture
    hostile = f'frame contains "{XSS}" && udp.port == 9'  # matches nothing: the reason quotes it
    view = host.show("pcap_stats", {"pcap_path": str(path), "kind": "io", "display_filter": hostile}, csp=None)
    status = view.locator("#status")
    status.filter(has_text="no frame matches").wait_for()
    assert XSS in status.inner_text()
    view.locator("#protocol").fill(XSS)  # an unknown protocol: the daemon's error names it
    view.locator("#kind").select_option("srt")
    view.locator("#status.error").wait_for()
    assert XSS in view.locator("#status").inner_text()
    assert view.locator("img").count() == 0
    host.shot("stats-xss")
    no_script_ran(host)


# ---------------------------------------------------------------------------------------------
# The UE procedures (ngap_ue_sessions)


def frame_times(path: Path) -> dict[int, Decimal]:
    out = subprocess.run(["tshark", "-r", str(path), "-n", "-T", "fields", "-e", "frame.number", "-e",
                          "frame.time_epoch"], check=True, capture_output=True, text=True).stdout
    return {int(n): Decimal(t) for n, t in (line.split("\t") for line in out.splitlines())}


def test_ue_procedures_are_bars_of_their_durations_and_rejects_carry_their_rule(host: Host) -> None:
    args = {"pcap_path": str(REJECT), "view": "procedures"}
    answer = host.client.call("ngap_ue_sessions", args)["structuredContent"]
    view = host.show("ngap_ue_sessions", args)
    bars = view.locator("svg.procedures g.proc")
    bars.first.wait_for()
    procedures = [p for u in answer["ues"] for p in u["procedures"]]
    shown = data(view, "svg.procedures g.proc", "ue", "outcome", "start", "duration", "firstFrame", "lastFrame")
    assert shown == [(p["ue"], p["outcome"], p["start"], str(p["duration_ms"]), str(p["first_frame"]),
                      str(p["last_frame"])) for p in procedures]
    assert view.locator("svg.procedures g.ue").count() == answer["ue_count"] == len(answer["ues"])
    # Independently: each bar starts at its first frame's time and lasts until its last frame's (tshark).
    times = frame_times(REJECT)
    for ue, _, start, duration, first, last in shown:
        began = datetime.fromisoformat(start.replace("Z", "+00:00"))
        assert Decimal(str(began.timestamp())).quantize(Decimal("1e-6")) == times[int(first)], (ue, start)
        assert abs(Decimal(duration) - (times[int(last)] - times[int(first)]) * 1000) < Decimal("0.001")
    # The bars' widths are their durations on one scale, and their left edges their starts.
    geometry = bars.locator("rect.bar").evaluate_all(
        "rs => rs.map(r => [+r.getAttribute('x'), +r.getAttribute('width')])")
    longest = max(range(len(shown)), key=lambda i: float(shown[i][3]))
    scale = geometry[longest][1] / float(shown[longest][3])
    assert all(abs(w - max(2, float(d) * scale)) < 1e-6 for (_, w), (*_, d, _f, _l) in zip(geometry, shown,
                                                                                          strict=True))
    # The rejects: exactly the frames tshark calls a REGISTRATION REJECT, each with its cause and rule.
    rejects = [p for p in procedures if p["outcome"] in ("reject", "failure")]
    assert [p["last_frame"] for p in rejects] == tshark_frames(REJECT, "nas_5gs.mm.message_type == 0x44")
    for p in rejects:
        bar = view.locator(f"svg.procedures g.proc.{p['outcome']}[data-last-frame='{p['last_frame']}']")
        assert p["rule"] in bar.locator("text.note").text_content()
        assert p["cause"]["name"] in bar.locator("text.note").text_content()
        assert p["rule"] in bar.locator("title").text_content()
    host.shot("ue-procedures")

    view.locator("#failed-only").check()  # only the failed ones, redrawn without a call
    assert data(view, "svg.procedures g.proc", "lastFrame") == [(str(p["last_frame"]),) for p in rejects]
    reject = rejects[0]["last_frame"]
    view.locator(f"svg.procedures g.proc[data-last-frame='{reject}'] rect.bar").click()
    tree = view.locator(f"#detail section[data-frame='{reject}']")
    tree.wait_for()
    assert "NG Application Protocol" in tree.inner_text()
    assert host.calls == ["pcap_frame_detail"]
    assert host.fetched() == []


def test_ue_procedures_of_a_contexts_answer_are_asked_for_through_the_host(host: Host) -> None:
    view = host.show("ngap_ue_sessions", {"pcap_path": str(REJECT)})  # view=contexts: no durations
    view.locator("svg.procedures g.proc").first.wait_for()
    answer = host.client.call("ngap_ue_sessions", {"pcap_path": str(REJECT), "view": "procedures"})
    assert data(view, "svg.procedures g.proc", "ue", "lastFrame") == [
        (p["ue"], str(p["last_frame"])) for u in answer["structuredContent"]["ues"] for p in u["procedures"]]
    assert host.calls == ["ngap_ue_sessions"]
    assert host.fetched() == []


def test_ue_procedures_page_on_through_the_host_to_every_ue(host: Host) -> None:
    """The tool pages its UE contexts: the view says how many it shows of how many, and `more` asks the
    next page through the host until every UE's bars are drawn, as one answer of them all draws them."""
    whole = host.client.call("ngap_ue_sessions", {"pcap_path": str(REJECT), "view": "procedures"})
    ues = whole["structuredContent"]["ues"]
    assert len(ues) > 1
    view = host.show("ngap_ue_sessions", {"pcap_path": str(REJECT), "view": "procedures", "limit": 1})
    view.locator("svg.procedures g.ue").first.wait_for()
    assert view.locator("#summary").text_content().startswith(f"1 of {len(ues)} UE contexts")
    for shown in range(2, len(ues) + 1):
        view.locator("#more").click()
        view.locator("svg.procedures g.ue").nth(shown - 1).wait_for()
    assert view.locator("#summary").text_content().startswith(f"{len(ues)} UE contexts")
    assert view.locator("#more").is_disabled()
    assert data(view, "svg.procedures g.proc", "ue", "lastFrame") == [
        (p["ue"], str(p["last_frame"])) for u in ues for p in u["procedures"]]
    assert host.calls == ["ngap_ue_sessions"] * (len(ues) - 1)
    assert host.fetched() == []


def test_ue_procedures_show_markup_as_text(host: Host) -> None:
    """No field of this reply is a packet's free text (names, ids, causes and rules are the daemon's own or
    Wireshark's value strings): the hostile text is put into a real reply's every string the view shows."""
    args = {"pcap_path": str(REJECT), "view": "procedures"}
    result = host.client.call("ngap_ue_sessions", args)
    for ue in result["structuredContent"]["ues"]:
        ue["ue"] = ue["gnb"] = XSS
        for p in ue["procedures"]:
            p["procedure"] = p["rule"] = XSS
            if p["cause"]:
                p["cause"]["name"] = XSS
    result["content"] = [{"type": "text", "text": json.dumps(result["structuredContent"])}]
    view = host.show("ngap_ue_sessions", args, csp=None, result=result)
    reject = view.locator("svg.procedures g.proc.reject")
    reject.wait_for()
    assert reject.locator("text.name").text_content() == XSS
    assert reject.locator("text.note").text_content().count(XSS) == 2  # its cause and its rule
    assert XSS in view.locator("svg.procedures g.ue text.ue-name").first.text_content()
    assert view.locator("img").count() == 0
    host.shot("ue-procedures-xss")
    no_script_ran(host)


# ---------------------------------------------------------------------------------------------
# The serial console

TTYS = itertools.count()


class FarEnd:
    """A real pseudo-terminal: the daemon opens its slave (by a link the daemon's allowed_ports names), the
    test writes and reads at its master, as the device on the other end of the line would."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.master, slave = os.openpty()
        self.link = daemon.env.root / f"tty{next(TTYS)}"
        self.link.unlink(missing_ok=True)
        self.link.symlink_to(os.ttyname(slave))
        os.close(slave)

    def say(self, text: str) -> None:
        os.write(self.master, text.encode())

    def heard(self, want: bytes) -> bytes:
        got = b""
        deadline = time.monotonic() + HANG_GUARD_S
        while want not in got and time.monotonic() < deadline:
            got += os.read(self.master, 4096)
        return got

    def close(self) -> None:
        os.close(self.master)
        self.link.unlink(missing_ok=True)


@pytest.fixture
def far_end(views_daemon: DaemonProcess, apps: DaemonClient) -> Iterator[FarEnd]:
    tty = FarEnd(views_daemon)
    opened = apps.call("configure_connection", {"port": str(tty.link), "baudrate": 115200})
    assert not opened.get("isError"), opened
    yield tty
    apps.call("configure_connection", {"port": str(tty.link), "action": "close"})
    tty.close()


def console_lines(view: Any) -> list[tuple[str, str]]:
    """(class of the line: tx, rx, rx urc or event; its text) per line of the console."""
    return [(c.removeprefix("line ").strip(), t) for c, t in view.locator("#console .line").evaluate_all(
        "lines => lines.map(l => [l.className, l.querySelector('.text').textContent])")]


def test_serial_console_shows_tx_and_rx_as_they_come_and_marks_urcs(host: Host, far_end: FarEnd) -> None:
    port = str(far_end.link)
    far_end.say("+CREG: 1\r\n")  # before any command: unsolicited
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:  # the daemon logs what it read: wait until the log has it
        records = host.client.call("get_log", {"port": port})["structuredContent"]["records"]
        if any(r.get("dir") == "rx" for r in records):
            break
        time.sleep(0.05)
    view = host.show("get_log", {"port": port})
    view.locator("#console .line.rx").first.wait_for()
    assert console_lines(view)[-1] == ("rx urc", "+CREG: 1")

    # A command and its answer: Tx, then Rx lines up to the final result code; then a URC again.
    sent = host.client.call("send_data", {"port": port, "payload": "AT+CSQ", "line_ending": "crlf",
                                          "wait_policy": "none"})
    assert not sent.get("isError"), sent
    assert b"AT+CSQ\r\n" in far_end.heard(b"AT+CSQ\r\n")  # what the line carried, at the far end
    view.locator("#console .line.tx").first.wait_for()
    far_end.say("+CSQ: 23,99\r\n\r\nOK\r\n")
    view.locator("#console .line.rx >> text=OK").wait_for()
    far_end.say("RI")
    far_end.say("NG\r\n")  # one line in two chunks
    view.locator("#console .line.urc >> text=RING").wait_for()
    shown = [line for line in console_lines(view) if not line[0].startswith("event")]
    assert shown == [("rx urc", "+CREG: 1"), ("tx", "AT+CSQ"), ("rx", "+CSQ: 23,99"), ("rx", "OK"),
                     ("rx urc", "RING")]
    # The lines are the bytes the far end and the daemon exchanged, as the daemon's own log has them.
    records = host.client.call("get_log", {"port": port, "limit": 1000})["structuredContent"]["records"]
    assert "".join(r["data"] for r in records if r["dir"] == "rx") == "+CREG: 1\r\n+CSQ: 23,99\r\n\r\nOK\r\nRING\r\n"
    assert "".join(r["data"] for r in records if r["dir"] == "tx") == "AT+CSQ\r\n"
    host.shot("serial-console")

    view.locator("#pause").click()  # paused: no more calls, no new line
    calls = len(host.calls)
    far_end.say("+CMTI: \"SM\",1\r\n")
    time.sleep(1.5)
    assert len(host.calls) == calls and "CMTI" not in view.locator("#console").inner_text()
    view.locator("#pause").click()
    view.locator("#console .line.urc >> text=CMTI").wait_for()
    assert set(host.calls) == {"get_log"} and len(host.calls) >= 3  # polled through the host
    assert host.fetched() == []


def test_serial_console_shows_markup_as_text(host: Host, far_end: FarEnd) -> None:
    port = str(far_end.link)
    view = host.show("get_log", {"port": port}, csp=None)
    view.locator("#summary").filter(has_text="live").wait_for()
    far_end.say(f"{XSS}\r\n")
    line = view.locator("#console .line.rx").first
    line.wait_for()
    assert line.locator(".text").text_content() == XSS
    assert view.locator("img").count() == 0
    host.shot("serial-console-xss")
    no_script_ran(host)
