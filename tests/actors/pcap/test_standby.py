"""The warm tshark (standby.py): its page is the cold early pass's page, line for line, on every corpus
capture and shape; what it cannot carry runs cold; its timers run on the Trio clock; nothing is left
behind (process, zombie, directory)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from diagd.actors._subprocess import Head, head
from diagd.actors.base import Request
from diagd.actors.pcap.settings import BUILTIN_PROFILES
from diagd.actors.pcap.shark import tshark as _cold
from diagd.actors.pcap.warm import first_page, standby
from diagd.protocol.errors import DiagdError
from tests.pcaps import PCAPS, corpus
from tests.support import pcap_oracle as oracle
from tests.support.procs import alive, children, zombies

LAB = BUILTIN_PROFILES["5gc-lab"]
LAB_SHAPE = (*(a for rule in LAB["decode_as"] for a in ("-d", rule)),
             *(a for k, v in sorted(LAB["preferences"].items()) for a in ("-o", f"{k}:{v}")))
TIMELINE_FIELDS = ["frame.number", "ip.src", "frame.time", "_ws.col.Info", "udp.srcport"]


def left_behind() -> set[tuple[int, str]]:
    """This process's children and zombies (the suite's other tests may have left some: a test compares
    what it finds after with what was there before)."""
    return {(p.pid, p.state) for p in children(os.getpid())} | {(p.pid, "Z") for p in zombies(os.getpid())}


def own_templates(argv: list[str]) -> list[standby.Template]:
    """The templates a capture starts at its open (backend.py): its early passes', then any field list's."""
    timeline = standby.any_fields_of(standby.template_of(first_page.timeline_argv(argv))[0])  # type: ignore[index]
    assert timeline is not None
    return [*(standby.template_of(early)[0] for early, _ in first_page.early_argvs(argv)),  # type: ignore[index]
            timeline[0]]


def every_capture() -> list[Path]:
    found = corpus()
    if not found:
        pytest.skip(f"no real captures in {PCAPS}")
    return found


async def warm(argv: list[str], limit: int | None, max_line: int, records: str | None = None) -> Head:
    """The run of a standby started for `argv`'s template (then stopped: nothing is left)."""
    found = standby.template_of(argv)
    assert found is not None, argv
    template, path, display_filter = found
    waiting = await standby.Standby.start(template)
    try:
        return await waiting.run(path, display_filter, limit, max_line, records)
    finally:
        await waiting.close()
        assert not waiting.directory.exists()


async def cold_head(argv: list[str], limit: int | None, max_line: int, records: str | None) -> Head:
    """The cold run's Head (the reference each warm run is held to), kept on disk by the capture's bytes,
    the tshark version and the whole call: a rerun compares the warm runs with what tshark printed then."""
    path = Path(argv[argv.index("-r") + 1])
    ran: list[Head] = []

    async def run() -> None:
        ran.append(await head(argv, limit, max_line=max_line, records=records))

    def compute() -> str:
        trio.from_thread.run(run)
        return json.dumps(dataclasses.asdict(ran[0]))

    key = [*argv, f"limit={limit}", f"max_line={max_line}", f"records={records}"]
    text = await trio.to_thread.run_sync(oracle.cached_text, path, key, compute)
    return Head(**json.loads(text))


class Both:
    """A first_page RunHead that runs the argv warm and cold and keeps both (it answers with the cold one)."""

    def __init__(self) -> None:
        self.runs: list[tuple[list[str], Head, Head]] = []

    async def __call__(self, argv: list[str], limit: int | None, *, max_line: int = 1 << 20,
                       records: str | None = None) -> Head:
        cold = await cold_head(argv, limit, max_line, records)
        self.runs.append((argv, await warm(argv, limit, max_line, records), cold))
        return cold

    def compare(self) -> int:
        lines = 0
        for argv, warm_run, cold in self.runs:
            assert warm_run.lines == cold.lines and warm_run.text == cold.text, argv
            assert warm_run.stopped == cold.stopped, argv  # stopped at the limit: its exit status is the stop's
            assert warm_run.stopped or warm_run.returncode == cold.returncode, argv
            lines += len(cold.lines) + cold.text.count("\n") + bool(cold.text)
        return lines


async def early_pass(kind: str, argv: list[str], display_filter: str, run: Both) -> None:
    if kind == "rows":
        await first_page.early_rows(argv, display_filter, 200, run=run)
    elif kind == "numbers":
        await first_page.early_numbers(argv, display_filter, 200, run=run)
    elif kind == "text":  # a fresh capture's text search (text._search_while_loading's)
        await first_page.early_text(argv, display_filter, 20, run=run)
    else:  # a fresh capture's timeline (answers.timeline_while_loading's argv)
        fields = _cold.fields_argv(first_page.single_pass(argv), display_filter, TIMELINE_FIELDS)
        await first_page.early_fields(fields, display_filter, 200, run=run)


@pytest.mark.parametrize(("kind", "shape"), [("rows", ()), ("rows", LAB_SHAPE), ("numbers", ()), ("fields", ()),
                                             ("text", ())],
                         ids=["rows", "rows-5gc-lab", "numbers", "timeline-fields", "text"])
async def test_a_standby_run_is_the_cold_run_line_for_line_on_every_corpus_capture(
        kind: str, shape: tuple[str, ...]) -> None:
    before = left_behind()
    run = Both()
    for path in every_capture():
        await early_pass(kind, [*_cold.base_argv(path, (), ()), *shape], "frame.len > 0", run)
    assert len(run.runs) == len(every_capture()) and run.compare() > 1000
    assert left_behind() <= before


async def warm_and_cold(path: Path, display_filter: str, limit: int) -> tuple[Head, Head]:
    run = Both()
    try:
        await first_page.early_rows(_cold.base_argv(path, (), ()), display_filter, limit, run=run)
    except DiagdError:
        pass  # a refused filter: both runs are kept
    [(_, warm_run, cold)] = run.runs
    return warm_run, cold


@pytest.mark.parametrize("display_filter", [
    'sip.Method == "INVITE"', r'frame contains "\x22" || sip.Method == "BYE"', r'sip matches "^\\S+ sip:"',
    'sip.Method in {"INVITE", "ACK"} && !(udp.port == 5060)', "tcp.flags.syn == 1 and tcp.flags.ack == 0",
])
async def test_quotes_backslashes_and_set_syntax_reach_the_compiler_unchanged(display_filter: str) -> None:
    path = PCAPS / "heplify_sip_ipv4_tcp.pcap"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    assert standby.can_serve(display_filter)
    warm_run, cold = await warm_and_cold(path, display_filter, 50)
    assert warm_run.lines == cold.lines and len(cold.lines) > 0 and warm_run.returncode == cold.returncode


def test_what_a_macro_would_not_carry_unchanged_runs_cold() -> None:
    for refused in ("", "frame contains \"caf\u00e9\"", 'frame contains "a\nb"', "frame contains \"\t\"",
                    "${other}", 'frame contains "$1"'):
        assert not standby.can_serve(refused), refused
    assert standby.uat_string('a\\b"c') == '"a\\x5cb\\x22c"'
    # A template is the argv less its one file and one filter; anything else stays cold.
    found = standby.template_of(["tshark", "-r", "/x.pcap", "-n", "-Y", "ip", "-T", "tabs"])
    assert found is not None and found[1:] == ("/x.pcap", "ip")
    assert found[0].shown() == "tshark -r <capture> -n -Y <filter> -T tabs"
    other = standby.template_of(["tshark", "-r", "/y.pcap", "-n", "-Y", "udp", "-T", "tabs"])
    assert other is not None and other[0] == found[0] and other[0].key == found[0].key
    for refused in (["tshark", "-r", "/x.pcap", "-T", "tabs"], ["tshark", "-r", "/x", "-Y", "ip", "-Y", "udp"],
                    ["tshark", "-X", "lua_script:x", "-r", "/x", "-Y", "ip"], ["capinfos", "-r", "/x", "-Y", "ip"],
                    ["tshark", "-r", "/x", "-Y", "frame contains \"$1\""], ["tshark", "-r", "/x", "-Y"]):
        assert standby.template_of(refused) is None, refused


async def test_a_filter_tshark_refuses_gives_no_page_and_leaves_nothing(tmp_path: Path) -> None:
    path = PCAPS / "5greplay_oai.pcap"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    before = left_behind()
    warm_run, cold = await warm_and_cold(path, "ngap ==", 10)
    assert warm_run.lines == [] and warm_run.returncode not in (0, None) and cold.returncode not in (0, None)
    assert left_behind() <= before


# -- the actor, with a scripted standby on the Trio clock -------------------------------------------


class FakeProc:
    def __init__(self) -> None:
        self.ended = trio.Event()
        self.pid: int | None = None  # no process: diagd status lists none

    async def wait(self) -> int:
        await self.ended.wait()
        return 1


class FakeStandby:
    def __init__(self, log: list[tuple[str, float]]) -> None:
        self.proc = FakeProc()
        self.log = log
        log.append(("launch", trio.current_time()))

    @property
    def alive(self) -> bool:
        return not self.proc.ended.is_set()

    async def run(self, path: str, display_filter: str, limit: int | None, max_line: int,
                  records: str | None = None, fields: tuple[str, ...] = ()) -> Head:
        return Head([f"{path} {display_filter} {limit}"], True, None, "")

    async def close(self) -> None:
        self.proc.ended.set()


TEMPLATE = standby.Template(("tshark", "-r", standby.FILE, "-Y", standby.FILTER, "-T", "tabs"))


def page(actor: standby.StandbyActor) -> Any:
    return actor.handle(Request(standby.StandbyRun("/c.pcap", "ip", 11, 1 << 16)))


class Scripted:
    """A StandbyActor whose standbys are FakeStandby: when each was launched, on the Trio clock."""

    def __init__(self) -> None:
        self.log: list[tuple[str, float]] = []
        self.launched: list[FakeStandby] = []
        self.actor = standby.StandbyActor(TEMPLATE, launch=self.launch)

    async def launch(self, template: standby.Template) -> Any:
        self.launched.append(FakeStandby(self.log))
        return self.launched[-1]


async def test_the_next_standby_starts_after_the_page_not_during_it(
        autojump_clock: trio.testing.MockClock) -> None:
    scripted = Scripted()
    actor, log = scripted.actor, scripted.log
    async with trio.open_nursery() as nursery:
        await actor.start(nursery)
        await trio.sleep(0.01)
        assert [at for _, at in log] == [0.0]
        assert await page(actor) == {"served": True, "lines": ["/c.pcap ip 11"], "stopped": True,
                                     "returncode": None, "stderr": "", "text": ""}
        assert await page(actor) == {"served": False}  # the next one is not started yet: cold
        await trio.sleep(standby.REPLACE_AFTER_S - 0.001)
        assert len(log) == 1
        await trio.sleep(0.002)
        assert len(log) == 2 and log[1][1] == pytest.approx(0.01 + standby.REPLACE_AFTER_S)
        assert (await page(actor))["served"] is True
        assert actor.statistics() == {"argv": "tshark -r <capture> -Y <filter> -T tabs", "waiting": False,
                                      "served": 2, "missed": 1, "off_because": None, "workers": []}
        nursery.cancel_scope.cancel()
    await actor.stop()


TEXT_TEMPLATE = standby.Template(("tshark", "-r", standby.FILE, "-l", "-Y", standby.FILTER, "-V"))


async def test_a_text_template_keeps_two_waiting_so_the_next_page_is_warm_too(
        autojump_clock: trio.testing.MockClock) -> None:
    assert TEXT_TEMPLATE.depth == standby.TEXT_DEPTH == 2 and TEMPLATE.depth == 1
    scripted = Scripted()
    actor = scripted.actor = standby.StandbyActor(TEXT_TEMPLATE, launch=scripted.launch)
    log = scripted.log
    async with trio.open_nursery() as nursery:
        await actor.start(nursery)
        # The second starts a replacement's delay after the first: never two start-ups at once.
        await trio.sleep(standby.REPLACE_AFTER_S + 0.01)
        assert [at for _, at in log] == [0.0, pytest.approx(standby.REPLACE_AFTER_S)]
        assert len(actor._waiting) == 2
        # Two pages one right after the other: both warm, the older standby first.
        first, second = scripted.launched
        assert (await page(actor))["served"] is True and first.proc.ended.is_set() and not second.proc.ended.is_set()
        assert (await page(actor))["served"] is True and second.proc.ended.is_set()
        assert await page(actor) == {"served": False}  # a third before any replacement: cold
        now = trio.current_time()
        await trio.sleep(standby.TEXT_REPLACE_AFTER_S - 0.01)
        assert len(scripted.launched) == 2
        await trio.sleep(0.02)
        # Replaced sooner than other templates' standbys (its runs come in bursts).
        assert TEXT_TEMPLATE.replace_after_s == standby.TEXT_REPLACE_AFTER_S < standby.REPLACE_AFTER_S
        assert [at for _, at in log[2:]] == [pytest.approx(now + standby.TEXT_REPLACE_AFTER_S)] * 2
        assert len(actor._waiting) == 2 and actor.statistics()["waiting"] is True
        await trio.sleep(60)
        assert len(scripted.launched) == 4  # two waiting at most, however long it stays idle
        # The older one ends while waiting (killed) and is not reaped yet: the run takes the other.
        older, newer = actor._waiting
        older.proc.ended.set()
        assert (await page(actor))["served"] is True and newer.proc.ended.is_set()
        assert actor._waiting == [] and actor.missed == 1 and actor.failures == 0  # served: the count restarts
        nursery.cancel_scope.cancel()
    await actor.stop()
    assert all(s.proc.ended.is_set() for s in scripted.launched)


async def test_standbys_that_end_while_waiting_are_replaced_then_given_up(
        autojump_clock: trio.testing.MockClock) -> None:
    scripted = Scripted()
    actor, launched = scripted.actor, scripted.launched
    async with trio.open_nursery() as nursery:
        await actor.start(nursery)
        for _ in range(standby.MAX_FAILURES):
            await trio.sleep(0.01)
            launched[-1].proc.ended.set()  # a tshark without Lua: it ends at once
            await trio.sleep(standby.REPLACE_AFTER_S)
        assert len(launched) == standby.MAX_FAILURES
        assert actor.off_because is not None and "ended before their run" in actor.off_because
        await trio.sleep(60)
        assert len(launched) == standby.MAX_FAILURES and await page(actor) == {"served": False}
        nursery.cancel_scope.cancel()


async def test_a_real_standby_killed_while_waiting_is_reaped_and_replaced() -> None:
    actor = standby.StandbyActor(TEMPLATE)
    async with trio.open_nursery() as nursery:
        await actor.start(nursery)
        with trio.fail_after(30):
            while actor._standby is None:
                await trio.sleep(0.01)
            first = actor._standby
            os.killpg(first.proc.pid, signal.SIGKILL)
            while actor._standby is None or actor._standby is first:
                await trio.sleep(0.01)
        assert first.proc.returncode == -signal.SIGKILL and not first.directory.exists()
        [worker] = actor.statistics()["workers"]  # what `diagd status` lists: the waiting one, with its RSS
        assert worker["pid"] == actor._standby.proc.pid and worker["role"] == "tshark standby"
        assert actor.failures == 1 and not any(p.pid == first.proc.pid for p in zombies(os.getpid()))
        second = actor._standby
        nursery.cancel_scope.cancel()
    await actor.stop()
    assert second is not None and not alive(second.proc.pid) and not second.directory.exists()
    assert not any(p.pid in (first.proc.pid, second.proc.pid) for p in children(os.getpid()))


# -- which templates stay warm -----------------------------------------------------------------------


async def test_a_field_list_gives_way_before_a_capture_own_template(tmp_path: Path) -> None:
    """Over MAX_STANDBYS the least recently used template stops, a timeline's field list before any of
    the templates every capture runs (first_page.early_argvs): trying field lists never pushes the text
    template out (its next search would run cold)."""
    from tests.support.fake_runtime import fake_runtime

    argv = _cold.base_argv(Path("/c.pcap"), (), {})
    own = own_templates(argv)
    fields = [standby.template_of(_cold.fields_argv(argv, "frame", ["frame.number", name]))[0]  # type: ignore[index]
              for name in ("ip.src", "ip.dst", "udp.srcport")]
    assert len({t.key for t in own + fields}) == 7 and standby.MAX_STANDBYS == 5
    async with fake_runtime(tmp_path, "pcap") as rt:
        warm = standby.WarmTsharks(rt)  # type: ignore[arg-type]

        async def start(template: standby.Template, *, capture_own: bool = False) -> None:
            await warm.start(template, 600, after_s=3600, capture_own=capture_own)  # no tshark starts
            await trio.sleep(0.05)  # a stopped actor is gone

        def running() -> set[str]:
            return {t.key for t in own + fields if rt.find(standby.KIND, t.key) is not None}

        for template in own:
            await start(template, capture_own=True)
        await start(fields[0])
        assert running() == {t.key for t in (*own, fields[0])}
        await start(fields[1])  # the field list used before goes, not the least recent of the capture's
        assert running() == {t.key for t in (*own, fields[1])}
        await start(own[0], capture_own=True)  # marked as used: still one of the capture's
        await start(fields[2])
        assert running() == {t.key for t in (*own, fields[2])}


async def test_own_templates_stay_own_and_ended_ones_take_no_place(tmp_path: Path) -> None:
    """A capture's own template pushed out by another capture's (another decoding) is still one of
    the capture's when a run restarts it; a field list started when every other template is a
    capture's own evicts one of them, never itself; a template whose actor ended (idle timeout)
    takes no place."""
    from tests.support.fake_runtime import fake_runtime

    own_of = own_templates
    plain = _cold.base_argv(Path("/c.pcap"), (), {})
    lab = _cold.base_argv(Path("/c.pcap"), LAB["decode_as"], sorted(LAB["preferences"].items()))
    a, b = own_of(plain), own_of(lab)
    field = standby.template_of(_cold.fields_argv(plain, "frame", ["frame.number", "ip.src"]))[0]  # type: ignore[index]
    assert len({t.key for t in (*a, *b, field)}) == 9
    async with fake_runtime(tmp_path, "pcap") as rt:
        warm = standby.WarmTsharks(rt)  # type: ignore[arg-type]

        async def start(template: standby.Template, *, capture_own: bool = False) -> None:
            await warm.start(template, 600, after_s=3600, capture_own=capture_own)
            await trio.sleep(0.05)

        def running() -> set[str]:
            return {t.key for t in (*a, *b, field) if rt.find(standby.KIND, t.key) is not None}

        for template in a + b:  # the lab capture's four push three of the plain capture's out
            await start(template, capture_own=True)
        assert running() == {a[3].key, *(t.key for t in b)}
        await start(a[1])  # a run restarts the plain capture's text template: still its own
        await start(field)  # every other one is own: one of them goes, the field list runs
        assert field.key in running() and len(running()) == standby.MAX_STANDBYS
        await start(b[0])  # the field list goes first, not the text template a run restarted
        assert a[1].key in running() and field.key not in running()

        for template in list(a + b):  # every actor ends (as an idle timeout stops them)
            ref = rt.find(standby.KIND, template.key)
            if ref is not None:
                rt.stop(ref, "idle")
        await trio.sleep(0.05)
        assert running() == set()
        for template in (field, *a):  # four places free again: nothing is stopped
            await start(template, capture_own=template is not field)
        assert running() == {field.key, *(t.key for t in a)}
