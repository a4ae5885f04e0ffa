"""The index store (actors/pcap/index/store.py): what counts as an index, the file-version lookup a
restarted daemon uses instead of hashing, and the disk budget's least-recently-used eviction."""

from __future__ import annotations

import json
import os
from pathlib import Path

from diagd.actors.pcap.index.build import META_FILE
from diagd.actors.pcap.index.schema import SCHEMA_VERSION
from diagd.actors.pcap.index.store import IndexStore, decoding_digest
from diagd.actors.pcap.index.tables import FRAMES_DIR


def name(c: str) -> str:
    """An index's folder name: <sha256>-<decoding> (store.NAME)."""
    return c * 64 + "-" + "0" * 12


def index_at(path: Path, size: int, used_at: float, version: int = SCHEMA_VERSION) -> Path:
    path.mkdir(parents=True)
    (path / FRAMES_DIR).mkdir()
    (path / FRAMES_DIR / "000000000001.parquet").write_bytes(b"x" * size)
    (path / META_FILE).write_text(json.dumps({"schema_version": version, "frames": 1, "bytes": size, "built_at": 0}))
    os.utime(path / META_FILE, (used_at, used_at))
    return path


def test_an_index_of_another_schema_or_half_written_is_none(tmp_path: Path) -> None:
    store = IndexStore(tmp_path, 10**9)
    whole = index_at(tmp_path / name("a"), 10, 1000)
    old = index_at(tmp_path / name("b"), 10, 1000, version=SCHEMA_VERSION - 1)
    (tmp_path / f"{name('c')}.partial-x").mkdir()
    assert store.ready(whole) is not None and store.ready(old) is None
    assert store.ready(tmp_path / f"{name('c')}.partial-x") is None and store.ready(tmp_path / "nothing") is None
    assert [s.path.name for s in store.listing()] == [name("a")]


def test_a_file_version_finds_its_index_without_hashing_until_the_index_goes(tmp_path: Path) -> None:
    store = IndexStore(tmp_path, 10**9)
    path = index_at(tmp_path / name("d"), 10, 1000)
    assert store.by_identity("1:2:3:4", "dec") is None
    store.remember("1:2:3:4", "dec", path)
    assert store.by_identity("1:2:3:4", "dec") == path
    assert store.by_identity("1:2:3:4", "other decoding") is None and store.by_identity("1:2:3:5", "dec") is None
    (path / META_FILE).unlink()
    assert store.by_identity("1:2:3:4", "dec") is None


def test_the_least_recently_used_go_until_the_rest_fit_never_the_one_kept(tmp_path: Path) -> None:
    oldest = index_at(tmp_path / name("a"), 100, 1000)
    serving = index_at(tmp_path / name("b"), 100, 1500)  # a running actor answers from it
    newest = index_at(tmp_path / name("c"), 100, 3000)
    kept = index_at(tmp_path / name("d"), 100, 500)  # the oldest use, but the one just built
    each = sum(f.stat().st_size for f in oldest.rglob("*") if f.is_file())  # its files, meta.json too
    store = IndexStore(tmp_path, 2 * each + each // 2)  # room for two of the four
    assert store.evict(keep=kept, in_use=frozenset({serving})) == [name("a"), name("c")]
    assert not oldest.exists() and serving.exists() and not newest.exists() and kept.exists()
    assert store.evict(keep=kept) == []
    # What answers keep beside an index (its NGAP PDUs) counts too: now over the budget, the older goes.
    (kept / "ngap-pdus-x.pickle").write_bytes(b"x" * each)
    assert store.evict(keep=kept) == [name("b")] and kept.exists()


def test_the_decoding_key_changes_with_every_input() -> None:
    base = decoding_digest([], [], "tshark:1:2")
    assert len({base, decoding_digest(["tcp.port==7777,http2"], [], "tshark:1:2"),
                decoding_digest([], [("nas-5gs.null_decipher", "TRUE")], "tshark:1:2"),
                decoding_digest([], [], "tshark:1:3")}) == 4
