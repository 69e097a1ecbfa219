"""The ``libcuda.so`` link stub of a ``CUDA_HOME`` view, written without a C compiler.

FlashInfer links every JIT module with ``-L$cuda_home/lib64/stubs -lcuda``
(``flashinfer/jit/cpp_ext.py``, ``generate_ninja_build_for_op``, 0.6.7 - 0.7.4).
The linker needs *some* ``libcuda.so`` whose ``SONAME`` is ``libcuda.so.1``: it
records ``NEEDED libcuda.so.1`` and the driver's real library is loaded at run
time, exactly as with NVIDIA's own ``lib64/stubs/libcuda.so``.  The CUDA 13 pip
wheels ship no such stub.

Rather than running a C compiler (whose ``CC`` may hold flags, a launcher such
as ``ccache``, or name nothing), :func:`write_stub` writes the smallest valid
ELF shared object itself: an ELF header copied in class, byte order, machine
and flags from a real library of the toolkit (``libcudart.so.*``) or else from
this Python interpreter, one ``PT_LOAD`` and one ``PT_DYNAMIC`` segment, and the
sections GNU ld, gold and lld read from a shared library (``.hash``,
``.dynsym``, ``.dynstr``, ``.dynamic`` with ``DT_SONAME``).  Like NVIDIA's stub
it defines the driver API functions (names read from the toolkit's
``cuda.h``), so that ``ld --as-needed`` keeps ``NEEDED libcuda.so.1`` for a
module that calls e.g. ``cuTensorMapEncodeTiled``.
Layout per the System V ABI, "Object Files" (ELF-64 Object File Format 1.5).

Only when no 64-bit ELF reference exists (not on any platform CUDA supports) is
a C compiler used: ``$CC`` (plain words under the rule of FlashInfer's compiler
variables), then ``cc``, ``gcc`` and ``clang`` on ``PATH``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
import sys
import tempfile

from flashinfer_sm120.safety import formats
from flashinfer_sm120.errors import ViewError
from flashinfer_sm120.safety.trust import check_executable

__all__ = ["SONAME", "COMPILER_TIMEOUT_S", "driver_symbols", "elf_ident", "stub_bytes", "write_stub"]

#: The ``SONAME`` of the driver library that ``-lcuda`` must record.
SONAME = "libcuda.so.1"

#: Seconds a fallback C compiler may take to build the stub.
COMPILER_TIMEOUT_S = 60.0

_EHDR = 64  # sizes of ELF64 structures (bytes)
_PHDR = 56
_SHDR = 64
_SYM = 24
_DYN = 16


def elf_ident(paths: list[str]) -> tuple[str, int, int] | None:
    """``(byte order '<' or '>', e_machine, e_flags)`` of the first 64-bit ELF in ``paths``.

    Returns ``None`` when none of them is a readable ELF64 file.
    """
    from flashinfer_sm120.safety import formats

    for path in paths:
        try:  # never a blocking open: a FIFO named libcudart.so.13 hung the view build
            head = formats.read_prefix(path, _EHDR)
        except formats.FormatError:
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
    """The System V ABI ``elf_hash`` of a symbol name (for ``.hash``)."""
    h = 0
    for c in name:
        h = ((h << 4) + c) & 0xFFFFFFFF
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    return h


_API_RE = re.compile(r"\bCUDAAPI\s+(cu[A-Za-z]\w*)\s*\(")
#: Blanks within the line only: ``\s`` crossed newlines, and a ``cuda.h`` of blank lines was
#: rescanned from every line start (quadratic: a 16 MiB one hung the view build).
_VERSIONED_RE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+cu\w+[ \t]+(cu\w+)[ \t]*$", re.MULTILINE)
_PER_THREAD_RE = re.compile(r"__CUDA_API_PT(DS|SZ)\((cu\w+)\)")


def driver_symbols(cuda_h: str | None) -> list[str]:
    """Every CUDA driver API function name that ``cuda.h`` may make code reference.

    The names declared ``CUresult CUDAAPI cuX(...)``, the versioned names the
    header's ``#define cuX cuX_v2`` lines map them to, and the per-thread
    default stream variants (``__CUDA_API_PTDS(cuX)`` -> ``cuX_ptds``).  A
    ``-lcuda`` stub must define what a module references, or ``ld
    --as-needed`` (the default of Debian's and Ubuntu's GCC) drops
    ``NEEDED libcuda.so.1`` and the module fails to load with ``undefined
    symbol``.  Empty when ``cuda_h`` is ``None`` or unreadable.
    """
    from flashinfer_sm120.safety import formats

    if not cuda_h:
        return []
    try:
        text = formats.read_prefix(cuda_h, 16 << 20).decode("utf-8", "replace")
    except formats.FormatError:
        return []
    names = set(_API_RE.findall(text)) | set(_VERSIONED_RE.findall(text))
    names |= {f"{n}_pt{kind.lower()}" for kind, n in _PER_THREAD_RE.findall(text)}
    return sorted(names)


def stub_bytes(order: str, machine: int, flags: int = 0, soname: str = SONAME,
               symbols: list[str] | tuple[str, ...] = ()) -> bytes:
    """The bytes of an ELF64 link stub: ``DT_SONAME`` ``soname`` defining ``symbols``.

    Args:
        order: ``'<'`` (little-endian) or ``'>'`` (big-endian).
        machine: ``e_machine`` (62 for x86-64, 183 for AArch64).
        flags: ``e_flags`` (ABI flags, e.g. 2 for the ppc64le ELFv2 ABI).
        soname: the ``SONAME`` to record.
        symbols: global function names to define (all at one address in a tiny
            ``.text``; the stub is only ever read by the linker, never loaded).

    The result is deterministic, so a view can check its stub byte for byte.
    """
    names = [s.encode() for s in symbols]
    dynstr = b"\0" + soname.encode() + b"\0"
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


def _reference_elfs(lib_dirs: list[str]) -> list[str]:
    out = []
    for d in lib_dirs:
        try:
            out += sorted(os.path.join(d, n) for n in os.listdir(d) if n.startswith("libcudart.so"))
        except OSError:
            continue
    return out + [os.path.realpath(sys.executable), "/proc/self/exe"]


def write_stub(dest: str, lib_dirs: list[str], cuda_h: str | None = None) -> str:
    """Write the ``libcuda.so`` link stub at ``dest`` (a new file).

    Args:
        dest: the file to create (``<view>/lib64/stubs/libcuda.so``).
        lib_dirs: directories whose ``libcudart.so*`` give the target machine.
        cuda_h: the toolkit's ``cuda.h``, whose driver API names the stub defines
            (see :func:`driver_symbols`).

    Returns:
        The SHA-256 (hex) of what was written, for the view's metadata.

    Raises:
        OSError: ``dest`` cannot be written (disk full, ...).
        ViewError: no ELF reference and no usable C compiler; the message
            names ``CC`` and the fix.
    """
    ident = elf_ident(_reference_elfs(lib_dirs))
    symbols = driver_symbols(cuda_h)
    if ident is not None:
        data = stub_bytes(*ident, symbols=symbols)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        return hashlib.sha256(data).hexdigest()
    _compile_stub(dest, symbols)
    with open(dest, "rb") as fh:
        return hashlib.sha256(fh.read(1 << 20)).hexdigest()


def _compilers() -> list[tuple[str, list[str], str | None]]:
    """``(label, argv prefix, why not)`` to try: ``$CC``, then PATH.  ``$CC`` is held to the rule of
    FlashInfer's compiler variables (:func:`flashinfer_sm120.safety.compilers.trust_problem`: plain
    words; every program it runs, file or directory it names trusted; no option that picks programs,
    such as ``-B/dir`` or ``-wrapper``), so ``CC='gcc -B/tmp/x'`` never runs ``/tmp/x/as``."""
    from flashinfer_sm120.safety.compilers import program_of, trust_problem

    out: list[tuple[str, list[str], str | None]] = []
    cc = os.environ.get("CC", "").strip()
    if cc:
        path = os.environ.get("PATH")
        problem = trust_problem(cc, path)
        prog = program_of(cc, path)[0] if problem is None else None
        out.append((f"CC={formats.shown(cc)}", [prog, *cc.split()[1:]] if prog else [], problem))
    out += [(name, [name], None) for name in ("cc", "gcc", "clang")]
    return out


def _run(cmd: list[str]) -> tuple[int | None, str]:
    """``(exit status or None, output head)`` of ``cmd``, through the package's bounded runner
    (:mod:`flashinfer_sm120.safety.proc`): bounded in time and output, nothing left behind."""
    from flashinfer_sm120.safety import proc

    res = proc.run(cmd, timeout=COMPILER_TIMEOUT_S, max_output=16 << 10)
    if res.timed_out:
        return None, f"timed out after {COMPILER_TIMEOUT_S:.0f} s"
    return res.returncode, res.error or res.text()[:400]


def _compile_stub(dest: str, symbols: list[str]) -> None:
    """Build the stub with a C compiler (fallback); raises :class:`ViewError` naming ``CC``."""
    tried = []
    with tempfile.TemporaryDirectory(prefix=".stub-", dir=os.path.dirname(dest)) as work:
        src = os.path.join(work, "libcuda_stub.c")
        with open(src, "w") as fh:
            fh.write("/* link stub for -lcuda; the driver's libcuda.so.1 is used at run time */\n")
            fh.writelines(f"void {name}(void) {{}}\n" for name in symbols)
        for label, argv, problem in _compilers():
            if problem:
                tried.append(f"{label}: not run ({problem})")
                continue
            exe = shutil.which(argv[0]) if argv and argv[0] else None
            if not exe:
                tried.append(f"{label}: {argv[0] if argv else ''!s} not found")
                continue
            bad = check_executable(exe)
            if bad:
                tried.append(f"{label}: not run ({bad})")
                continue
            rc, out = _run([exe, *argv[1:], "-shared", "-nostdlib", f"-Wl,-soname,{SONAME}", "-o", dest, src])
            if rc == 0 and os.path.isfile(dest):
                return
            tried.append(f"{label}: " + (f"exit {rc}: " if rc is not None else "") + out.strip())
    raise ViewError(
        "cannot build the libcuda.so link stub for FlashInfer's -lcuda: " + "; ".join(tried)
        + ". Set CC to a working C compiler (e.g. CC=gcc; flags and launchers such as "
          "CC='ccache gcc' are fine), or install the CUDA toolkit's own lib64/stubs/libcuda.so"
    )
