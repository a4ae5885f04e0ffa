"""The [pcap] config table: where captures may be read and exports written, limits, decoding profiles."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from diagd.actors.runtime import BackendConfig
from diagd.actors.settings import parse_table, refuse, setting

BUILTIN_PROFILES: dict[str, dict[str, Any]] = {
    # The decoding these lab captures need (see tests/pcaps facts): SBI HTTP/2 on 7777 and
    # NAS after Security Mode Command "ciphered" with NEA0.
    "5gc-lab": {"decode_as": ["tcp.port==7777,http2"], "preferences": {"nas-5gs.null_decipher": "TRUE"}},
}


@dataclass(frozen=True)
class PcapSettings:
    allowed_dirs: tuple[str, ...] = ()  # default: [daemon] allowed_dirs
    output_dir: Path = Path("exports")  # default: $state/pcap/exports
    max_loaded: int = setting(4, positive=True)
    # The sharkd workers of all loaded captures together (their RSS): beyond it the least recently
    # used capture is stopped, and a busy capture gets no second worker that would not fit.
    max_memory_mb: int = setting(4096, positive=True)
    # The persistent indexes under $state/pcap/index (pcap_index): beyond it the least recently used go.
    index_max_mb: int = setting(20480, positive=True)
    # A capture bigger than this is indexed by one tshark pass per chunk of about this size, stitched
    # (index/stitch.py): tshark's memory grows with what it reads (~3 MB a MB of dense user plane).
    index_chunk_mb: int = setting(128, positive=True)
    # Frames per file of an index's frames table (index/build.py): a building index answers from the files
    # closed so far (one is closed at this many frames, or after 15 s); more files, more for a query to open.
    index_segment_frames: int = setting(1 << 20, positive=True)
    workers_per_capture: int = setting(2, positive=True)  # at most; also never more than the cores
    idle_timeout_s: float = setting(900.0, positive=True)
    # A tshark started ahead of need answers a fresh capture's first page without tshark's start-up
    # (standby.py): ~66 MB while it waits, per early-pass argv in use (3 at most), gone after
    # idle_timeout_s unused.
    warm_tshark: bool = True
    max_exports: int = setting(50, positive=True)
    mask_subscriber_ids: bool = False
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)  # [pcap.profiles.<name>], + BUILTIN_PROFILES
    packet_list_columns: tuple[dict[str, str], ...] = setting((), items=dict)

    @classmethod
    def from_config(cls, config: BackendConfig, state_dir: Path) -> PcapSettings:
        parsed = parse_table(cls, "pcap", config.table, inherited={"allowed_dirs": config.allowed_dirs,
                                                                    "output_dir": state_dir / "exports"})
        for name, prof in parsed.profiles.items():
            if not isinstance(prof, dict):
                raise refuse("pcap", f"profiles.{name}", "must be a table")
        return replace(parsed, profiles={**BUILTIN_PROFILES, **parsed.profiles})
