"""pcap_list_fields benchmark: the per-field search against the fast paths, on Wireshark's real
field catalogue (`tshark -G fields`, ~233k fields).

Run from the repository root:

    .venv/bin/python bench/list_fields.py [--repeats 5] [--no-daemon] [--json]

For each query (literals and regexes, case-insensitive as the tool's default), in this process:
- `re per field`: the stdlib `re`, one search per name and description, as the tool did before
  user regexes moved to `regex` (unsafe: a catastrophic pattern froze the daemon), for reference;
- `per field`: `regex` in a worker thread, one metered search per name and description (the path
  that was ~3x slower, still the fallback for patterns that may cross a line);
- `fast`: `search_fields` (casefolded `str.find` for literals, one MULTILINE search over the joined
  catalogue for line-local regexes), with the catalogue's joined text already built; the one-time
  build is reported on its own.
Every `fast` result is checked against `per field`. Then, unless --no-daemon, the tool itself over
an isolated daemon's MCP socket (raw JSON-RPC, warm: the first call loads the catalogue).
Times are medians of --repeats wall times, in seconds.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _daemon import isolated_daemon

from diagd.actors._user_regex import Matcher, compile_in_thread
from diagd.actors.pcap.answers.field_search import Row, fast_scan, field_text, scan_per_field, search_fields
from diagd.actors.pcap.shark.wireshark import Catalogue, read_catalogue

QUERIES: list[tuple[str, bool]] = [
    ("ngap", False), ("cause", False), ("zzzzqq", False), ("e", False), ("\u00b5", False),
    (r"ngap\..*id", True), (r"^sip\.", True), ("cause$", True), (r"\bue\b", True), (r"nas.5gs\.mm\.\w+", True),
    (r"\s+id$", True),  # \s may cross a line: stays on the per-field path
]
BUDGET_S = 60.0


def median_s(repeats: int, fn: Callable[[], Any]) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


async def in_process(repeats: int) -> tuple[float, list[dict[str, Any]]]:
    cat = await read_catalogue()
    start = time.perf_counter()
    await field_text(cat)
    build_s = time.perf_counter() - start
    return build_s, [await measure(cat, query, is_regex, repeats) for query, is_regex in QUERIES]


async def measure(cat: Catalogue, query: str, is_regex: bool, repeats: int) -> dict[str, Any]:
    rows = list(cat.fields.items())
    user = await compile_in_thread(query, literal=not is_regex)
    stdlib = re.compile(query if is_regex else re.escape(query), re.IGNORECASE)

    def matcher() -> Matcher:
        return Matcher(user, BUDGET_S, unit="field", total=len(rows))

    async def per_field() -> list[Row]:
        m = matcher()
        return await m.run(lambda: scan_per_field(rows, m))

    async def timed(fn: Callable[[], Awaitable[list[Row]]]) -> tuple[float, list[Row]]:
        samples, result = [], []
        for _ in range(repeats):
            begin = time.perf_counter()
            result = await fn()
            samples.append(time.perf_counter() - begin)
        return statistics.median(samples), result

    re_s = median_s(repeats, lambda: [row for row in rows if stdlib.search(row[0]) or stdlib.search(row[1][0])])
    slow_s, slow = await timed(per_field)
    fast_s, fast = await timed(lambda: search_fields(cat, user, matcher()))
    return {"query": query, "regex": is_regex, "path": "fast" if fast_scan(user) else "per field",
            "matches": len(fast), "same": fast == slow, "re_per_field_s": re_s,
            "per_field_s": slow_s, "fast_s": fast_s}


def through_daemon(repeats: int) -> list[dict[str, Any]]:
    config = '[daemon]\nregex_budget_s = 60\ncall_timeout_s = 120\n'
    out = []
    with isolated_daemon("list_fields", config=config) as daemon:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(120)
        sock.connect(str(daemon.mcp_socket))
        reader = sock.makefile("rb")
        ident = 0

        def rpc(method: str, params: dict[str, Any], notify: bool = False) -> Any:
            nonlocal ident
            ident += 1
            message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
            if not notify:
                message["id"] = ident
            sock.sendall(json.dumps(message).encode() + b"\n")
            return None if notify else json.loads(reader.readline())

        rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "bench", "version": "0"}})
        rpc("notifications/initialized", {}, notify=True)

        def call(query: str, is_regex: bool) -> Any:
            reply = rpc("tools/call", {"name": "pcap_list_fields",
                                       "arguments": {"query": query, "is_regex": is_regex, "limit": 1}})
            assert not reply["result"].get("isError"), reply
            return reply["result"]["structuredContent"]["total"]

        start = time.perf_counter()
        call("ngap", False)
        first_s = time.perf_counter() - start
        out.append({"query": "(first call: tshark -G, joined text)", "regex": False, "call_s": first_s})
        for query, is_regex in QUERIES:
            total = call(query, is_regex)
            out.append({"query": query, "regex": is_regex, "matches": total,
                        "call_s": median_s(repeats, lambda q=query, r=is_regex: call(q, r))})
        sock.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-daemon", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    build_s, rows = trio.run(in_process, args.repeats)
    calls = [] if args.no_daemon else through_daemon(args.repeats)
    if args.json:
        print(json.dumps({"joined_text_build_s": build_s, "in_process": rows, "daemon": calls}, indent=2))
        return
    print(f"catalogue joined text built once in {build_s:.2f} s")
    print(f"{'query':24} {'path':9} {'matches':>7} {'re/field':>9} {'regex/field':>11} {'fast':>8} "
          f"{'speed-up':>8} same")
    for r in rows:
        print(f"{(('/' + r['query'] + '/') if r['regex'] else repr(r['query'])):24} {r['path']:9} "
              f"{r['matches']:7d} {r['re_per_field_s']:9.3f} {r['per_field_s']:11.3f} {r['fast_s']:8.3f} "
              f"{r['per_field_s'] / r['fast_s']:7.1f}x {r['same']}")
    for c in calls:
        label = ("/" + c["query"] + "/") if c["regex"] else repr(c["query"])
        print(f"daemon pcap_list_fields {label:40} {c['call_s']:.3f} s")


if __name__ == "__main__":
    main()
