"""What the checks of a build (diagnose.verify) read, with bounds (threat-model: P6): a module's ELF headers,
cuobjdump's listings, a ninja log's header, /proc maps."""

from __future__ import annotations

import collections
import os
import re
from typing import Any

from flashinfer_sm120.safety.formats.base import _fail, _type_name, shown
from flashinfer_sm120.safety.formats.reads import _open_regular

_ELF_SECTION_CAP = 1 << 16   # section headers read at most
_ELF_STRTAB_CAP = 8 << 20    # bytes of a string table read at most
_ELF_DYN_CAP = 1 << 14       # dynamic entries read at most
_DT = {1: "needed", 14: "soname", 15: "rpath", 29: "runpath"}  # System V ABI, "Dynamic Section"


#: What :func:`read_elf` read: OSABI, ABI version, ``e_machine`` (190: CUDA), flags, sections, dynamic entries.
ElfInfo = collections.namedtuple("ElfInfo", "path osabi abi_version machine flags sections needed soname rpath")


def _pread(fd: int, size: int, offset: int, file_size: int, what: str, path: str) -> bytes:
    if offset < 0 or size < 0 or offset + size > file_size:
        raise _fail(path, f"{what} lies outside the file (offset {offset}, {size} bytes, file {file_size})",
                    "rebuild it; the file is truncated or not an ELF file")
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise _fail(path, f"{what} could not be read whole", "rebuild it")
    return data


def _cstr(table: bytes, offset: int) -> str:
    if not 0 <= offset < len(table):
        return ""
    end = table.find(b"\0", offset, offset + 4096)
    return table[offset: end if end >= 0 else offset + 4096].decode("utf-8", "replace")


def read_elf(path: str | os.PathLike) -> ElfInfo:
    """The header, sections and dynamic entries of a 64-bit ELF file, every offset checked (P6)."""
    import struct

    path = os.fspath(path)
    fd, st = _open_regular(path, "")
    try:
        size = st.st_size
        head = _pread(fd, 64, 0, size, "the ELF header", path) if size >= 64 else b""
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] not in (1, 2):
            raise _fail(path, "is not a 64-bit ELF file", "")
        o = "<" if head[5] == 1 else ">"
        machine, = struct.unpack_from(o + "H", head, 18)
        shoff, = struct.unpack_from(o + "Q", head, 40)
        flags, = struct.unpack_from(o + "I", head, 48)
        shentsize, shnum, shstrndx = struct.unpack_from(o + "HHH", head, 58)
        sections: dict[str, tuple[int, int, int]] = {}
        raw: list[tuple[int, int, int, int, int]] = []  # name offset, type, offset, size, link
        if shoff:
            if shentsize != 64:
                raise _fail(path, f"has {shentsize}-byte section headers, not 64", "")
            first = _pread(fd, 64, shoff, size, "section header 0", path)
            if shnum == 0:  # extended numbering: the count is in section 0's sh_size
                shnum = struct.unpack_from(o + "Q", first, 32)[0]
            if shstrndx == 0xFFFF:
                shstrndx = struct.unpack_from(o + "I", first, 40)[0]
            if shnum > _ELF_SECTION_CAP:
                raise _fail(path, f"has {shnum} sections, more than {_ELF_SECTION_CAP}", "")
            table = _pread(fd, 64 * shnum, shoff, size, "the section header table", path)
            for i in range(shnum):
                name, typ, _f, _a, off, sz, link = struct.unpack_from(o + "IIQQQQI", table, 64 * i)
                raw.append((name, typ, off, sz, link))
        names = b""
        if raw and 0 < shstrndx < len(raw) and raw[shstrndx][1] != 8:  # SHT_NOBITS has no bytes
            names = _pread(fd, min(raw[shstrndx][3], _ELF_STRTAB_CAP), raw[shstrndx][2], size,
                           "the section name table", path)
        for name, typ, off, sz, _link in raw[1:]:
            sections.setdefault(_cstr(names, name), (typ, off, sz))
        dyn: dict[str, list[str]] = {"needed": [], "soname": [], "rpath": [], "runpath": []}
        dyn_sec = next((r for r in raw if r[1] == 6), None)  # SHT_DYNAMIC
        if dyn_sec is not None and 0 < dyn_sec[4] < len(raw):
            strtab = raw[dyn_sec[4]]
            strs = _pread(fd, min(strtab[3], _ELF_STRTAB_CAP), strtab[2], size, "the dynamic string table", path)
            count = min(dyn_sec[3] // 16, _ELF_DYN_CAP)
            entries = _pread(fd, 16 * count, dyn_sec[2], size, "the dynamic section", path)
            for i in range(count):
                tag, val = struct.unpack_from(o + "qQ", entries, 16 * i)
                if tag == 0:
                    break
                if tag in _DT:
                    dyn[_DT[tag]].append(_cstr(strs, val))
    except OSError as exc:
        raise _fail(path, f"cannot be read ({exc.strerror or exc})", "") from None
    finally:
        os.close(fd)
    rpath = tuple(p for v in dyn["rpath"] + dyn["runpath"] for p in v.split(":") if p)
    return ElfInfo(path, head[7], head[8], machine, flags, sections, tuple(dyn["needed"]),
                   dyn["soname"][0] if dyn["soname"] else None, rpath)


def cuda_elf_sm(info: ElfInfo) -> int | None:
    """The SM (``120``) of a cubin's ``e_flags`` (LLVM ``BinaryFormat/ELF.h`` ``EF_CUDA_SM``; no ``a``/``f``)."""
    if info.machine != 190:  # EM_CUDA
        return None
    sm = info.flags & 0xFF if info.abi_version <= 7 else (info.flags >> 8) & 0xFF
    return sm or None


_CUOBJ_LIST_RE = re.compile(r"^(ELF|PTX) file\s+\d+:\s+(\S+)$")
_CUOBJ_TARGET_RE = re.compile(r"\.(sm_[0-9]{2,3}[af]?)\.(?:cubin|ptx)$")
_CUOBJ_ARCH_RE = re.compile(r"^arch = (sm_[0-9]{2,3}[af]?)$")


def _tool_text(text: Any, source: str, cap: int) -> list[str]:
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    if not isinstance(text, str):
        raise _fail(source, f"printed {_type_name(text)}, not text", "")
    if len(text) > cap:
        raise _fail(source, f"printed {len(text)} characters, more than {cap}", "")
    if "Usage  : cuobjdump" in text or "Usage: cuobjdump" in text:
        raise _fail(source, "printed its usage instead of a listing", "use a cuobjdump of CUDA 12 or later")
    return text.splitlines()


def parse_cuobjdump_list(text: Any, source: str) -> list[tuple[str, str]]:
    """``cuobjdump --list-elf --list-ptx`` output as ``[("SASS", "sm_120"), ("PTX", "compute_120a")]``."""
    out = []
    for line in _tool_text(text, source, 4 << 20):
        m = _CUOBJ_LIST_RE.match(line.strip())
        if m:
            t = _CUOBJ_TARGET_RE.search(m.group(2))
            if t:
                kind = "SASS" if m.group(1) == "ELF" else "PTX"
                out.append((kind, t.group(1) if kind == "SASS" else "compute_" + t.group(1)[3:]))
    return out


def parse_cuobjdump_headers(text: Any, source: str) -> list[tuple[str, str]]:
    """The fatbin headers ``cuobjdump FILE`` prints, as exact targets (``sm_120f``), suffix included."""
    out, kind = [], None
    for line in _tool_text(text, source, 16 << 20):
        line = line.strip()
        if line.startswith("Fatbin ") and line.endswith(" code:"):
            kind = {"elf": "SASS", "ptx": "PTX"}.get(line.split()[1])
            continue
        m = _CUOBJ_ARCH_RE.match(line)
        if m and kind:
            out.append((kind, m.group(1) if kind == "SASS" else "compute_" + m.group(1)[3:]))
            kind = None
    return out


def proc_maps_paths(text: Any, source: str) -> set[str]:
    """The file paths mapped in a ``/proc/<pid>/maps`` text of at most 64 MiB (`` (deleted)`` dropped)."""
    if not isinstance(text, str) or len(text) > 64 << 20:
        raise _fail(source, "is not /proc maps text of a sane size", "")
    out = set()
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            out.add(parts[5].removesuffix(" (deleted)"))
    return out


_NINJA_LOG_RE = re.compile(rb"# ninja log v([0-9]{1,4})")


def parse_ninja_log_header(line: Any, source: str, *, fix: str = "") -> int:
    """The format of a ``.ninja_log`` from its first line, ``# ninja log v7`` (ninja ``src/build_log.cc``)."""
    if isinstance(line, str):
        line = line.encode("utf-8", "replace")
    m = _NINJA_LOG_RE.fullmatch(line.rstrip(b"\r\n")) if isinstance(line, (bytes, bytearray)) else None
    if not m:
        raise _fail(source, f"first line {shown(line, 40)} is not a ninja log header such as '# ninja log v7'",
                    fix)
    return int(m.group(1))
