"""Which kernel a dump and a vmlinux belong to, read from their headers only (no crash, no drgn).

A vmcore names its kernel in the VMCOREINFO note (`OSRELEASE=`, and since Linux 5.9 `BUILD-ID=`);
a vmlinux carries its GNU build id in `.notes` and its release in `linux_banner`. Comparing them
before anything is spawned refuses the wrong vmlinux with a clear message, instead of crash's
"... do not match!" seconds later or drgn's silent "ObjectNotFoundError".

Formats read: ELF cores (QEMU dump-guest-memory, /proc/vmcore copies, `makedumpfile -E`) and
kdump-compressed files (`makedumpfile -c/-l/-p`, signature "KDUMP   "). The flattened format
(`makedumpfile -F`, QEMU's own kdump-* formats) is refused with the command that converts it.

The session key hashes what identifies one crash by its content, cheaply: the file's size, its
first 64 KiB (headers, bitmaps), its last 64 KiB, and every note it carries (VMCOREINFO with the
KASLR offset, and CRASHTIME in dumps kdump wrote; the per-CPU PRSTATUS register notes of the crash
itself). No path, inode or mtime goes in: the same dump reached through a copy, a hard link or a
symlink is the same crash and joins the same ~600 MB session. Measured on the 15 MB fixture from
the page cache: 0.25 ms, against 8.9 ms to hash its first 4 MB and 23 ms for the whole file; reading
a 302 MB vmlinux's build id and banner takes 19 ms (both cached per stat identity).
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from diagd.protocol.errors import DiagdError, ErrorCode

ELF_MAGIC = b"\x7fELF"
KDUMP_SIGNATURES = (b"KDUMP   ", b"DISKDUMP")
FLATTENED_SIGNATURE = b"makedumpfile"
NT_GNU_BUILD_ID = 3
PT_NOTE = 4
SHT_NOTE = 7
HEADER_HASH_BYTES = 64 * 1024
MAX_NOTES_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class DumpInfo:
    path: str
    format: str  # "elf" | "kdump"
    vmcoreinfo: dict[str, str]
    fingerprint: str  # sha256 over size, head and tail blocks and notes: the content, not the path
    release_from_header: str | None = None  # kdump header utsname.release

    @property
    def osrelease(self) -> str | None:
        return self.vmcoreinfo.get("OSRELEASE") or self.release_from_header

    @property
    def build_id(self) -> str | None:
        value = self.vmcoreinfo.get("BUILD-ID")
        return value.lower() if value else None


@dataclass(frozen=True)
class VmlinuxInfo:
    path: str
    build_id: str | None
    banner: str | None  # "Linux version 6.1.0-56-cloud-amd64 (debian-kernel@...) ..."
    has_debug_info: bool
    sections: tuple[str, ...] = field(default=(), repr=False)

    @property
    def osrelease(self) -> str | None:
        if self.banner and self.banner.startswith("Linux version "):
            return self.banner.split()[2]
        return None


def stat_identity(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


# ---------------------------------------------------------------------------------------------
# ELF


@dataclass(frozen=True)
class _Elf:
    little: bool
    phoff: int
    phentsize: int
    phnum: int
    shoff: int
    shentsize: int
    shnum: int
    shstrndx: int

    @property
    def end(self) -> str:
        return "<" if self.little else ">"


def _elf_header(head: bytes, path: Path) -> _Elf:
    if len(head) < 64 or head[:4] != ELF_MAGIC:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path} is not an ELF file", path=str(path))
    if head[4] != 2:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path} is a 32-bit ELF file; only 64-bit kernels are supported",
                         path=str(path))
    little = head[5] == 1
    e = "<" if little else ">"
    phoff, shoff = struct.unpack_from(e + "QQ", head, 0x20)
    phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from(e + "HHHHH", head, 0x36)
    return _Elf(little, phoff, phentsize, phnum, shoff, shentsize, shnum, shstrndx)


def parse_notes(data: bytes, little: bool = True) -> list[tuple[str, int, bytes]]:
    """ELF notes as (name, type, desc); stops quietly at a truncated note."""
    e = "<" if little else ">"
    notes: list[tuple[str, int, bytes]] = []
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from(e + "III", data, pos)
        pos += 12
        name_end = pos + namesz
        desc_start = pos + ((namesz + 3) & ~3)
        desc_end = desc_start + descsz
        if desc_end > len(data):
            break
        name = data[pos:name_end].rstrip(b"\0").decode(errors="replace")
        notes.append((name, ntype, data[desc_start:desc_end]))
        pos = desc_start + ((descsz + 3) & ~3)
    return notes


def parse_vmcoreinfo(text: bytes) -> dict[str, str]:
    info: dict[str, str] = {}
    for line in text.decode(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key and key not in info:
            info[key.strip()] = value.strip()
    return info


# ---------------------------------------------------------------------------------------------
# Dumps


def read_dump_info(path: Path) -> DumpInfo:
    """Identify a dump from its headers (blocking: run it in a thread)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        digest = hashlib.sha256(f"size={size}".encode())
        head = f.read(HEADER_HASH_BYTES)
        digest.update(head)
        # The tail tells a complete dump from a truncated or differently filtered one with the same
        # headers (a copy still being written, makedumpfile runs of one crash at other -d levels).
        f.seek(max(0, size - HEADER_HASH_BYTES))
        digest.update(f.read(HEADER_HASH_BYTES))
        if head.startswith(FLATTENED_SIGNATURE):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                             f"{path} is in makedumpfile's flattened format, which drgn cannot read",
                             path=str(path), fix=f"makedumpfile -R {path}.flat < {path}  (then open {path}.flat)")
        if head[:8] in KDUMP_SIGNATURES:
            info, release = _kdump_vmcoreinfo(f, head, path, digest)
            return DumpInfo(str(path), "kdump", info, digest.hexdigest(), release)
        if head[:4] == ELF_MAGIC:
            elf = _elf_header(head, path)
            notes = _elf_core_notes(f, elf, path)
            digest.update(notes)
            vmcoreinfo: dict[str, str] = {}
            for name, _type, desc in parse_notes(notes, elf.little):
                if name == "VMCOREINFO":
                    vmcoreinfo = parse_vmcoreinfo(desc)
            return DumpInfo(str(path), "elf", vmcoreinfo, digest.hexdigest())
    raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                     f"{path} is not a kernel dump (neither an ELF core nor kdump-compressed)", path=str(path),
                     signature=head[:8].hex())


def _elf_core_notes(fh: BinaryIO, elf: _Elf, path: Path) -> bytes:
    if elf.phnum == 0:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path} is an ELF file without program headers, not a core",
                         path=str(path))
    phnum = elf.phnum
    if phnum == 0xFFFF and elf.shoff:  # PN_XNUM: the real count is sh_info of section 0
        fh.seek(elf.shoff)
        phnum = struct.unpack_from(elf.end + "I", fh.read(64), 0x2C)[0]
    fh.seek(elf.phoff)
    table = fh.read(elf.phentsize * phnum)
    blobs = []
    total = 0
    for i in range(phnum):
        p_type, _flags, p_offset = struct.unpack_from(elf.end + "IIQ", table, i * elf.phentsize)
        p_filesz = struct.unpack_from(elf.end + "Q", table, i * elf.phentsize + 32)[0]
        if p_type == PT_NOTE and p_filesz:
            total += p_filesz
            if total > MAX_NOTES_BYTES:
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: implausibly large ELF notes", path=str(path))
            fh.seek(p_offset)
            blobs.append(fh.read(p_filesz))
    return b"".join(blobs)


def _kdump_vmcoreinfo(fh: BinaryIO, head: bytes, path: Path, digest: hashlib._Hash
                      ) -> tuple[dict[str, str], str | None]:
    # struct disk_dump_header: signature[8], header_version, new_utsname (6 x 65), timeval, status,
    # block_size, ... ; kdump_sub_header starts at block_size (makedumpfile's diskdump_mod.h).
    release = head[12 + 65 * 2:12 + 65 * 3].split(b"\0")[0].decode(errors="replace") or None
    block_size = struct.unpack_from("<i", head, 428)[0]
    if block_size <= 0 or block_size & (block_size - 1) or block_size > 1 << 20:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: corrupt kdump header (block size {block_size})",
                         path=str(path))
    fh.seek(block_size)
    sub = fh.read(64)
    if len(sub) < 64:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: truncated kdump header", path=str(path))
    off_info, size_info, off_note, size_note = struct.unpack_from("<qQqQ", sub, 32)
    info: dict[str, str] = {}
    if 0 < size_info <= MAX_NOTES_BYTES and off_info > 0:
        fh.seek(off_info)
        blob = fh.read(size_info)
        digest.update(blob)
        info = parse_vmcoreinfo(blob)
    if 0 < size_note <= MAX_NOTES_BYTES and off_note > 0:
        fh.seek(off_note)
        digest.update(fh.read(size_note))  # PRSTATUS notes: the crash's own registers
    return info, release


# ---------------------------------------------------------------------------------------------
# vmlinux


def read_vmlinux_info(path: Path) -> VmlinuxInfo:
    """Build id, banner and whether DWARF is present (blocking: run it in a thread).

    Reads the section table, `.notes`, `.strtab`/`.symtab` (a few MB on a distribution kernel)
    and 256 bytes of `.rodata`; never the DWARF.
    """
    with open(path, "rb") as f:
        head = f.read(64)
        elf = _elf_header(head, path)
        if not elf.shoff or not elf.shnum:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path} has no section table: not a vmlinux",
                             path=str(path))
        f.seek(elf.shoff)
        table = f.read(elf.shentsize * elf.shnum)
        sections = []
        for i in range(elf.shnum):
            name, stype, _flags, addr, offset, size, link = struct.unpack_from(elf.end + "IIQQQQI", table,
                                                                              i * elf.shentsize)
            sections.append((name, stype, addr, offset, size, link))
        _n, _t, _a, str_off, str_size, _l = sections[elf.shstrndx]
        f.seek(str_off)
        shstr = f.read(str_size)

        def sname(idx: int) -> str:
            return shstr[idx:shstr.index(b"\0", idx)].decode(errors="replace")

        names = [sname(s[0]) for s in sections]
        build_id = None
        for _n, stype, _a, offset, size, _l in sections:
            if stype == SHT_NOTE and size < MAX_NOTES_BYTES:
                f.seek(offset)
                for note_name, ntype, desc in parse_notes(f.read(size), elf.little):
                    if note_name == "GNU" and ntype == NT_GNU_BUILD_ID:
                        build_id = desc.hex()
        banner = _banner(f, elf, sections, names)
    return VmlinuxInfo(str(path), build_id, banner, ".debug_info" in names, tuple(names))


def _banner(fh: BinaryIO, elf: _Elf, sections: list[tuple[int, int, int, int, int, int]],
            names: list[str]) -> str | None:
    if ".symtab" not in names:
        return None
    _n, _t, _a, sym_off, sym_size, link = sections[names.index(".symtab")]
    _n, _t, _a, str_off, str_size, _l = sections[link]
    fh.seek(str_off)
    strtab = fh.read(str_size)
    at = strtab.find(b"\0linux_banner\0")
    if at < 0:
        return None
    name_index = at + 1
    fh.seek(sym_off)
    symtab = fh.read(sym_size)
    for st_name, _info, _other, shndx, value, _size in struct.iter_unpack(elf.end + "IBBHQQ", symtab):
        if st_name == name_index and 0 < shndx < len(sections):
            _n, _t, addr, offset, size, _l = sections[shndx]
            if addr <= value < addr + size:
                fh.seek(offset + value - addr)
                return fh.read(256).split(b"\0")[0].decode(errors="replace").strip() or None
    return None


# ---------------------------------------------------------------------------------------------
# The check


def check_match(dump: DumpInfo, vmlinux: VmlinuxInfo) -> list[str]:
    """Raise INVALID_ARGUMENT unless vmlinux is the dumped kernel's; return notes on how it was decided."""
    details = {"vmcore": dump.path, "vmlinux": vmlinux.path, "vmcore_osrelease": dump.osrelease,
               "vmlinux_osrelease": vmlinux.osrelease, "vmcore_build_id": dump.build_id,
               "vmlinux_build_id": vmlinux.build_id}
    if not vmlinux.has_debug_info:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                         f"{vmlinux.path} has no DWARF (.debug_info): crash and drgn need the debug vmlinux",
                         reason="vmlinux_without_debug_info", **details,
                         hint="Debian: /usr/lib/debug/boot/vmlinux-<release> from linux-image-<release>-dbg")
    if not dump.vmcoreinfo:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                         f"{dump.path} carries no VMCOREINFO note, so its kernel cannot be verified "
                         "(and KASLR cannot be resolved)", reason="no_vmcoreinfo", **details,
                         hint="QEMU dumps need the guest to load qemu_fw_cfg and QEMU to run with -device vmcoreinfo")
    notes = []
    if dump.build_id and vmlinux.build_id:
        # VMCOREINFO holds the build id truncated to what the kernel prints; compare the common prefix.
        n = min(len(dump.build_id), len(vmlinux.build_id))
        if n < 16 or dump.build_id[:n] != vmlinux.build_id[:n]:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                             f"vmlinux does not match the dump: build id {vmlinux.build_id} "
                             f"({vmlinux.osrelease or 'unknown release'}) vs the dumped kernel's {dump.build_id} "
                             f"({dump.osrelease or 'unknown release'})", reason="vmlinux_mismatch", **details)
        notes.append(f"build id {dump.build_id} matches")
    if dump.osrelease and vmlinux.osrelease and dump.osrelease != vmlinux.osrelease:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                         f"vmlinux is {vmlinux.osrelease} but the dumped kernel is {dump.osrelease}",
                         reason="vmlinux_mismatch", **details)
    if dump.osrelease and vmlinux.osrelease:
        notes.append(f"release {dump.osrelease} matches")
    if not notes:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                         "cannot tell whether vmlinux matches the dump: neither a build id nor a release on both sides",
                         reason="unverifiable", **details)
    return notes


def session_key(dump: DumpInfo, vmlinux: VmlinuxInfo, vmlinux_ident: tuple[int, int, int, int],
                crash_args: list[str]) -> str:
    """Same crash + same kernel image + same crash options -> same session, whoever asks."""
    h = hashlib.sha256(dump.fingerprint.encode())
    h.update((vmlinux.build_id or repr(vmlinux_ident)).encode())
    h.update("\0".join(crash_args).encode())
    return h.hexdigest()[:16]


def is_forbidden_source(path: Path) -> bool:
    """The live kernel's memory is never a dump (crash would analyse the running system)."""
    real = os.path.realpath(path)
    return any(real == p or real.startswith(p + "/") for p in ("/proc", "/dev", "/sys"))
