"""Building one index: a child process that runs tshark and writes its rows as Parquet.

`python -P -m diagd.actors.pcap.index.build OUT_DIR -- TSHARK_ARGV...` reads a capture with the given
tshark command (the capture's own: `-r FILE -n -2` and its decode-as rules and preferences, with
`fields_args()` after it), parses its tab-separated rows with Arrow's C++ CSV reader in blocks of
BLOCK_BYTES and writes each as a Parquet row group, so memory stays bounded whatever the capture's
size. It prints one JSON line per row group (`{"frames": N}`: the progress) and a last one with the
metadata; the daemon reads them (actor.py). Another process than the daemon: a build of a 20 GB
capture takes minutes of parsing and writing that must not share the daemon's event loop.

A row tshark printed with more or fewer cells than columns (a value holding a tab would do that)
fails the whole build: an index is exact or absent. Nothing is left at OUT_DIR unless the build ends
well (it is written beside it and renamed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from diagd.actors.pcap.index.schema import COLUMNS, SCHEMA_VERSION

BLOCK_BYTES = 4 << 20  # tshark output parsed per block: ~10-20k rows, one Parquet row group each
FRAMES_FILE = "frames.parquet"
META_FILE = "meta.json"


def fields_args() -> list[str]:
    """What follows the capture's tshark command: the index's fields, one tab-separated row a frame."""
    from diagd.actors.pcap.shark.rows import DEFAULT_COLUMN_PREF

    args = ["-o", DEFAULT_COLUMN_PREF, "-T", "fields", "-E", "header=n", "-E", "occurrence=f"]
    for col in COLUMNS:
        args += ["-e", col.field]
    return args


def _arrow_types() -> dict[str, Any]:
    import pyarrow as pa

    kinds = {"int64": pa.int64(), "float64": pa.float64(), "string": pa.string()}
    return {col.name: kinds[col.kind] for col in COLUMNS}


def build(out: Path, argv: list[str]) -> dict[str, Any]:
    """Run `argv` (tshark with fields_args()), write OUT/frames.parquet and OUT/meta.json."""
    import pyarrow as pa
    import pyarrow.csv as csv
    import pyarrow.parquet as pq

    started = time.monotonic()
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    types = _arrow_types()
    bad_rows: list[str] = []

    def invalid(row: Any) -> str:
        bad_rows.append(f"{row.expected_columns} cells expected, {row.actual_columns} found: {row.text[:200]!r}")
        return "skip"

    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    frames = 0
    try:
        reader = csv.open_csv(
            proc.stdout,
            read_options=csv.ReadOptions(column_names=[c.name for c in COLUMNS], block_size=BLOCK_BYTES),
            parse_options=csv.ParseOptions(delimiter="\t", quote_char=False, double_quote=False, escape_char=False,
                                           newlines_in_values=False, invalid_row_handler=invalid),
            convert_options=csv.ConvertOptions(column_types=types, null_values=[""], strings_can_be_null=True,
                                               quoted_strings_can_be_null=True))
        schema = pa.schema([(c.name, types[c.name]) for c in COLUMNS])
        with pq.ParquetWriter(partial / FRAMES_FILE, schema, compression="zstd") as writer:
            for batch in reader:
                if bad_rows:
                    break
                writer.write_batch(batch)
                frames += batch.num_rows
                print(json.dumps({"frames": frames}), flush=True)
    except pa.ArrowInvalid as exc:
        if "Empty CSV file" not in str(exc):
            raise
        pq.write_table(pa.table({c.name: pa.array([], types[c.name]) for c in COLUMNS}), partial / FRAMES_FILE)
    finally:
        if bad_rows:
            proc.kill()
        stderr = proc.stderr.read().decode(errors="replace")
        proc.wait()
    if bad_rows:
        raise SystemExit(f"tshark printed rows the index cannot hold exactly: {bad_rows[0]}")
    messages = [x for x in stderr.splitlines() if x and not x.startswith("Running as user")]
    if proc.returncode != 0 and not frames:
        raise SystemExit("tshark could not read the capture: " + "\n".join(messages)[-2000:])
    version = subprocess.run([argv[0], "-v"], capture_output=True, text=True, check=False).stdout
    meta = {"schema_version": SCHEMA_VERSION, "frames": frames,
            "tshark_version": (version.splitlines() or ["unknown"])[0].strip(),
            "build_s": round(time.monotonic() - started, 3),
            "built_at": time.time(), "tshark_argv": argv, "warnings": messages[-5:],
            "bytes": (partial / FRAMES_FILE).stat().st_size}
    (partial / META_FILE).write_text(json.dumps(meta))
    shutil.rmtree(out, ignore_errors=True)
    os.rename(partial, out)
    return meta


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: python -m diagd.actors.pcap.index.build OUT_DIR -- TSHARK_ARGV...\n")
        return 2
    meta = build(Path(args[0]), args[2:])
    print(json.dumps({"done": meta}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
