"""The index's Parquet files as a build writes them (build.py): the frames table's files, closed as it
goes (a building index answers from those closed: index/partial.py), and the frames' network and
transport layers (tables.LAYERS_FILE, from which the conversation tables are written at the end).

Loaded by path by the builder, a script that imports nothing of diagd (tables.py is handed in).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

# Rows per Parquet row group: a page reads the groups holding its rows, and every query reads the
# groups' statistics first (a 10 GB capture's 21M frames in 15k-row groups: 89 ms a deep page; 29 ms).
ROW_GROUP_ROWS = 1 << 16
SEGMENT_S = 15.0  # seconds a file of the frames table stays open at most: a building index answers this soon


class Sink:
    """The index's Parquet files being written: the frames (FRAMES_DIR's files, a field of many occurrences
    as a list) and their network and transport layers (tables.LAYERS_FILE), one row group per block."""

    def __init__(self, partial: Path, columns: list[tuple[str, str, bool]], tables: ModuleType,
                 segment_frames: int) -> None:
        import pyarrow as pa

        self.pa = pa
        self.partial = partial
        self.tables = tables  # tables.py (loaded by path by the builder)
        kinds = {"int64": pa.int64(), "float64": pa.float64(), "string": pa.string()}
        self.many = {name for name, _, listed in columns if listed}
        self.types = {name: pa.list_(kinds[kind]) if name in self.many else kinds[kind] for name, kind, _ in columns}
        self.names = [name for name, _, _ in columns]
        self.schema = pa.schema([(name, self.types[name]) for name in self.names])
        self.layer_schema = pa.schema([(name, kinds[kind]) for name, kind, _ in self.tables.LAYER_COLUMNS])
        self.segment_frames = segment_frames
        self.frames = 0
        self.indexed = 0  # frames in closed files of the frames table: what a reader may read now
        self.segments = 0  # files of it begun
        self.chunked = False  # read in chunks (stitch.py): its seam frames are known at the end only
        # Frames whose rows are vouched for: all of one pass's as written (each row final once printed); a
        # chunk's once its frame count is checked (a miscount would have renumbered them wrongly).
        self.vouched = 0
        self.stacks: dict[str, Any] = {}  # frame.protocols texts read so far (tables.stack_of)
        self._batches: list[Any] = []  # frames not written yet (a row group is written whole)
        self._layer_tables: list[Any] = []
        self._in_segment = 0  # frames written to the file being written
        self._opened = 0.0
        self._first: int | None = None  # its first frame's number
        self._number = self.names.index("number")

    def __enter__(self) -> Sink:
        import pyarrow.parquet as pq

        (self.partial / self.tables.FRAMES_DIR).mkdir()
        self._begin_segment()
        self.layered = pq.ParquetWriter(self.partial / self.tables.LAYERS_FILE, self.layer_schema, compression="zstd")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self._flush()
            if exc[0] is None and (self._in_segment or self.segments == 1):
                self._end_segment()  # the last (an empty capture's only file: its table's schema, no row)
                self.vouched = self.frames
                self.say_progress()
            else:  # failed (the folder goes), or begun after the last frame: never a file
                self.writer.close()
                self._writing().unlink(missing_ok=True)  # never hiding why the build failed
        finally:
            self.layered.close()

    def _writing(self) -> Path:
        return self.partial / str(self.tables.FRAMES_DIR) / "next.parquet.writing"

    def _begin_segment(self) -> None:
        import pyarrow.parquet as pq

        self.segments += 1
        self.writer = pq.ParquetWriter(self._writing(), self.schema, compression="zstd")
        self._in_segment, self._opened, self._first = 0, time.monotonic(), None

    def _end_segment(self) -> None:
        """Close the file being written and give it its name: readers now read it (and never a file half
        written: the glob they read matches closed files only)."""
        self.writer.close()
        # Named by its first frame's number (frames come in frame order): a question on a range of frame
        # numbers opens only the files holding it (tables.files_holding).
        os.rename(self._writing(), self._writing().with_name(f"{self._first or 1:012d}.parquet"))
        self.indexed += self._in_segment

    def _flush(self) -> None:
        pa = self.pa
        if self._batches:
            table = pa.Table.from_batches(self._batches, self.schema)
            self.writer.write_table(table, ROW_GROUP_ROWS)
            self._in_segment += table.num_rows
        if self._layer_tables:
            self.layered.write_table(pa.concat_tables(self._layer_tables), ROW_GROUP_ROWS)
        self._batches, self._layer_tables = [], []

    def write(self, batch: Any, layer_rows: list[tuple[Any, ...]]) -> None:
        pa = self.pa
        cells = list(zip(*layer_rows, strict=True)) if layer_rows else [()] * len(self.layer_schema)
        self._layer_tables.append(pa.table([pa.array(c, type=f.type) for c, f in zip(cells, self.layer_schema,
                                                                                     strict=True)],
                                           schema=self.layer_schema))
        self.frames += batch.num_rows
        while batch.num_rows:  # split where a file of the frames table is full
            room = self.segment_frames - self._in_segment - self._pending()
            if self._first is None:
                self._first = int(batch.column(self._number)[0].as_py())
            self._batches.append(batch.slice(0, room))
            batch = batch.slice(room)
            pending = self._pending()
            due = time.monotonic() - self._opened >= SEGMENT_S
            if pending >= ROW_GROUP_ROWS or self._in_segment + pending >= self.segment_frames or due:
                self._flush()
                if self._in_segment >= self.segment_frames or due:
                    self._end_segment()
                    self._begin_segment()
        if not self.chunked:
            self.vouched = self.frames
        self.say_progress()

    def say_progress(self) -> None:
        """One progress line: frames read, and those a reader may read now (in closed files, vouched for)."""
        # The daemon reads this; if it died, the write fails (BrokenPipeError) and the build ends.
        print(json.dumps({"frames": self.frames, "indexed": min(self.indexed, self.vouched),
                          "folder": str(self.partial), "chunked": self.chunked}), flush=True)

    def _pending(self) -> int:
        return sum(b.num_rows for b in self._batches)
