"""Building one index: a child process that runs tshark and writes its rows as Parquet.

`python -P build.py OUT_DIR COLUMNS SCHEMA_VERSION -- TSHARK_ARGV...` (`command()`) reads a capture with the given
tshark command (the capture's own: `-r FILE -n -2` and its decode-as rules and preferences, with
`fields_args()` after it), parses its tab-separated rows with Arrow's C++ CSV reader in blocks of
BLOCK_BYTES and writes each as a Parquet row group, so memory stays bounded whatever the capture's
size. It prints one JSON line per row group (`{"frames": N}`: the progress) and a last one with the
metadata; the daemon reads them (index_actor.py). Another process than the daemon: a build of a 20 GB
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

BLOCK_BYTES = 4 << 20  # tshark output parsed per block: ~10-20k rows, one Parquet row group each
FRAMES_FILE = "frames.parquet"
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


def command(out: Path, tshark_argv: list[str]) -> list[str]:
    """This builder's command line for the capture's tshark command (its file and decoding)."""
    from diagd.actors import interpreter
    from diagd.actors.pcap.index.schema import COLUMNS, SCHEMA_VERSION

    columns = json.dumps([[c.name, c.kind, c.many] for c in COLUMNS])
    return interpreter.script_argv(__file__, str(out), columns, str(SCHEMA_VERSION), "--", *tshark_argv,
                                   *fields_args())


def build(out: Path, argv: list[str], columns: list[tuple[str, str, bool]], schema_version: int) -> dict[str, Any]:
    """Run `argv` (tshark with fields_args()), write OUT/frames.parquet and OUT/meta.json."""
    started = time.monotonic()
    # A folder of this build's own (two builds of one index, from two daemons or two file versions of
    # the same content, never write into each other's), locked while it runs: IndexStore.sweep removes
    # only partial folders whose lock nobody holds (a builder SIGKILLed with its process group).
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + PARTIAL))
    lock = open(partial / LOCK_FILE, "wb")  # noqa: SIM115 - held until the process ends
    fcntl.flock(lock, fcntl.LOCK_EX)
    # tshark's stderr to a file: read at the end (its last STDERR_KEPT bytes), never a pipe left to fill.
    with open(partial / "tshark.stderr", "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
    bad_rows: list[str] = []
    unaligned: dict[str, list[int]] = {}  # per protocol: [frames, the first few of them...]
    try:
        frames = _write_rows(proc, partial, columns, bad_rows, unaligned)
    except BaseException:
        # Stopped, the daemon gone, a parse error: tshark goes too, and nothing half-written stays.
        proc.kill()
        proc.wait()
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if bad_rows:
        proc.kill()
    proc.wait()
    stderr = _tail(partial / "tshark.stderr")
    (partial / "tshark.stderr").unlink()
    messages = [x for x in stderr.splitlines() if x and not x.startswith("Running as user")]
    failure = _failure(proc.returncode, frames, messages, bad_rows)
    if failure is not None:
        shutil.rmtree(partial, ignore_errors=True)
        raise SystemExit(failure)
    tables_failed = _tables().write_tables(partial)
    version = subprocess.run([argv[0], "-v"], capture_output=True, text=True, check=False).stdout
    meta = {"schema_version": schema_version, "frames": frames,
            "tshark_version": (version.splitlines() or ["unknown"])[0].strip(),
            "build_s": round(time.monotonic() - started, 3),
            "built_at": time.time(), "tshark_argv": argv, "warnings": messages[-5:],
            "bytes": sum(f.stat().st_size for f in partial.iterdir() if f.suffix == ".parquet"),
            # Frames whose layers' fields could not be aligned, per protocol: its tables are not answered.
            "unaligned": {layer: {"frames": found[0], "first": found[1:]} for layer, found in unaligned.items()},
            # Why the conversation and endpoint tables are missing (a DuckDB failure: memory); null: written.
            "tables_failed": tables_failed}
    (partial / META_FILE).write_text(json.dumps(meta))
    (partial / LOCK_FILE).unlink()
    return _publish(partial, out, meta)


def _tables() -> ModuleType:
    """tables.py beside this script, loaded by path (a script of its own imports nothing of diagd)."""
    spec = importlib.util.spec_from_file_location("diagd_index_tables", Path(__file__).with_name("tables.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_rows(proc: subprocess.Popen[bytes], partial: Path, columns: list[tuple[str, str, bool]],
                bad_rows: list[str], unaligned: dict[str, list[int]]) -> int:
    """tshark's rows, block by block, as Parquet row groups: the frames in FRAMES_FILE (a field of
    many occurrences as a list), their network and transport layers in tables.LAYERS_FILE; how many
    frames. A row with more or fewer cells than columns is noted in `bad_rows` and ends the reading."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as csv
    import pyarrow.parquet as pq

    tables = _tables()
    kinds = {"int64": pa.int64(), "float64": pa.float64(), "string": pa.string()}
    many = {name for name, _, listed in columns if listed}
    types = {name: pa.list_(kinds[kind]) if name in many else kinds[kind] for name, kind, _ in columns}
    names = [name for name, _, _ in columns]
    # Read as text: every occurrence of a field of many (joined by the aggregator), and the relative
    # time, kept to the nanosecond as an integer (tables.rel_ns).
    as_text = {*many, "rel_ns"}
    read_types = {name: pa.string() if name in as_text else types[name] for name in names}
    layer_schema = pa.schema([(name, kinds[kind]) for name, kind, _ in tables.LAYER_COLUMNS])

    def invalid(row: Any) -> str:
        bad_rows.append(f"{row.expected_columns} cells expected, {row.actual_columns} found: {row.text[:200]!r}")
        return "skip"

    def typed(batch: Any, name: str) -> Any:
        cells = batch.column(name)
        if name == "rel_ns":
            return pa.array([None if t is None else tables.rel_ns(t) for t in cells.to_pylist()], pa.int64())
        if name in many:
            cells = pc.split_pattern(cells, tables.AGGREGATOR)
        return cells.cast(types[name])

    def layers(batch: Any) -> Any:
        got = batch.select(["number", "protocols", "length", "rel_ns", "expert_severities",
                            *tables.LAYERED]).to_pydict()
        rows = list(tables.batch_layers(got["number"], got["protocols"], got["length"], got["rel_ns"],
                                        got["expert_severities"], {c: got[c] for c in tables.LAYERED}, unaligned))
        cells = list(zip(*rows, strict=True)) if rows else [()] * len(layer_schema)
        return pa.table([pa.array(c, type=f.type) for c, f in zip(cells, layer_schema, strict=True)],
                        schema=layer_schema)

    assert proc.stdout is not None
    frames = 0
    schema = pa.schema([(name, types[name]) for name in names])
    try:
        reader = csv.open_csv(
            proc.stdout,
            read_options=csv.ReadOptions(column_names=names, block_size=BLOCK_BYTES),
            parse_options=csv.ParseOptions(delimiter="\t", quote_char=False, double_quote=False,
                                           escape_char=False, newlines_in_values=False,
                                           invalid_row_handler=invalid),
            convert_options=csv.ConvertOptions(column_types=read_types, null_values=[""], strings_can_be_null=True,
                                               quoted_strings_can_be_null=True))
        with pq.ParquetWriter(partial / FRAMES_FILE, schema, compression="zstd") as writer, \
                pq.ParquetWriter(partial / tables.LAYERS_FILE, layer_schema, compression="zstd") as layered:
            for batch in reader:
                if bad_rows:
                    break
                typed_batch = pa.record_batch([typed(batch, n) for n in names], schema=schema)
                writer.write_batch(typed_batch)
                layered.write_table(layers(typed_batch))
                frames += batch.num_rows
                # The daemon reads this; if it died, the write fails (BrokenPipeError) and the build ends.
                print(json.dumps({"frames": frames}), flush=True)
    except pa.ArrowInvalid as exc:
        if "Empty CSV file" not in str(exc):
            raise
        pq.write_table(pa.table({name: pa.array([], types[name]) for name in names}), partial / FRAMES_FILE)
        pq.write_table(layer_schema.empty_table(), partial / tables.LAYERS_FILE)
    return frames


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
    if len(args) < 5 or args[3] != "--":
        sys.stderr.write("usage: build.py OUT_DIR COLUMNS_JSON SCHEMA_VERSION -- TSHARK_ARGV...\n")
        return 2
    columns = [(str(name), str(kind), bool(many)) for name, kind, many in json.loads(args[1])]
    meta = build(Path(args[0]), args[4:], columns, int(args[2]))
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
