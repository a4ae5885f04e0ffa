"""views.complete_prefix on a real pcapng cut at every kind of place (inside a block's header, its body,
its trailing length, exactly between blocks): the prefix it keeps is what capinfos reads whole, and its
packet count is capinfos' count of that prefix (and of the frames wholly inside the cut)."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pytest

from diagd.actors.capture.views import complete_prefix
from tests.pcaps import pcap


def capinfos_count(path: Path) -> int:
    done = subprocess.run(["capinfos", "-M", "-c", "-T", "-r", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr  # whole: no "cut short in the middle of a packet"
    return int(done.stdout.split("\t")[-1])


@pytest.mark.parametrize("name", ["magma_inbound_roaming_01.pcapng", "heplify_erspan_sip_ipv4_udp.pcapng"])
def test_the_complete_prefix_of_a_growing_file_is_whole_and_counted(name: str, tmp_path: Path) -> None:
    data = Path(pcap(name)).read_bytes()
    whole, packets = complete_prefix(io.BytesIO(data), len(data))
    assert whole == len(data) and packets == capinfos_count(Path(pcap(name)))
    for cut in sorted({12, 27, 28, 29, len(data) // 3, len(data) // 3 + 1, len(data) // 2 + 7, len(data) - 4,
                       len(data) - 1}):
        length, counted = complete_prefix(io.BytesIO(data[:cut]), cut)
        assert length <= cut and length % 4 == 0
        if length == 0:
            continue
        prefix = tmp_path / f"cut-{cut}.pcapng"
        prefix.write_bytes(data[:length])
        assert counted == capinfos_count(prefix), cut
        assert complete_prefix(io.BytesIO(data[:length]), length) == (length, counted)  # cut between blocks


def test_a_file_that_is_no_pcapng_has_no_complete_block() -> None:
    junk = b"\x00\x00\x00\x00" * 8
    assert complete_prefix(io.BytesIO(junk), len(junk)) == (0, 0)
