"""A capture's persistent index: one tshark pass over the file written as Parquet, read with DuckDB.

sharkd holds a loaded capture in memory (3.6 GB for a 5 GB file) and forgets it at every restart; an
index is what one two-pass tshark read says of every frame (the packet-list columns and the fields
the questions need), kept under the state directory by the file's sha256 and how it is decoded, so a
capture of any size answers from disk in milliseconds with bounded memory, and again after a restart.

schema.py: the columns and the tshark fields they come from (the documented interchange format);
build.py: the build, a child process of its own (tshark's output parsed by Arrow's C++ CSV reader,
written row group by row group); store.py: where indexes live, their metadata, the disk budget;
query.py: the answers, SQL over the Parquet files.

May import the Wireshark layer below it (shark/: tshark's arguments, the packet-list rows) and
nothing of the engine, the answers or the actor above it.
"""
