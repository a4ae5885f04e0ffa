"""What the daemon's Wireshark has said, kept in one object the pcap back end owns and passes down.

A `Wireshark` holds the facts of one tshark version that cost a run of its programs to learn: the field
catalogue (`tshark -G`, read once: wireshark.read_catalogue), what capinfos said of each file version and
the counts running (tshark.Capinfos), and what each file version's TCP conversations carry, for the
decode-as rules (decode_check.Probes). `PcapBackend` makes one (`PcapBackend.wireshark`) and hands it to
its tools, its captures' sessions and its warm tsharks; none of it lives in a module
(tests/test_module_state.py), so two daemons in one process, or two tests, each learn their own.
"""

from __future__ import annotations

from pathlib import Path

import trio

from diagd.actors.pcap.shark.decode_check import Probes
from diagd.actors.pcap.shark.tshark import Capinfos
from diagd.actors.pcap.shark.wireshark import Catalogue, read_catalogue


class Wireshark:
    """The facts of the daemon's tshark: its catalogue, capinfos' counts, the decode-as probes."""

    def __init__(self, kept: Path | None = None) -> None:
        """`kept`: where facts that outlive the daemon are kept (the probes: a pass over the whole file)."""
        self._catalogue: Catalogue | None = None
        self._reading = trio.Lock()  # one read of the catalogue: a call that comes meanwhile waits for it
        self.capinfos = Capinfos()
        self.probes = Probes(kept / "probes" if kept is not None else None)

    async def catalogue(self) -> Catalogue:
        """Wireshark's fields, protocols and version: read on first use (seconds), then kept."""
        async with self._reading:
            if self._catalogue is None:
                self._catalogue = await read_catalogue()
        return self._catalogue
