"""Containment with the command filter switched off: the whole escape corpus typed at a real crash, and
hostile code run in a real drgn worker, each under the very policy the session actor builds
(`sandbox.confine`), with and without Landlock. The filter (`text.classify`) is not in this path at all:
what holds here is what the kernel enforces (namespaces, the uid, seccomp, the scratch bound).

Done when: nothing is written, read or run outside the tool's own scratch; neither tool runs as root in
the host's namespaces; a 1.5 GiB write stops at the scratch bound; crash reads `\\gdb` as `gdb` (the
command check's tokenizer is crash's own, checked against crash itself).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from diagd.actors import sandbox
from diagd.actors.crash.drgn import DrgnClient
from diagd.actors.crash.pty import CrashDriver, MemorySink
from diagd.actors.sandbox import kernel, namespaces
from tests.actors.crash.test_escapes import ESCAPES
from tests.fixtures.vmcore import VmcoreFixture, build

pytestmark = [
    pytest.mark.skipif(shutil.which("crash") is None, reason="needs crash"),
    pytest.mark.skipif(not kernel.seccomp_available(), reason="needs seccomp"),
    pytest.mark.skipif(not namespaces.probe()[0], reason="needs bubblewrap"),
]
LANDLOCK = [
    pytest.param(True, id="landlock", marks=pytest.mark.skipif(kernel.landlock_abi() < 1, reason="no Landlock")),
    pytest.param(False, id="no-landlock"),
]
SCRATCH_BYTES = 64 * 1024 * 1024
NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts")

# The C of a crash extension (`extend`): native code in crash's own process, which no command check can
# read. Its constructor tries what the attack round did: files outside, a program, and says who it is.
EVIL_SO = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static const char *targets[] = { TARGETS, 0 };
__attribute__((constructor)) static void evil(void) {
    for (int i = 0; targets[i]; i++) {
        int fd = open(targets[i], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) { write(fd, "escaped\n", 8); close(fd); }
        printf("EVIL open %s -> %d\n", targets[i], fd);
    }
    printf("EVIL ids %d %d\n", (int)getuid(), (int)geteuid());
    printf("EVIL system -> %d\n", system("id > /tmp/evil-id"));
    fflush(stdout);
}
"""


@dataclass
class World:
    """Host paths a contained tool must not reach: the canaries it tries to write, the secret it tries to
    read, and where its session lives."""

    fixture: VmcoreFixture
    workdir: Path
    allowed: Path  # readable by the tool (allowed_dirs): where the extension lies
    canaries: list[Path]
    secret: Path

    def untouched(self) -> None:
        written = [p for p in self.canaries if p.exists()]
        assert not written, f"written outside the sandbox: {written}"
        assert sorted(p.name for p in self.workdir.iterdir()) == [], "the session directory was written"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    fixture = build()
    workdir = tmp_path / "session"
    workdir.mkdir()
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    tag = uuid.uuid4().hex[:8]
    canaries = [tmp_path / "outside.txt", Path(f"/var/tmp/diagd-canary-{tag}"), allowed / "written.txt",
                Path(f"/etc/diagd-canary-{tag}") if os.geteuid() == 0 else tmp_path / "etc-canary",
                fixture.dir / f"canary-{tag}"]
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2-secret\n")
    secret.chmod(0o600)
    yield World(fixture, workdir, allowed, canaries, secret)
    for path in canaries:
        path.unlink(missing_ok=True)


def confined(policy: sandbox.Policy) -> sandbox.Policy:
    """The policy the session actor runs under (`CrashSession._jail`)."""
    return sandbox.confine("test", policy, namespaces.Namespaces(), allowed_unconfined=False, setting="-",
                           scratch_bytes=SCRATCH_BYTES)


def assert_not_root_in_host_namespaces(pid: int) -> None:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    uids = {int(u) for u in status["Uid"].split()}
    assert 0 not in uids, status["Uid"]
    if os.geteuid() == 0:
        assert uids == {namespaces.sandbox_ids()[0]}
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
    for ns in NAMESPACES:
        assert os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns


def build_extension(world: World) -> Path:
    targets = ", ".join(f'"{p}"' for p in [*world.canaries, world.workdir / "cmd-evil"])
    source = world.allowed / "evil.c"
    source.write_text(EVIL_SO.replace("TARGETS", targets))
    so = world.allowed / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(source)], check=True, capture_output=True)
    return so


def escape_corpus(world: World, so: Path) -> list[str]:
    """Every form from both attack rounds, plain and with crash's leading backslash, aimed at the host."""
    out = [str(p) for p in world.canaries]
    forms = [
        # programs: crash's popen, gdb's shell, pipes; aliases that reach gdb
        "!id", "gdb shell id", "gdb she id", "she id", "gdb eval \"shell id\"", "gdb with confirm off -- shell id",
        "gdb interpreter-exec console \"shell id\"", "p 1 | id", "gdb pipe p 1 | id", "gdb | p 1 | id",
        "alias zz gdb", "zz she id", "gdb python import os; os.system('id')", "gdb guile 1", "gdb make",
        # files written: redirections, gdb's dump/append/logging/gcore, crash's set error
        f"log > {out[0]}", f"ps >> {out[1]}", f"gdb dump binary value {out[2]} \"escaped\"",
        f"gdb append value {out[3]} 1", f"gdb set logging file {out[4]}", "gdb set logging on", "sys",
        "gdb set logging off", f"gdb gcore {out[1]}", f"set error {out[0]}", "p 2", "set error default",
        f"gdb dump binary value {world.workdir / 'cmd-evil'} \"escaped\"",
        # files read: input files, gdb's source, crash's redirection from a file
        f"gdb source {world.secret}", f"< {world.secret}", f"ps -p < {world.secret}", "gdb source /etc/shadow",
        # native code: crash's extension loader (allow_extend off does not exist without the filter)
        f"extend {so}",
    ]
    backslashed = [f"\\{f}" for f in forms if not f.startswith(("!", "<"))]
    return forms + backslashed + [c for c in ESCAPES if c not in forms and not stalls(c)]


# Forms that only stall this crash (they wait for more input, run forever, or page every later output
# through `less`, which cannot start): a denial of service to the session itself, not an escape. The
# command check refuses them; they are left out here so one crash can take the rest of the corpus.
_STALL_WORDS = {"sn", "r", "pi", "def", "doc", "repeat"}
_STALL_GDB = {"pi", "python-interactive", "edit", "commands", "define", "define-prefix", "document", "while", "if",
              "tui", "new-ui", "r", "run"}


def stalls(command: str) -> bool:
    words = [w.strip("\"'") for w in command.strip().lstrip("\\").replace("\t", " ").split()]
    # `set scroll on` pages through less; `set gdb on` / `set silent on` change or drop the prompt.
    # crash's own `set` switches other than the file writers (error, console) change its prompt, paging,
    # editing mode or debug level, or end it: the session's own harm, covered by the command check.
    if not words or "interpreter-exec mi" in command or (words[0] == "set" and words[1:2] not in (["error"],
                                                                                                  ["console"])):
        return True
    first = words[0].strip("\"'")
    if first in _STALL_WORDS:
        return True
    return first in ("gdb", "g") and len(words) > 1 and words[1].strip("\"'") in _STALL_GDB


@pytest.mark.parametrize("landlock", LANDLOCK)
def test_crash_with_the_filter_off_reaches_nothing_outside_its_scratch(
        world: World, monkeypatch: pytest.MonkeyPatch, landlock: bool) -> None:
    if not landlock:
        monkeypatch.setenv(sandbox.FORCE_ENV, "off")
    so = build_extension(world)
    policy = confined(sandbox.crash_policy(vmcore=world.fixture.vmcore, vmlinux=world.fixture.vmlinux,
                                           workdir=world.workdir, allowed_dirs=[str(world.allowed)]))
    assert policy.namespaces and policy.landlock == landlock and policy.exec_once
    argv = sandbox.wrap(["crash", "-s", "--no_crashrc", str(world.fixture.vmlinux), str(world.fixture.vmcore)],
                        policy)
    driver = CrashDriver.spawn(argv, cwd="/", env={"TERM": "dumb", "LC_ALL": "C", "PATH": "/usr/bin:/bin",
                                                   "DIAGD_TEST_SECRET": "hunter2"})
    abort = threading.Event()
    transcript: list[tuple[str, str]] = []
    try:
        driver.wait_ready(180, abort)

        def run(command: str) -> str:
            sink = MemorySink(1 << 20)
            print("RUN", repr(command), flush=True)
            driver.run(command, timeout_s=30, abort=abort, sink=sink)
            transcript.append((command, sink.text()))
            return sink.text()

        run("set scroll off")
        crash_pid = namespaces.tool_pid(driver.pid)
        assert crash_pid is not None and Path(f"/proc/{crash_pid}/comm").read_text().strip() == "crash"
        assert_not_root_in_host_namespaces(crash_pid)
        # The command check reads a command as crash does: crash takes one backslash off the first word.
        assert run("\\gdb p 6*7").strip().endswith("= 42") and run("gdb p 6*7").strip().endswith("= 42")
        assert "6*7" not in run("\\g p 6*7")  # `\g` is not alias-expanded: gdb is not reached as `g p`
        environment = run("gdb show environment")
        assert "HOME=/nonexistent" in environment and "hunter2" not in environment
        for command in escape_corpus(world, so):
            out = run(command)
            assert "uid=" not in out and "hunter2" not in out, (command, out)
            if "extend" in command:  # native code ran in crash: as the sandbox uid, every open refused
                assert "EVIL open" in out and all(line.endswith("-> -1") for line in out.splitlines()
                                                  if line.startswith("EVIL open")), out
                if os.geteuid() == 0:
                    uid = namespaces.sandbox_ids()[0]
                    assert f"EVIL ids {uid} {uid}" in out and "EVIL system -> 0" not in out, out
        # Writes inside the scratch work and stay there (crash's tmpfile()s need it).
        run("gdb dump binary value /tmp/inside \"kept\"")
        assert "bt" in run("help")  # crash still answers after the whole corpus
        assert namespaces.tool_pid(driver.pid) == crash_pid  # the same crash: nothing ended it
    finally:
        driver.request_quit()
        driver.close()
    world.untouched()


@pytest.mark.parametrize("landlock", LANDLOCK)
async def test_drgn_code_reaches_nothing_outside_its_scratch_and_its_disk_is_bounded(
        world: World, monkeypatch: pytest.MonkeyPatch, landlock: bool) -> None:
    if not landlock:
        monkeypatch.setenv(sandbox.FORCE_ENV, "off")
    policy = confined(sandbox.drgn_policy(vmcore=world.fixture.vmcore, vmlinux=world.fixture.vmlinux,
                                          workdir=world.workdir, allowed_dirs=[str(world.allowed)]))
    assert policy.namespaces and policy.landlock == landlock
    async with trio.open_nursery() as nursery:
        client = await DrgnClient.spawn(nursery, cwd=world.workdir, policy=policy)
        outputs = iter(range(1, 1000))

        async def run(code: str) -> str:
            result = await client.execute(code, filename="<t>", timeout_s=60, grace_s=5, max_output_bytes=1 << 20,
                                          output_path=str(world.allowed / f"out{next(outputs)}"))
            return (result.head or "") + (result.error or "")

        with trio.fail_after(120):
            await client.greet()
            await client.load(str(world.fixture.vmcore), [str(world.fixture.vmlinux)])
            tool = namespaces.tool_pid(client.pid)
            assert tool is not None
            assert_not_root_in_host_namespaces(tool)
            for target in [*world.canaries, world.workdir / "cmd-evil"]:
                out = await run(f"open({str(target)!r}, 'w').write('escaped')")
                assert "Error" in out, out
            assert "hunter2" not in await run(f"print(open({str(world.secret)!r}).read())")
            assert "uid=" not in await run("import os\nprint(os.system('id'))")
            assert "uid=" not in await run("import subprocess\nprint(subprocess.run(['id']))")
            # 1.5 GiB from drgn code stops at the scratch bound (ENOSPC), not on the host's disk.
            big = await run("f = open('big', 'wb')\nchunk = b'x' * (1 << 20)\n"
                            "try:\n    for _ in range(1536):\n        f.write(chunk)\n    f.flush()\n"
                            "except OSError as exc:\n    print('stopped', exc.errno)\n"
                            f"import os\nprint(os.path.getsize('big') <= {SCRATCH_BYTES})")
            assert "stopped 28" in big and big.strip().endswith("True"), big
            own = await run("print(prog['init_task'].comm.string_().decode())")
            assert own.strip() == "swapper/0"  # the worker still works after all of it
            await client.close()
    world.untouched()
