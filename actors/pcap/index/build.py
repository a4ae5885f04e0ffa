"""Building one index: a child process that runs tshark and writes its rows as Parquet.

`python -P build.py OUT_DIR COLUMNS SCHEMA_VERSION CHUNK_BYTES SEGMENT_FRAMES -- TSHARK_ARGV...` (`command()`)
reads a capture with the given tshark command (the capture's own: `-r FILE -n -2` and its decode-as rules
and preferences, with `fields_args()` after it), parses its tab-separated rows with Arrow's C++ CSV reader
in blocks of BLOCK_BYTES and writes each as a Parquet row group, so memory stays bounded whatever the
capture's size. It prints one JSON line per block (`{"frames": N, "indexed": M, "folder": ..., "chunked":
...}`: the progress) and a last one with the metadata; the daemon reads them (index_actor.py).

The frames table is a folder of files (tables.FRAMES_DIR: each named by its first frame's number,
`000000000001.parquet`, ..., in frame order: one Parquet dataset any engine reads as one table), each
closed once it holds SEGMENT_FRAMES frames or has been open sink.SEGMENT_S: a closed file is renamed to its
name (`.parquet`), so the daemon answers from the `indexed` frames of a build still running (tshark's
two-pass rows: each final once printed) while the rest is read.

Another process than the daemon: a build of a 20 GB
capture takes minutes of parsing and writing that must not share the daemon's event loop. It runs as
a script, not a module of the package, and imports nothing of diagd: importing the pcap back end
would cost it ~0.3 s of start (the columns come as an argument, as JSON).

A row tshark printed with more or fewer cells than columns (a value holding a tab would do that)
fails the whole build, as a tshark killed midway does: an index is exact or absent. It is written in
a folder of its own beside OUT_DIR and renamed to it at the end; a build that finds OUT_DIR built by
another meanwhile drops its own.

tshark prints every occurrence of the layered fields (tables.LAYERED): the frames table keeps the
first, and each block's network and transport layers go to layers.parquet (tables.py, loaded by path:
this script imports nothing of diagd), from which the conversation and endpoint tables are written at
the end.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

BLOCK_BYTES = 4 << 20  # tshark output parsed per block: ~10-20k rows
SEGMENT_FRAMES = 1 << 20  # frames in a file of the frames table (16 row groups; sink.py)
META_FILE = "meta.json"
PARTIAL = ".partial-"  # a build's own folder: <index name>.partial-<random>, renamed to the index at its end
LOCK_FILE = ".lock"
TRUNCATED = "cut short in the middle of a packet"


STDERR_KEPT = 16384


def _tail(path: Path) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - STDERR_KEPT))
        return f.read().decode(errors="replace")


def fields_args() -> list[str]:
    """What follows the capture's tshark command: the index's fields, one tab-separated row a frame."""
    from diagd.actors.pcap.index.schema import COLUMNS
    from diagd.actors.pcap.index.tables import AGGREGATOR
    from diagd.actors.pcap.shark.rows import DEFAULT_COLUMN_PREF

    # frame.file_off is in the tree only with its preference on.
    args = ["-o", DEFAULT_COLUMN_PREF, "-o", "frame.show_file_off:TRUE", "-T", "fields", "-E", "header=n",
            "-E", "occurrence=a", "-E", f"aggregator={AGGREGATOR}"]
    for col in COLUMNS:
        args += ["-e", col.field]
    return args


def command(out: Path, tshark_argv: list[str], chunk_bytes: int = 0, segment_frames: int = SEGMENT_FRAMES
            ) -> list[str]:
    """This builder's command line for the capture's tshark command (its file and decoding); a capture
    of more than `chunk_bytes` (0: any size) is read in chunks of about that many bytes (stitch.py); a
    file of the frames table holds at most `segment_frames` frames."""
    from diagd.actors import interpreter
    from diagd.actors.pcap.index.schema import COLUMNS, SCHEMA_VERSION

    columns = json.dumps([[c.name, c.kind, c.many] for c in COLUMNS])
    return interpreter.script_argv(__file__, str(out), columns, str(SCHEMA_VERSION), str(chunk_bytes),
                                   str(segment_frames), "--", *tshark_argv, *fields_args())


def build(out: Path, argv: list[str], columns: list[tuple[str, str, bool]], schema_version: int,
          chunk_bytes: int = 0, segment_frames: int = SEGMENT_FRAMES) -> dict[str, Any]:
    """Run `argv` (tshark with fields_args()), write OUT/frames/*.parquet, the other tables and OUT/meta.json."""
    started = time.monotonic()
    # A folder of this build's own (two builds of one index, from two daemons or two file versions of
    # the same content, never write into each other's), locked while it runs: IndexStore.sweep removes
    # only partial folders whose lock nobody holds (a builder SIGKILLed with its process group).
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + PARTIAL))
    lock = open(partial / LOCK_FILE, "wb")  # noqa: SIM115 - held until the process ends
    fcntl.flock(lock, fcntl.LOCK_EX)
    unaligned: dict[str, list[int]] = {}  # per protocol: [frames, the first few of them...]
    chunked: dict[str, Any] = {}
    try:
        plan = _plan(argv, chunk_bytes, chunked)
        with _sink().Sink(partial, columns, _tables(), segment_frames) as sink:
            sink.chunked = plan is not None
            if plan is None:
                messages = _pass(argv, sink, unaligned, None)
            else:
                messages = _chunked(argv, plan, sink, unaligned, partial, chunked)
        _release_memory()  # what the passes held, before DuckDB's share of the budget
        seams = (_stitch().write_seams(partial, _tables().frames_table(_tables().frame_files(partial)), chunked)
                 if plan is not None else None)
    except BaseException:
        # Stopped, the daemon gone, a parse error, a failed pass: nothing half-written stays.
        shutil.rmtree(partial, ignore_errors=True)
        raise
    frames = sink.frames
    tables_failed = _tables().write_tables(partial)
    summary = _summary(partial, frames)
    version = subprocess.run([argv[0], "-v"], capture_output=True, text=True, check=False).stdout
    meta = {"schema_version": schema_version, "frames": frames,
            "tshark_version": (version.splitlines() or ["unknown"])[0].strip(),
            "build_s": round(time.monotonic() - started, 3),
            "built_at": time.time(), "tshark_argv": argv, "warnings": messages[-5:],
            # Times and protocols of the whole capture (tables.summary): a daemon starting reads no frame.
            "summary": summary,
            "bytes": sum(f.stat().st_size for f in partial.rglob("*.parquet")),
            # Frames whose layers' fields could not be aligned, per protocol: its tables are not answered.
            "unaligned": {layer: {"frames": found[0], "first": found[1:]} for layer, found in unaligned.items()},
            # Why the conversation and endpoint tables are missing (a DuckDB failure: memory); null: written.
            "tables_failed": tables_failed,
            # A capture read in chunks (stitch.py): their bounds, and how many frames are seam frames.
            "chunks": chunked.get("chunks"), "chunk_bytes": chunk_bytes or None,
            "seam_frames": seams, "not_chunked": chunked.get("not_chunked"),
            "chunks_read_again": chunked.get("reread"), "setups_not_replayed": chunked.get("setups_not_replayed"),
            "doubted_streams": {layer: len(streams) for layer, streams in chunked.get("doubted", {}).items()} or None}
    (partial / META_FILE).write_text(json.dumps(meta))
    (partial / LOCK_FILE).unlink()
    return _publish(partial, out, meta)


def _tables() -> ModuleType:
    """tables.py beside this script, loaded by path (a script of its own imports nothing of diagd)."""
    return _beside("diagd_index_tables", "tables.py")


def _summary(partial: Path, frames: int) -> dict[str, Any] | None:
    """tables.summary of the frames written; None when DuckDB fails (memory): the index stands, and
    answers read the summary from its frames (query.summary)."""
    import duckdb

    tables = _tables()
    try:
        with duckdb.connect(config={"memory_limit": "256MB", "threads": 2, "temp_directory": ""}) as con:
            con.execute("PRAGMA disable_progress_bar")
            return dict(tables.summary(con, tables.frames_table(tables.frame_files(partial)), frames))
    except duckdb.Error:
        return None


def _release_memory() -> None:
    """Give back to the system what the passes freed (Arrow's pool, the C heap): the aggregations at
    the end of a build run in this process, within the build's memory."""
    import ctypes
    import gc

    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its heap stays as it is
        pass


def _beside(name: str, filename: str) -> ModuleType:
    """A module beside this script, loaded by path once (registered, as dataclasses need it)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(filename))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _sink() -> ModuleType:
    """sink.py beside this script, loaded by path."""
    return _beside("diagd_index_sink", "sink.py")


def _stitch() -> ModuleType:
    """stitch.py beside this script, loaded by path."""
    return _beside("diagd_index_stitch", "stitch.py")


def _pass(argv: list[str], sink: Any, unaligned: dict[str, list[int]], stitching: Any) -> list[str]:
    """One tshark pass (argv) into `sink` (its rows renumbered by the Stitcher `stitching` when one is
    given); its messages. A failed pass (SystemExit) is no index."""
    folder = sink.partial
    # tshark's stderr to a file: read at the end (its last STDERR_KEPT bytes), never a pipe left to fill.
    with open(folder / "tshark.stderr", "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
    bad_rows: list[str] = []
    try:
        frames = _write_rows(proc.stdout, sink, bad_rows, unaligned, stitching)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if bad_rows:
        proc.kill()
    proc.wait()
    stderr = _tail(folder / "tshark.stderr")
    (folder / "tshark.stderr").unlink()
    messages = [x for x in stderr.splitlines() if x and not x.startswith("Running as user")]
    failure = _failure(proc.returncode, frames, messages, bad_rows)
    if failure is not None:
        raise SystemExit(failure)
    return messages


def _plan(argv: list[str], chunk_bytes: int, chunked: dict[str, Any]) -> Any:
    """The runs of records a capture of more than `chunk_bytes` is read in (None: one pass; why, in
    chunked["not_chunked"], when the capture is bigger but cannot be split)."""
    if not chunk_bytes or "-r" not in argv:
        return None
    capture = Path(argv[argv.index("-r") + 1])
    if capture.stat().st_size <= chunk_bytes:
        return None
    from diagd.actors.pcap.shark import recordwalk  # imports diagd: worth it for a capture this big

    found = recordwalk.read_layout(capture, any_ticks=True) if recordwalk.available() else None
    runs = recordwalk.chunks(capture, found, chunk_bytes) if found is not None else None
    if runs is None:
        chunked["not_chunked"] = ("the record walk cannot split the file (not a plain pcap or a pcapng of one "
                                  "section with its interfaces first and only packets after them, or a record "
                                  "it does not follow): read in one pass")
        return None
    return (capture, found, runs) if len(runs) > 1 else None


class _ChunkPass:
    """One chunk's tshark, its rows spooled to a file (so that the next chunk's tshark runs while the
    builder parses this one's rows: one tshark at a time, the builder never waiting for a first pass)."""

    def __init__(self, k: int, argv: list[str], plan: Any, replayed: list[tuple[int, int]], folder: Path) -> None:
        from diagd.actors.pcap.index import narrow

        capture, found, runs = plan
        self.k, self.run, self.replayed = k, runs[k], replayed
        self.piece, self.spool, self.errors = (folder / f"chunk-{k}.pcap", folder / f"chunk-{k}.tsv",
                                               folder / f"chunk-{k}.stderr")
        narrow.write_chunk(capture, found, self.run, [offset for _, offset in replayed], self.piece)
        # The chunk's file holds the header and the replayed frames before the run's first record.
        self.offset_shift = self.run.start - (self.piece.stat().st_size - (self.run.end - self.run.start))
        at = argv.index("-r") + 1
        extra = [arg for _, field in _stitch().BUILD_FIELDS for arg in ("-e", field)]
        with open(self.spool, "wb") as out, open(self.errors, "wb") as err:
            self.proc = subprocess.Popen([*argv[:at], str(self.piece), *argv[at + 1:], *extra],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=err)

    def wait(self) -> list[str]:
        """tshark's end; its messages (a failed pass: SystemExit)."""
        self.proc.wait()
        self.piece.unlink(missing_ok=True)
        messages = [x for x in _tail(self.errors).splitlines() if x and not x.startswith("Running as user")]
        failure = _failure(self.proc.returncode, 1, messages, [])
        if failure is not None:
            raise SystemExit(failure)
        return messages

    def parse(self, sink: Any, unaligned: dict[str, list[int]], stitching: Any) -> None:
        stitching.begin(self.k, self.run.first, self.offset_shift, [number for number, _ in self.replayed])
        bad_rows: list[str] = []
        with open(self.spool, "rb") as rows:
            frames = _write_rows(rows, sink, bad_rows, unaligned, stitching)
        if bad_rows or frames != self.run.packets + len(self.replayed):
            raise SystemExit(_failure(0, frames, [], bad_rows) or
                             f"tshark read {frames} frames of chunk {self.k}, which holds "
                             f"{self.run.packets + len(self.replayed)}")
        sink.vouched = sink.frames  # this chunk's rows are numbered right: a reader may read them
        sink.say_progress()
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for path in (self.piece, self.spool, self.errors):
            path.unlink(missing_ok=True)


def _chunked(argv: list[str], plan: Any, sink: Any, unaligned: dict[str, list[int]], partial: Path,
             chunked: dict[str, Any]) -> list[str]:
    """One pass per run of records, each of a file of its own (header, replayed frames, the run),
    renumbered into one capture's rows (stitch.py). The next chunk's pass starts before this one's rows
    are parsed, with the setup frames known then; if this chunk holds more, it is read again."""
    _, _, runs = plan
    stitching = _stitch().Stitcher()
    messages: list[str] = []

    def start(k: int) -> tuple[Any, int]:
        # Ahead of a chunk after the first: the capture's first frame and the frames that set up others'
        # conversations (stitch.py), by their offsets in the capture.
        replayed = [(1, runs[0].start)] + [x for x in stitching.replay() if x[0] != 1] if k else []
        return _ChunkPass(k, argv, plan, replayed, partial), stitching.setups_seen

    running: list[tuple[Any, int]] = [start(0)]
    reread = 0
    try:
        for k in range(len(runs)):
            current, setups_known = running.pop()
            messages += current.wait()
            if setups_known != stitching.setups_seen:  # the chunk before set up conversations this one missed
                current.close()
                current, _ = start(k)
                messages += current.wait()
                reread += 1
            if k + 1 < len(runs):
                running.append(start(k + 1))
            current.parse(sink, unaligned, stitching)
    finally:
        for waiting, _ in running:
            waiting.close()
    chunked["chunks"] = [[run.first + 1, run.packets] for run in runs]
    chunked["reread"] = reread
    chunked["fragments"] = stitching.fragments
    chunked["unsure_from"] = stitching.unsure_from
    # Setup frames not replayed (beyond the limit): conversations they set up may read otherwise after them.
    chunked["setups_not_replayed"] = stitching.setups_seen - len(stitching.setups)
    chunked["doubted"] = {layer: sorted(stitching.doubted(layer)) for layer in ("tcp", "udp")}
    return messages


def _write_rows(source: Any, sink: Any, bad_rows: list[str], unaligned: dict[str, list[int]],
                stitching: Any) -> int:
    """tshark's rows read from `source` (its output), block by block, into `sink`; how many frames. A
    row with more or fewer cells than columns is noted in `bad_rows` and ends the reading."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as csv

    tables = sink.tables
    build_fields = [name for name, _ in _stitch().BUILD_FIELDS] if stitching is not None else []
    names = [*sink.names, *build_fields]
    # Read as text: every occurrence of a field of many (joined by the aggregator), and the relative
    # time, kept to the nanosecond as an integer (tables.rel_ns).
    as_text = {*sink.many, "rel_ns", *build_fields}
    read_types = {name: pa.string() if name in as_text else sink.types[name] for name in names}

    def invalid(row: Any) -> str:
        bad_rows.append(f"{row.expected_columns} cells expected, {row.actual_columns} found: {row.text[:200]!r}")
        return "skip"

    def typed(batch: Any, name: str) -> Any:
        cells = batch.column(name)
        if name == "rel_ns":
            return pa.array([None if t is None else tables.rel_ns(t) for t in cells.to_pylist()], pa.int64())
        if name in sink.many:
            cells = pc.split_pattern(cells, tables.AGGREGATOR)
        return cells.cast(sink.types[name])

    frames = 0
    try:
        reader = csv.open_csv(
            source,
            read_options=csv.ReadOptions(column_names=names, block_size=BLOCK_BYTES),
            parse_options=csv.ParseOptions(delimiter="\t", quote_char=False, double_quote=False,
                                           escape_char=False, newlines_in_values=False,
                                           invalid_row_handler=invalid),
            convert_options=csv.ConvertOptions(column_types=read_types, null_values=[""], strings_can_be_null=True,
                                               quoted_strings_can_be_null=True))
        for batch in reader:
            if bad_rows:
                break
            typed_batch = pa.record_batch([typed(batch, n) for n in sink.names], schema=sink.schema)
            got = typed_batch.select(["number", "protocols", "length", "rel_ns", "expert_severities",
                                      *tables.LAYERED]).to_pydict()
            occurrences: list[int] = []
            hidden: list[tuple[tuple[Any, ...], int]] | None = [] if stitching is not None else None
            rows = list(tables.batch_layers(got["number"], got["protocols"], got["length"], got["rel_ns"],
                                            got["expert_severities"], {c: got[c] for c in tables.LAYERED},
                                            unaligned, occurrences, sink.stacks, hidden,
                                            None if stitching is None else stitching.whole_number))
            if stitching is not None:
                # The Stitcher sees every layer with a stream in tree order, the quoted ones too.
                # (A quoted layer's occurrence is None: what an error quotes sets no sequence numbers.)
                seen = sorted([*zip(rows, occurrences, strict=True), *((row, None) for row, _ in hidden or [])],
                              key=lambda x: x[0][:2])
                typed_batch = _stitched(stitching, typed_batch, seen, _build_cells(batch))
                rows = _renumbered_rows(stitching, rows)
            sink.write(typed_batch, rows)
            frames += batch.num_rows
    except pa.ArrowInvalid as exc:
        if "Empty CSV file" not in str(exc):
            raise
    return frames


def _build_cells(batch: Any) -> dict[str, Any]:
    """A block's build fields (stitch.BUILD_FIELDS) as the Stitcher reads them: TCP's flags and sequence
    numbers per frame, and the other fields of the frames that may be IP fragments only (few)."""
    import pyarrow.compute as pc

    aggregator = _tables().AGGREGATOR

    def split(name: str, rows: Any = None) -> list[Any]:
        column = batch.column(name) if rows is None else pc.take(batch.column(name), rows)
        return list(pc.split_pattern(column, aggregator).to_pylist())

    maybe = pc.or_kleene(pc.or_kleene(pc.match_substring_regex(batch.column("ip_mf"), "1|True"),
                                      pc.match_substring_regex(batch.column("ip_frag_offset"), "[1-9]")),
                         pc.is_valid(batch.column("ipv6_more")))
    rows = pc.indices_nonzero(pc.fill_null(maybe, False))
    names = [name for name, _ in _stitch().BUILD_FIELDS if not name.startswith("tcp_")]
    fragments = dict(zip(names, (split(name, rows) for name in names), strict=True))
    return {"tcp_flags": split("tcp_flags"), "tcp_seq_raw": split("tcp_seq_raw"),
            "fragments": [(i, {name: fragments[name][j] or [] for name in names})
                          for j, i in enumerate(rows.to_pylist())]}


def _stitched(stitching: Any, batch: Any, seen: list[tuple[tuple[Any, ...], int | None]],
              extra: dict[str, Any]) -> Any:
    """A block of one chunk's pass renumbered as the whole file's (stitch.Stitcher), the replayed frames
    left out; `seen`: its layers with streams, (row, occurrence), in tree order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    numbers = batch.column("number")
    first_local = numbers[0].as_py()
    stitching.see([row for row, _ in seen], [k for _, k in seen], first_local, extra)
    columns = {name: batch.column(name) for name in batch.schema.names}
    kept = max(0, len(stitching.replayed) + 1 - first_local)  # the first row not replayed
    shift = stitching.number(first_local + kept) - (first_local + kept)
    columns["number"] = pc.add(numbers, shift)
    columns["file_off"] = pc.add(columns["file_off"], stitching.offset_shift)
    columns["info"] = _renumbered_info(stitching, columns["info"])
    for layer, column in (("tcp", "tcp_stream"), ("udp", "udp_stream")):
        lists = columns[column]
        flat = pc.list_flatten(lists)
        if len(flat):
            mapping = pa.array(stitching.mapping(layer, pc.max(flat).as_py()), pa.int64())
            columns[column] = pa.ListArray.from_arrays(lists.offsets, pc.take(mapping, flat), mask=pc.is_null(lists))
    stitching.note_unsure(first_local)
    stitched = pa.record_batch(list(columns.values()), schema=batch.schema).slice(kept)
    # The frames that set up conversations (few): a regular expression picks them.
    setups = pc.indices_nonzero(pc.fill_null(pc.match_substring_regex(stitched.column("protocols"),
                                                                      _stitch().SETUP_STACK), False))
    got = stitched.select(["number", "file_off"]).take(setups).to_pydict()
    stitching.see_setups(got["number"], got["file_off"])
    return stitched


def _renumbered_rows(stitching: Any, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """A block's layer rows (tables.LAYER_COLUMNS) renumbered as the whole file's, the replayed left out."""
    mapped = []
    for row in rows:
        if stitching.is_replayed(row[0]):
            continue
        stream = row[8]
        if stream is not None:
            stream = stitching.mapping(row[2], stream)[stream]
        mapped.append((stitching.number(row[0]), *row[1:8], stream, *row[9:]))
    return mapped


def _renumbered_info(stitching: Any, info: Any) -> Any:
    """The Info column with the frame numbers Wireshark writes into it (stitch.INFO_NUMBERS) renumbered."""
    import re

    import pyarrow as pa
    import pyarrow.compute as pc

    pattern = _stitch().INFO_NUMBERS
    if not pc.any(pc.match_substring_regex(info, pattern)).as_py():
        return info
    compiled = re.compile(pattern)
    return pa.array([None if text is None else compiled.sub(
        lambda m: m.group(1) + str(stitching.number(int(m.group(2)))) + m.group(3), text)
        for text in info.to_pylist()],
        pa.string())


def _failure(returncode: int, frames: int, messages: list[str], bad_rows: list[str]) -> str | None:
    """Why the pass is no index (None: it is one)."""
    if bad_rows:
        return f"tshark printed rows the index cannot hold exactly: {bad_rows[0]}"
    if returncode < 0:
        # Killed (out of memory, a dissector's crash): its rows end anywhere, never an index.
        return f"tshark was killed (signal {-returncode}) before the end of the capture"
    if returncode != 0 and (not frames or not any(TRUNCATED in m for m in messages)):
        # A capture cut short in the middle of a packet is indexed up to there (tshark says so: a
        # warning kept in meta.json); any other failure is no index.
        return "tshark could not read the capture: " + "\n".join(messages)[-2000:]
    return None


def _publish(partial: Path, out: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """The build's folder becomes the index, unless another build of the same index ended first: its
    index stands, this one goes."""
    if (out / META_FILE).is_file():
        shutil.rmtree(partial, ignore_errors=True)
        return dict(json.loads((out / META_FILE).read_text()))
    shutil.rmtree(out, ignore_errors=True)  # leftovers without meta.json: never an index
    try:
        os.rename(partial, out)
    except OSError:  # another build renamed its folder there this very moment
        shutil.rmtree(partial, ignore_errors=True)
        return dict(json.loads((out / META_FILE).read_text()))
    return meta


def main(args: list[str]) -> int:
    if len(args) < 7 or args[5] != "--":
        sys.stderr.write("usage: build.py OUT_DIR COLUMNS_JSON SCHEMA_VERSION CHUNK_BYTES SEGMENT_FRAMES -- "
                         "TSHARK_ARGV...\n")
        return 2
    columns = [(str(name), str(kind), bool(many)) for name, kind, many in json.loads(args[1])]
    meta = build(Path(args[0]), args[6:], columns, int(args[2]), int(args[3]), max(1, int(args[4])))
    print(json.dumps({"done": meta}), flush=True)
    return 0


def run(args: list[str]) -> None:
    """main, then out at once (os._exit): Arrow's reader thread may still be blocked reading tshark's
    pipe through a Python file object, and a normal interpreter shutdown then waits for it forever
    (seen when the daemon died mid-build: the builder cleaned up, then hung at exit)."""
    code = 1
    try:
        code = main(args)
    except SystemExit as exc:
        code = 1 if exc.code is None or isinstance(exc.code, str) else int(exc.code)
        if isinstance(exc.code, str):
            _say(exc.code)
    except BrokenPipeError:
        pass  # the daemon is gone: nobody to tell
    except BaseException as exc:  # any failure is the build's coded end, said on stderr
        _say(f"the index build failed: {type(exc).__name__}: {exc}")
    finally:
        os._exit(code)


def _say(message: str) -> None:
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except OSError:
        pass


if __name__ == "__main__":
    run(sys.argv[1:])
