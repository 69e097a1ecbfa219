"""The ``libcuda.so`` link stub for FlashInfer's ``-lcuda`` (0.6.7 - 0.7.4), absent from the CUDA 13 wheels, written
without a C compiler: the smallest ELF64 shared object with ``SONAME libcuda.so.1`` and ``cuda.h``'s driver API."""

from __future__ import annotations

import glob
import hashlib
import os
import re
import struct
import sys

from flashinfer_sm120.errors import FormatError, ViewError
from flashinfer_sm120.safety.formats.reads import read_bytes

#: The ``SONAME`` of the driver library that ``-lcuda`` must record.
SONAME = "libcuda.so.1"

_EHDR = 64  # sizes of ELF64 structures (bytes)
_PHDR = 56
_SHDR = 64
_SYM = 24
_DYN = 16


def elf_ident(paths: list[str]) -> tuple[str, int, int] | None:
    """``(byte order '<' or '>', e_machine, e_flags)`` of the first 64-bit ELF in ``paths``, or ``None``."""
    for path in paths:
        try:  # never a blocking open: a FIFO named libcudart.so.13 hung the view build
            head = read_bytes(path, _EHDR, prefix=True)
        except FormatError:
            continue
        if len(head) < _EHDR or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] not in (1, 2):
            continue
        order = "<" if head[5] == 1 else ">"
        machine = struct.unpack_from(order + "H", head, 18)[0]
        flags = struct.unpack_from(order + "I", head, 48)[0]
        return order, machine, flags
    return None


def _align(n: int, a: int = 8) -> int:
    return (n + a - 1) // a * a


def _elf_hash(name: bytes) -> int:
    h = 0
    for c in name:
        h = ((h << 4) + c) & 0xFFFFFFFF
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    return h


_API_RE = re.compile(r"\bCUDAAPI\s+(cu[A-Za-z]\w*)\s*\(")
#: Blanks within the line only: ``\s`` crossed newlines (quadratic on a ``cuda.h`` of blank lines, P6).
_VERSIONED_RE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+cu\w+[ \t]+(cu\w+)[ \t]*$", re.MULTILINE)
_PER_THREAD_RE = re.compile(r"__CUDA_API_PT(DS|SZ)\((cu\w+)\)")


def driver_symbols(cuda_h: str | None) -> list[str]:
    """Every driver API name ``cuda.h`` may make code reference (``CUDAAPI cuX(``, ``#define cuX cuX_v2``, ``_ptds``),
    without which ``ld --as-needed`` drops ``NEEDED libcuda.so.1``; empty when it is absent or unreadable."""
    if not cuda_h:
        return []
    try:
        text = read_bytes(cuda_h, 16 << 20, prefix=True).decode("utf-8", "replace")
    except FormatError:
        return []
    names = set(_API_RE.findall(text)) | set(_VERSIONED_RE.findall(text))
    names |= {f"{n}_pt{kind.lower()}" for kind, n in _PER_THREAD_RE.findall(text)}
    return sorted(names)


def stub_bytes(order: str, machine: int, flags: int, symbols: list[str]) -> bytes:
    """An ELF64 link stub: :data:`SONAME`, ``symbols`` as functions at one address; deterministic, checked byte for
    byte (P2)."""
    names = [s.encode() for s in symbols]
    dynstr = b"\0" + SONAME.encode() + b"\0"
    name_off = []
    for n in names:
        name_off.append(len(dynstr))
        dynstr += n + b"\0"
    nsym = len(names) + 1
    nbucket = max(1, nsym // 2 | 1)
    buckets, chains = [0] * nbucket, [0] * nsym
    for i, n in enumerate(names, start=1):
        b = _elf_hash(n) % nbucket
        chains[i], buckets[b] = buckets[b], i
    hash_tab = struct.pack(f"{order}{2 + nbucket + nsym}I", nbucket, nsym, *buckets, *chains)
    text = b"\0" * 16
    secs = [(".hash", 5, 2, hash_tab, 8, 4), (".dynsym", 11, 2, None, 8, _SYM),
            (".dynstr", 3, 2, dynstr, 1, 0), (".text", 1, 6, text, 16, 0),
            (".dynamic", 6, 3, None, 8, _DYN), (".shstrtab", 3, 0, None, 1, 0)]
    shstr = b"\0" + b"".join(s[0].encode() + b"\0" for s in secs)
    # offsets: headers, then each section in order (vaddr == file offset)
    off, offs = _EHDR + 2 * _PHDR, {}
    sizes = {".hash": len(hash_tab), ".dynsym": nsym * _SYM, ".dynstr": len(dynstr), ".text": len(text),
             ".dynamic": 7 * _DYN, ".shstrtab": len(shstr)}
    for name, _t, _f, _d, align, _e in secs:
        off = _align(off, align)
        offs[name] = off
        off += sizes[name]
    off_sh = _align(off)
    text_ndx = 4  # section index of .text (0 is the null section)
    dynsym = b"\0" * _SYM + b"".join(
        struct.pack(order + "IBBHQQ", no, (1 << 4) | 2, 0, text_ndx, offs[".text"], 0)  # GLOBAL FUNC
        for no in name_off)
    dt = [(14, 1), (4, offs[".hash"]), (5, offs[".dynstr"]), (6, offs[".dynsym"]), (10, len(dynstr)),
          (11, _SYM), (0, 0)]  # DT_SONAME, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT, DT_NULL
    dynamic = b"".join(struct.pack(order + "qQ", tag, val) for tag, val in dt)
    data = {".hash": hash_tab, ".dynsym": dynsym, ".dynstr": dynstr, ".text": text, ".dynamic": dynamic,
            ".shstrtab": shstr}
    load_end = offs[".dynamic"] + len(dynamic)

    ident = b"\x7fELF" + bytes([2, 1 if order == "<" else 2, 1, 0]) + b"\0" * 8
    ehdr = ident + struct.pack(order + "HHIQQQIHHHHHH", 3, machine, 1, 0, _EHDR, off_sh, flags,
                               _EHDR, _PHDR, 2, _SHDR, len(secs) + 1, len(secs))
    phdrs = (struct.pack(order + "IIQQQQQQ", 1, 7, 0, 0, 0, load_end, load_end, 0x1000)  # PT_LOAD, RWX
             + struct.pack(order + "IIQQQQQQ", 2, 6, offs[".dynamic"], offs[".dynamic"], offs[".dynamic"],
                           len(dynamic), len(dynamic), 8))  # PT_DYNAMIC, RW
    link = {".hash": 2, ".dynsym": 3, ".dynamic": 3}
    shdrs = b"\0" * _SHDR
    for name, typ, flg, _d, align, entsize in secs:
        addr = offs[name] if flg & 2 else 0
        shdrs += struct.pack(order + "IIQQQQIIQQ", shstr.index(name.encode() + b"\0"), typ, flg, addr,
                             offs[name], sizes[name], link.get(name, 0), 1 if name == ".dynsym" else 0,
                             align, entsize)
    body = bytearray(ehdr + phdrs)
    for name, *_ in secs:
        body += b"\0" * (offs[name] - len(body)) + data[name]
    body += b"\0" * (off_sh - len(body)) + shdrs
    return bytes(body)


def write_stub(dest: str, lib_dirs: list[str], cuda_h: str | None = None) -> str:
    """Create the stub ``dest`` for the ELF kind of ``lib_dirs``' ``libcudart.so*`` (else this Python); its SHA-256."""
    ident = elf_ident([p for d in lib_dirs for p in sorted(glob.glob(os.path.join(glob.escape(d), "libcudart.so*")))]
                      + [os.path.realpath(sys.executable), "/proc/self/exe"])
    if ident is None:
        raise ViewError("cannot write the libcuda.so link stub for FlashInfer's -lcuda: neither the toolkit's "
                        "libcudart.so* nor this Python is a 64-bit ELF file. Fix: install the CUDA toolkit's "
                        "own lib64/stubs/libcuda.so")
    data = stub_bytes(*ident, driver_symbols(cuda_h))
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return hashlib.sha256(data).hexdigest()
