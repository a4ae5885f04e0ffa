"""Dump/vmlinux identity from headers: match, refusals, formats, session keys."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from diagd.actors.crash import identity as ident
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.fixtures.vmcore import build, fake_elf_core, fake_vmlinux

BUILD_ID = bytes.fromhex("3b43fad5034874490492495d552c0af6a5fab235")
INFO = f"OSRELEASE=6.1.0-56-cloud-amd64\nBUILD-ID={BUILD_ID.hex()}\nPAGESIZE=4096\nKERNELOFFSET=2a400000\n"


def test_a_matching_pair_is_accepted_by_build_id_and_release(tmp_path: Path) -> None:
    dump = ident.read_dump_info(fake_elf_core(tmp_path / "vmcore", INFO))
    vml = ident.read_vmlinux_info(fake_vmlinux(tmp_path / "vmlinux", release="6.1.0-56-cloud-amd64", build_id=BUILD_ID))
    assert dump.format == "elf" and dump.osrelease == "6.1.0-56-cloud-amd64" and dump.build_id == BUILD_ID.hex()
    assert vml.osrelease == "6.1.0-56-cloud-amd64" and vml.build_id == BUILD_ID.hex() and vml.has_debug_info
    notes = ident.check_match(dump, vml)
    assert any("build id" in n for n in notes) and any("release" in n for n in notes)


def test_another_release_is_refused_with_both_names(tmp_path: Path) -> None:
    dump = ident.read_dump_info(fake_elf_core(tmp_path / "vmcore", INFO))
    vml = ident.read_vmlinux_info(fake_vmlinux(tmp_path / "vmlinux", release="5.10.0-99-amd64", build_id=None))
    with pytest.raises(DiagdError) as err:
        ident.check_match(dump, vml)
    assert err.value.code == ErrorCode.INVALID_ARGUMENT and err.value.details["reason"] == "vmlinux_mismatch"
    assert "5.10.0-99-amd64" in err.value.message and "6.1.0-56-cloud-amd64" in err.value.message


def test_the_same_release_from_another_build_is_refused_by_build_id(tmp_path: Path) -> None:
    dump = ident.read_dump_info(fake_elf_core(tmp_path / "vmcore", INFO))
    vml = ident.read_vmlinux_info(fake_vmlinux(tmp_path / "vmlinux", release="6.1.0-56-cloud-amd64",
                                               build_id=bytes(20)))
    with pytest.raises(DiagdError, match="build id"):
        ident.check_match(dump, vml)


def test_a_vmlinux_without_dwarf_and_a_dump_without_vmcoreinfo_are_refused(tmp_path: Path) -> None:
    dump = ident.read_dump_info(fake_elf_core(tmp_path / "vmcore", INFO))
    stripped = ident.read_vmlinux_info(fake_vmlinux(tmp_path / "v1", release="6.1.0-56-cloud-amd64",
                                                    build_id=BUILD_ID, debug_info=False))
    with pytest.raises(DiagdError, match="no DWARF"):
        ident.check_match(dump, stripped)
    bare = ident.read_dump_info(fake_elf_core(tmp_path / "bare", ""))
    good = ident.read_vmlinux_info(fake_vmlinux(tmp_path / "v2", release="6.1.0-56-cloud-amd64", build_id=BUILD_ID))
    with pytest.raises(DiagdError, match="no VMCOREINFO"):
        ident.check_match(bare, good)


def test_non_dumps_and_the_flattened_format_are_refused(tmp_path: Path) -> None:
    (tmp_path / "text").write_text("hello")
    with pytest.raises(DiagdError, match="not a kernel dump"):
        ident.read_dump_info(tmp_path / "text")
    (tmp_path / "flat").write_bytes(b"makedumpfile" + bytes(4096))
    with pytest.raises(DiagdError) as err:
        ident.read_dump_info(tmp_path / "flat")
    assert "makedumpfile -R" in err.value.details["fix"]


def test_the_live_kernel_is_never_a_dump() -> None:
    assert ident.is_forbidden_source(Path("/proc/kcore"))
    assert ident.is_forbidden_source(Path("/dev/mem"))
    assert not ident.is_forbidden_source(Path("/var/tmp/vmcore"))


def test_session_keys_follow_the_crash_the_kernel_and_the_options(tmp_path: Path) -> None:
    vml_path = fake_vmlinux(tmp_path / "vmlinux", release="6.1.0-56-cloud-amd64", build_id=BUILD_ID)
    vml, vml_id = ident.read_vmlinux_info(vml_path), ident.stat_identity(vml_path)
    one = ident.read_dump_info(fake_elf_core(tmp_path / "a", INFO))
    again = ident.read_dump_info(tmp_path / "a")
    other_boot = ident.read_dump_info(fake_elf_core(tmp_path / "b", INFO.replace("2a400000", "1c000000")))
    key = ident.session_key(one, vml, vml_id, [])
    assert ident.session_key(again, vml, vml_id, []) == key
    assert ident.session_key(other_boot, vml, vml_id, []) != key
    assert ident.session_key(one, vml, vml_id, ["--hex"]) != key


def test_the_real_fixture_is_kdump_compressed_and_matches_its_vmlinux() -> None:
    fixture = build()  # cached, or built now (skips only where it cannot be built at all)
    dump = ident.read_dump_info(fixture.vmcore)
    vml = ident.read_vmlinux_info(fixture.vmlinux)
    assert dump.format == "kdump" and dump.osrelease == fixture.release == vml.osrelease
    assert dump.build_id and dump.build_id == vml.build_id
    assert "KERNELOFFSET" in dump.vmcoreinfo
    ident.check_match(dump, vml)


def test_the_same_dump_through_a_copy_a_hard_link_or_a_symlink_has_one_key(tmp_path: Path) -> None:
    vml_path = fake_vmlinux(tmp_path / "vmlinux", release="6.1.0-56-cloud-amd64", build_id=BUILD_ID)
    vml, vml_id = ident.read_vmlinux_info(vml_path), ident.stat_identity(vml_path)
    original = fake_elf_core(tmp_path / "vmcore", INFO)
    copy = tmp_path / "copy"
    copy.write_bytes(original.read_bytes())
    os.utime(copy, (1, 1))  # another inode, another mtime: still the same crash
    hard = tmp_path / "hard"
    os.link(copy, hard)
    soft = tmp_path / "soft"
    soft.symlink_to(original)
    key = ident.session_key(ident.read_dump_info(original), vml, vml_id, [])
    for other in (copy, hard, soft):
        assert ident.session_key(ident.read_dump_info(other), vml, vml_id, []) == key, other


def test_a_dump_that_differs_only_past_its_headers_has_another_key(tmp_path: Path) -> None:
    vml_path = fake_vmlinux(tmp_path / "vmlinux", release="6.1.0-56-cloud-amd64", build_id=BUILD_ID)
    vml, vml_id = ident.read_vmlinux_info(vml_path), ident.stat_identity(vml_path)
    base = fake_elf_core(tmp_path / "vmcore", INFO).read_bytes() + bytes(200_000)
    (tmp_path / "a").write_bytes(base)
    (tmp_path / "b").write_bytes(base[:-1] + b"\x01")  # same headers and notes, another last page
    (tmp_path / "c").write_bytes(base[:-4096])  # truncated
    keys = {ident.session_key(ident.read_dump_info(tmp_path / n), vml, vml_id, []) for n in "abc"}
    assert len(keys) == 3
