"""Soak: hours of mixed load on one daemon; does it stay flat, and is every call accounted for (issue 28)?

Run from the repository root, as root (bpftrace needs it):

    .venv/bin/python bench/soak.py [--minutes 120] [--clients 6] [--rate 4] [--sample-s 30]
                                   [--warmup-min 10] [--idle-s 300] [--restart-at 0.5] [--tracemalloc N]
                                   [--json-out FILE]

It starts an isolated daemon (bench/_daemon.py), two simulated modems (tests/support/sim_modem.py on
real ptys) and --clients MCP SDK clients, each through its own `diagd mcp --no-autostart` shim. Together
they send about --rate calls/s, mixed: pcap (info, filters, timelines, frame details, text search) on
six real captures of the test corpus, send_data on the modems (the first two clients own one each:
a port belongs to the client that opened it), bpftrace programs (exec_program + get_result), crash
and drgn commands on the vmcore fixture (/var/tmp/diagd-fixtures), diagd_status and diagd_calls.
At --restart-at of the run the daemon gets SIGTERM and is started again in the same directories;
the shims carry the sessions over (in-flight calls answer DAEMON_RESTARTED).

Every --sample-s it records the daemon's RSS (VmRSS of `diagd serve`, children not counted), open
fds, threads and children (zombies counted). After the load it waits --idle-s with the clients gone
and records the idle RSS. The result:

- RSS slope after warm-up (MB/hour, least squares over the samples taken --warmup-min or more after
  the daemon's (re)start; one slope per daemon run, and a pooled one with a common slope);
- idle RSS after the run, next to the post-warm-up level (the fit's value at the end of warm-up in
  the last daemon run);
- the audit log checked line by line: every record valid JSON, every final record with its started
  one, and the multiset of (tool, arguments) of the final records equal to what the clients sent
  and the daemon answered (each exactly once; a call answered DAEMON_RESTARTED may be in it once or not);
- answers by outcome and error code (TIMEOUT, INTERNAL_ERROR, CANCELLED, BUSY, ...) and client exceptions.

--tracemalloc N starts the daemon with DIAGD_TRACEMALLOC=N and saves `diagd status --memory` from
the end of warm-up on, every --memory-s, into the JSON (it slows the daemon and doubles the Python
heap: RSS figures of such a run are not the daemon's). A JSON result goes to --json-out (default
/tmp/diagd-soak-<time>.json), a summary to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import trio
from _daemon import DIAGD, BenchDaemon, _wait_for_sockets, isolated_daemon
from _proc import children, vmcore_fixture
from mcp import Client
from mcp.client.stdio import StdioServerParameters

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.pcaps import PCAPS  # noqa: E402  (the test corpus' cache, as the tests read it)

PCAP_DIR = PCAPS
CAPTURES = ("magma_gx_gy_combined_04.pcapng", "heplify_fax_call_t38_sip.pcap", "adrian_n4_upf_timeout_sbi.pcap",
            "5greplay_oai.pcap", "adrian_sandbox_sbi.pcap", "magma_gx_gy_combined_03.pcapng")
FILTERS = ("", "ip", "udp", "tcp", "sctp", "frame.len > 200", "http2", "diameter", "sip", "ip.ttl < 64")
WORDS = ("Session", "INVITE", "nnrf", "OK", "zzz-not-there", "200")
CRASH_COMMANDS = ("sys", "ps", "kmem -i", "bt", "mod", "log")
DRGN_CODE = ("prog['init_task'].pid", "prog['jiffies'].value_()", "prog['init_task'].comm.string_()",
             "len(list(__import__('drgn.helpers.linux.pid', fromlist=['x']).for_each_task(prog)))")
MODEM_COMMANDS = ("AT", "ATI", "AT+CSQ")
CALL_TIMEOUT_S = 300
RESTARTED = "DAEMON_RESTARTED"
START_TIMEOUT_S = 180


# --------------------------------------------------------------------------- /proc probes


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            out[key] = int(value.split()[0])
    return out



def sample(pid: int, t0: float, era: int, calls: int) -> dict[str, Any]:
    status = proc_status(pid)
    kids = children(pid)
    return {"t_s": round(time.monotonic() - t0, 1), "era": era, "rss_mb": round(status["VmRSS"] / 1024, 2),
            "threads": status["Threads"], "fds": len(os.listdir(f"/proc/{pid}/fd")), "children": len(kids),
            "zombies": sum(k[1] == "Z" for k in kids), "child_names": sorted(k[2] for k in kids), "calls": calls}


# --------------------------------------------------------------------------- fits


def slope_mb_per_h(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MB) points, in MB per hour."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return None if sxx == 0 else sum((x - mx) * (y - my) for x, y in points) / sxx * 3600


def pooled_slope(groups: list[list[tuple[float, float]]]) -> float | None:
    """One slope for several runs, each with its own intercept (least squares on within-run deviations)."""
    sxy = sxx = 0.0
    for pts in groups:
        if len(pts) < 3:
            continue
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        sxy += sum((x - mx) * (y - my) for x, y in pts)
        sxx += sum((x - mx) ** 2 for x, _ in pts)
    return None if sxx == 0 else sxy / sxx * 3600


# --------------------------------------------------------------------------- load


class Load:
    def __init__(self, args: argparse.Namespace, ports: list[str], vmcore: Path, vmlinux: Path) -> None:
        self.args = args
        self.ports = ports
        self.vmcore, self.vmlinux = vmcore, vmlinux
        self.sent: list[dict[str, Any]] = []  # every call: tool, arguments, outcome, code
        self.outcomes: Counter[str] = Counter()
        self.exceptions: list[str] = []
        self.error_examples: dict[str, str] = {}  # "tool CODE" -> the first such error's message
        self.vmcore_sid: str | None = None
        self.vmcore_lock = trio.Lock()

    async def call(self, client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any] | None:
        entry: dict[str, Any] = {"tool": tool, "arguments": args}
        self.sent.append(entry)
        try:
            with trio.fail_after(CALL_TIMEOUT_S):
                result = await client.call_tool(tool, args)
        except Exception as exc:
            if RESTARTED in str(exc):  # the shim's JSON-RPC error for a call in flight across the restart
                entry["outcome"], entry["code"] = "error", RESTARTED
                self.outcomes[RESTARTED] += 1
                return None
            entry["outcome"] = "exception"
            self.exceptions.append(f"{tool}: {type(exc).__name__}: {exc}"[:300])
            self.outcomes["client exception"] += 1
            return None
        payload: dict[str, Any] = json.loads(result.content[0].text) if result.content else {}
        if result.is_error:
            entry["outcome"], entry["code"] = "error", payload.get("code", "?")
            self.outcomes[entry["code"]] += 1
            self.error_examples.setdefault(f"{tool} {entry['code']}", str(payload.get("message"))[:300])
            return None
        entry["outcome"] = "ok"
        self.outcomes["ok"] += 1
        return payload

    async def session_id(self, client: Client) -> str | None:
        async with self.vmcore_lock:
            if self.vmcore_sid is None:
                opened = await self.call(client, "open_vmcore_session",
                                         {"vmcore_path": str(self.vmcore), "vmlinux_path": str(self.vmlinux)})
                self.vmcore_sid = opened["session_id"] if opened else None
            return self.vmcore_sid

    async def crash_or_drgn(self, client: Client, rng: random.Random) -> None:
        sid = await self.session_id(client)
        if sid is None:
            return
        if rng.random() < 0.55:
            args: dict[str, Any] = {"command": rng.choice(CRASH_COMMANDS), "session_id": sid}
            if rng.random() < 0.3:
                args["force_execute"] = True
            tool = "run_crash_command"
        else:
            tool, args = "run_drgn_command", {"code": rng.choice(DRGN_CODE), "session_id": sid}
        before = len(self.sent)
        await self.call(client, tool, args)
        if self.sent[before].get("code") in ("NOT_FOUND", "SESSION_NOT_FOUND", "INVALID_ARGUMENT"):
            self.vmcore_sid = None  # the session did not outlive a restart: open another next time

    async def pcap(self, client: Client, rng: random.Random) -> None:
        cap = str(PCAP_DIR / rng.choice(CAPTURES))
        kind = rng.random()
        if kind < 0.15:
            await self.call(client, "pcap_info", {"pcap_path": cap})
        elif kind < 0.55:
            await self.call(client, "pcap_frames_by_filter", {"pcap_path": cap, "display_filter": rng.choice(FILTERS),
                                                              "limit": rng.choice((20, 100, 500))})
        elif kind < 0.7:
            await self.call(client, "pcap_timeline", {"pcap_path": cap, "display_filter": rng.choice(FILTERS),
                                                      "fields": ["frame.number", "frame.time_relative", "ip.src"],
                                                      "limit": 200})
        elif kind < 0.9:
            first = rng.randint(1, 40)
            await self.call(client, "pcap_frame_detail", {"pcap_path": cap,
                                                          "frame_numbers": list(range(first, first + 3))})
        else:
            await self.call(client, "pcap_text_search", {"pcap_path": cap, "query": rng.choice(WORDS), "limit": 50})

    async def bpftrace(self, client: Client, rng: random.Random) -> None:
        program = f'BEGIN {{ printf("soak {rng.randint(0, 10**9)}\\n"); exit(); }}'
        started = await self.call(client, "exec_program", {"program": program, "timeout": 10})
        if started is None:
            return
        for _ in range(5):
            page = await self.call(client, "get_result", {"execution_id": started["execution_id"], "wait_s": 10,
                                                          "until": "done", "limit": 20})
            if page is None or page.get("status") != "running":
                return

    async def serial(self, client: Client, rng: random.Random, port: str) -> None:
        before = len(self.sent)
        await self.call(client, "send_data", {"port": port, "payload": rng.choice(MODEM_COMMANDS),
                                              "stop_pattern": "OK\r\n", "timeout_ms": 2000})
        if self.sent[before].get("code") == "INVALID_ARGUMENT":  # not open (at the start, after the restart)
            await self.call(client, "configure_connection", {"port": port, "line_ending": "cr"})

    async def one(self, client: Client, rng: random.Random, port: str | None) -> None:
        pick = rng.random()
        if pick < 0.5 or (port is None and pick < 0.7):
            await self.pcap(client, rng)
        elif pick < 0.7 and port is not None:
            await self.serial(client, rng, port)
        elif pick < 0.78:
            await self.bpftrace(client, rng)
        elif pick < 0.97:
            await self.crash_or_drgn(client, rng)
        elif pick < 0.985:
            await self.call(client, "diagd_status", {})
        else:
            await self.call(client, "diagd_calls", {"limit": 20})

    async def client(self, env: dict[str, str], index: int, until: float) -> None:
        rng = random.Random(index * 7919 + 1)
        # A port belongs to the client that opened it (others get BUSY): the first clients own one modem each.
        port = self.ports[index] if index < len(self.ports) else None
        period = self.args.clients / self.args.rate
        params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=env)
        async with Client(params, mode="legacy") as client:
            await trio.sleep(rng.random() * period)
            while trio.current_time() < until:
                started = trio.current_time()
                await self.one(client, rng, port)
                await trio.sleep(max(0.0, period * rng.uniform(0.5, 1.5) - (trio.current_time() - started)))


# --------------------------------------------------------------------------- the run


def restart(daemon: BenchDaemon) -> subprocess.Popen[bytes]:
    daemon.proc.send_signal(signal.SIGTERM)
    daemon.proc.wait(timeout=60)
    with open(daemon.log, "ab") as log_file:
        daemon.proc = subprocess.Popen([DIAGD, "serve"], env=daemon.env, stdin=subprocess.DEVNULL, stdout=log_file,
                                       stderr=log_file, start_new_session=True)
    _wait_for_sockets(daemon, START_TIMEOUT_S)
    return daemon.proc


def memory_report(daemon: BenchDaemon) -> Any:
    out = subprocess.run([DIAGD, "status", "--memory", "--json"], env=daemon.env, capture_output=True, text=True,
                         timeout=300)
    try:
        return json.loads(out.stdout).get("memory")
    except json.JSONDecodeError:
        return {"error": out.stderr[-500:]}


async def run(daemon: BenchDaemon, load: Load, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    end = trio.current_time() + args.minutes * 60
    restart_at = t0 + args.minutes * 60 * args.restart_at if 0 < args.restart_at < 1 else None
    era, era_start = 0, t0
    samples: list[dict[str, Any]] = [sample(daemon.proc.pid, t0, era, 0)]
    memory: list[dict[str, Any]] = []
    restarted_s: float | None = None
    tracing, next_memory = trio.Lock(), t0 + args.warmup_min * 60

    async def trace(t_s: float, era: int) -> None:  # in the background: a report can take minutes
        async with tracing:
            memory.append({"t_s": t_s, "era": era, "report": await trio.to_thread.run_sync(memory_report, daemon)})

    async with trio.open_nursery() as nursery:
        for i in range(args.clients):
            nursery.start_soon(load.client, daemon.env, i, end)
        next_sample = t0 + args.sample_s
        while trio.current_time() < end:
            await trio.sleep(min(1.0, max(0.0, end - trio.current_time())))
            now = time.monotonic()
            if restart_at is not None and now >= restart_at:
                restart_at = None
                await trio.to_thread.run_sync(restart, daemon)
                era, era_start, restarted_s = era + 1, time.monotonic(), round(now - t0, 1)
                samples.append(sample(daemon.proc.pid, t0, era, len(load.sent)))
            if now >= next_sample:
                next_sample += args.sample_s
                samples.append(sample(daemon.proc.pid, t0, era, len(load.sent)))
                if args.tracemalloc and not tracing.locked() and now >= next_memory:
                    next_memory = now + args.memory_s
                    nursery.start_soon(trace, samples[-1]["t_s"], era)
                print(f"[{samples[-1]['t_s']:7.0f} s] rss {samples[-1]['rss_mb']:6.1f} MB  fds {samples[-1]['fds']}"
                      f"  threads {samples[-1]['threads']}  children {samples[-1]['children']}"
                      f"  calls {len(load.sent)}  {dict(load.outcomes)}", flush=True)
    load_s = time.monotonic() - t0
    idle = []
    idle_t0 = time.monotonic()
    while time.monotonic() - idle_t0 < args.idle_s:
        await trio.sleep(min(args.sample_s, args.idle_s))
        idle.append(sample(daemon.proc.pid, t0, era, len(load.sent)))
    if args.tracemalloc:
        memory.append({"t_s": round(time.monotonic() - t0, 1), "idle": True, "report": memory_report(daemon)})
    return {"samples": samples, "idle_samples": idle, "load_s": round(load_s, 1), "restarted_at_s": restarted_s,
            "era_starts_s": [0.0] + ([restarted_s] if restarted_s is not None else []), "memory": memory,
            "last_era_start_s": round(era_start - t0, 1)}


def check_audit(state_dir: Path, sent: list[dict[str, Any]]) -> dict[str, Any]:
    files = [*sorted(state_dir.glob("audit.jsonl.*"), key=lambda p: -int(p.suffix[1:])), state_dir / "audit.jsonl"]
    lines = bad = 0
    started: dict[str, dict[str, Any]] = {}
    finals: list[dict[str, Any]] = []
    for path in files:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            lines += 1
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if record["outcome"] == "started":
                started[record["call_id"]] = record
            else:
                finals.append(record)
    key = lambda tool, a: (tool, json.dumps(a, sort_keys=True))  # noqa: E731
    in_log = Counter(key(r["tool"], r["arguments"]) for r in finals)
    answered = Counter(key(s["tool"], s["arguments"]) for s in sent if s.get("code") != RESTARTED
                       and s.get("outcome") != "exception")
    maybe = Counter(key(s["tool"], s["arguments"]) for s in sent if s.get("code") == RESTARTED)
    missing = answered - in_log
    extra = in_log - answered - maybe
    finals_ids = Counter(r["call_id"] for r in finals)
    return {"files": len([f for f in files if f.exists()]), "lines": lines, "invalid_json": bad,
            "final_records": len(finals), "started_records": len(started),
            "finals_without_start": sum(r["call_id"] not in started for r in finals),
            "starts_without_final": len(set(started) - set(finals_ids)),
            "call_ids_twice": sum(n > 1 for n in finals_ids.values()),
            "sent_answered": sum(answered.values()), "restarted_answers": sum(maybe.values()),
            "missing": sum(missing.values()), "extra": sum(extra.values()),
            "missing_examples": [k for k in list(missing)[:5]], "extra_examples": [k for k in list(extra)[:5]],
            "every_call_once": not missing and not extra and not bad}


def summarize(r: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    warm = args.warmup_min * 60
    starts = r["era_starts_s"]
    groups = []
    for era, start in enumerate(starts):
        groups.append([(s["t_s"], s["rss_mb"]) for s in r["samples"] if s["era"] == era and s["t_s"] - start >= warm])
    per_era = [slope_mb_per_h(g) for g in groups]
    last = groups[-1]
    level = None
    if len(last) >= 3 and per_era[-1] is not None:
        mx = sum(x for x, _ in last) / len(last)
        my = sum(y for _, y in last) / len(last)
        level = my + per_era[-1] / 3600 * (starts[-1] + warm - mx)
    idle_rss = r["idle_samples"][-1]["rss_mb"] if r["idle_samples"] else None
    final = r["idle_samples"][-1] if r["idle_samples"] else r["samples"][-1]
    traced = [[(m["t_s"], m["report"]["traced_bytes"] / 2**20) for m in r["memory"]
               if m.get("era") == era and "traced_bytes" in (m["report"] or {}) and m["t_s"] - start >= warm]
              for era, start in enumerate(starts)]
    return {"slope_mb_per_h_per_run": per_era, "traced_slope_mb_per_h_per_run": [slope_mb_per_h(g) for g in traced],
            "slope_mb_per_h_pooled": pooled_slope(groups),
            "post_warmup_rss_mb": level, "idle_rss_mb": idle_rss,
            "idle_minus_post_warmup_mb": None if level is None or idle_rss is None else idle_rss - level,
            "rss_first_mb": r["samples"][0]["rss_mb"], "rss_peak_mb": max(s["rss_mb"] for s in r["samples"]),
            "fds_first": r["samples"][0]["fds"], "fds_idle": final["fds"],
            "threads_first": r["samples"][0]["threads"], "threads_idle": final["threads"],
            "zombies_max": max(s["zombies"] for s in r["samples"] + r["idle_samples"]),
            "children_idle": final["child_names"]}



def start_modem(link: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "support" / "sim_modem.py"), "--link", str(link)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if not proc.stdout.readline():
        raise RuntimeError(f"sim_modem exited with {proc.wait()}")
    return proc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=120)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--rate", type=float, default=4.0, help="calls per second, all clients together")
    parser.add_argument("--sample-s", type=float, default=30)
    parser.add_argument("--warmup-min", type=float, default=10)
    parser.add_argument("--idle-s", type=float, default=300)
    parser.add_argument("--restart-at", type=float, default=0.5, help="fraction of the run (0: no restart)")
    parser.add_argument("--max-loaded", type=int, help="[pcap] max_loaded (default: the daemon's)")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES")
    parser.add_argument("--memory-s", type=float, default=180, help="with --tracemalloc: seconds between reports")
    parser.add_argument("--json-out", type=Path, default=Path(f"/tmp/diagd-soak-{int(time.time())}.json"))
    args = parser.parse_args()
    vmcore, vmlinux = vmcore_fixture()
    config = (f'[daemon]\nallowed_dirs = {json.dumps([str(PCAP_DIR), str(vmcore.parent)])}\naudit_keep = 1000\n'
              f'[crash]\ncommand_timeout_s = 240\n')
    if os.environ.get("DIAGD_LANDLOCK") in ("off", "0"):
        config += "allow_unconfined = true\n"
    if args.max_loaded:
        config += f"[pcap]\nmax_loaded = {args.max_loaded}\n"
    extra = {"DIAGD_TRACEMALLOC": str(args.tracemalloc)} if args.tracemalloc else {}
    # Tracing from the first import makes the start slow on a loaded machine.
    with isolated_daemon("soak", config=config, extra_env=extra, start_timeout_s=START_TIMEOUT_S) as daemon:
        modems = [start_modem(daemon.tmp / f"modem{i}") for i in range(2)]
        first_proc = daemon.proc
        try:
            load = Load(args, [str(daemon.tmp / f"modem{i}") for i in range(2)], vmcore, vmlinux)
            r = trio.run(run, daemon, load, args)
            r["audit"] = check_audit(Path(daemon.env["DIAGD_STATE_DIR"]), load.sent)
        finally:
            if daemon.proc is not first_proc and daemon.proc.poll() is None:
                daemon.proc.send_signal(signal.SIGTERM)
                daemon.proc.wait(timeout=60)
            for modem in modems:
                assert modem.stdin is not None
                modem.stdin.close()
                modem.wait(timeout=10)
    r.update(args={k: str(v) for k, v in vars(args).items()}, outcomes=dict(load.outcomes), calls=len(load.sent),
             exceptions=load.exceptions[:20], error_examples=load.error_examples, summary=summarize(r, args),
             calls_by_tool=dict(Counter(s["tool"] for s in load.sent)))
    args.json_out.write_text(json.dumps(r, indent=1))
    return report(r)


def report(r: dict[str, Any]) -> int:
    s, a, o = r["summary"], r["audit"], r["outcomes"]
    fmt = lambda v: "n/a" if v is None else f"{v:+.1f}"  # noqa: E731
    print(f"\nsoak: {r['args']['minutes']} min, {r['args']['clients']} clients, {r['calls']} calls "
          f"({r['calls'] / max(r['load_s'], 1):.2f}/s), restart at {r['restarted_at_s']} s; "
          f"json: {r['args']['json_out']}")
    print(f"RSS slope after {r['args']['warmup_min']} min warm-up: per daemon run "
          f"{[fmt(x) for x in s['slope_mb_per_h_per_run']]} MB/h, pooled {fmt(s['slope_mb_per_h_pooled'])} MB/h")
    level = "n/a" if s["post_warmup_rss_mb"] is None else f"{s['post_warmup_rss_mb']:.1f}"
    if r["memory"]:
        print(f"tracemalloc: traced Python heap slope per run {[fmt(x) for x in s['traced_slope_mb_per_h_per_run']]}"
              f" MB/h (RSS here includes tracemalloc's own overhead)")
    print(f"RSS first {s['rss_first_mb']:.1f} MB, peak {s['rss_peak_mb']:.1f} MB, post-warm-up {level} MB, "
          f"idle after {r['args']['idle_s']} s {s['idle_rss_mb']} MB (diff {fmt(s['idle_minus_post_warmup_mb'])} MB)")
    print(f"fds {s['fds_first']} -> {s['fds_idle']} idle, threads {s['threads_first']} -> {s['threads_idle']}, "
          f"zombies at most {s['zombies_max']}, children idle {s['children_idle']}")
    print(f"outcomes: {o}")
    print(f"TIMEOUT {o.get('TIMEOUT', 0)}  INTERNAL_ERROR {o.get('INTERNAL_ERROR', 0)}  CANCELLED "
          f"{o.get('CANCELLED', 0)}  client exceptions {o.get('client exception', 0)}")
    print(f"audit: {a['lines']} lines in {a['files']} files, invalid {a['invalid_json']}, {a['final_records']} calls; "
          f"missing {a['missing']}, extra {a['extra']}, ids twice {a['call_ids_twice']}, finals without start "
          f"{a['finals_without_start']}, starts without end {a['starts_without_final']}: "
          f"{'every call once' if a['every_call_once'] else 'MISMATCH'}")
    bad = o.get("TIMEOUT", 0) + o.get("INTERNAL_ERROR", 0) + o.get("client exception", 0)
    return 0 if a["every_call_once"] and not bad and s["zombies_max"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
