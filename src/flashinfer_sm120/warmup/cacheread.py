"""Read an export as untrusted input: archive members one header at a time, within the caps of
:class:`~flashinfer_sm120.warmup.cachemeta.Limits`, and meta.json of a directory or an archive.
Nothing here writes; :mod:`.cachemeta` holds the format.
"""

from __future__ import annotations

import gzip
import os
import stat
import tarfile
import time
import zlib

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety import formats
from flashinfer_sm120.warmup.cachemeta import (FIX, MAX_META_BYTES, TOP, CacheError, Limits, Meta, check_listed,
                                               listed, member_rel, parse_meta, refused)
from flashinfer_sm120.warmup.session import BuildError

__all__ = ["compression", "members", "check_members", "read_meta"]


#: Largest pax or GNU long-name header accepted, bytes.  ``tarfile`` reads such a header's declared
#: size into one bytes object (a 4 GiB header is 4 MiB gzipped) and, before CPython 3.11.10/3.12.6
#: (CVE-2024-6232), scans it quadratically; ours hold a path of at most a few hundred characters.
MAX_EXTENDED_HEADER = 16 << 10

_EXTENDED = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
             tarfile.GNUTYPE_LONGLINK)


class _Refused(Exception):
    """A header :class:`_BoundedTarInfo` refuses.  Not a ``tarfile.HeaderError``: ``TarFile.next``
    reads an invalid header after the first as the end of the archive, and this must stop it."""


class _BoundedTarInfo(tarfile.TarInfo):
    """``tarfile``'s header reader with the shapes an export never has refused before they are read:
    an extended header over :data:`MAX_EXTENDED_HEADER`, and sparse members in each of GNU's forms
    (old-style ``S``, pax 0.0/0.1/1.0), whose maps ``tarfile`` parses with bare ``int()`` and
    unbounded lists.  (The ``_proc_*`` hooks are the subclassing points ``TarInfo._proc_member``
    documents; ``tests/unit/warmup/test_cachemeta_tar.py`` checks they still exist.)"""

    def _proc_member(self, tarfile_):
        if self.type in _EXTENDED and self.size > MAX_EXTENDED_HEADER:
            raise _Refused(f"an extended header of {self.size} bytes, more than {MAX_EXTENDED_HEADER}")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise _Refused("a sparse member (exports hold regular files only)")
        return super()._proc_member(tarfile_)

    def _proc_gnusparse_00(self, *_args):
        raise _Refused("a sparse member (exports hold regular files only)")

    _proc_gnusparse_01 = _proc_gnusparse_10 = _proc_gnusparse_00


#: What ``tarfile`` raises from a hostile header besides its own errors (``int()`` of pax numbers,
#: ``.decode("utf-8")`` of ``hdrcharset``, indexing a short block at the end).
_HEADER_ERRORS = (_Refused, ValueError, IndexError, OverflowError)


#: An archive's first bytes -> its compression (magic numbers).  `cache export` writes ``tar`` and
#: ``gzip`` only; the others are named in the refusal.
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
          (b"\x5d\x00\x00", "lzma"), (b"PK\x03\x04", "zip"))
_WRITTEN = ("tar", "gzip")


def compression(head: bytes) -> str:
    """What the first 512 bytes of a file say it is: ``tar`` (a POSIX/GNU header's ``ustar``
    magic), ``gzip``, ``bzip2``, ``xz``, ``zstd``, ``lzma``, ``zip`` or ``unknown``; never the
    file's name.  threat-model: P6"""
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    return "tar" if head[257:262] == b"ustar" else "unknown"


class _Bounded:
    """A reader that counts the bytes actually read from the decompressor (or the file) and the
    time spent, and refuses past :meth:`Limits.max_stream` or ``max_seconds``: headers cannot
    declare their way past the caps, and a small bomb is refused when it has produced the cap,
    not after.  threat-model: P6"""

    def __init__(self, raw, src: str, limits: Limits) -> None:
        self.raw, self.src, self.file = raw, src, None
        self.cap, self.left = limits.max_stream(), limits.max_stream()
        self.seconds = limits.max_seconds
        self.deadline = time.monotonic() + limits.max_seconds

    def read(self, n: int = -1) -> bytes:
        want = (1 << 20) if n is None or n < 0 else n
        data = self.raw.read(min(want, self.left + 1))
        self.left -= len(data)
        if self.left < 0:
            raise refused(self.src, f"it unpacks to more than {self.cap} bytes (the files' cap from cache "
                                  f"import --max-bytes, meta.json and headers)")
        if time.monotonic() > self.deadline:
            raise refused(self.src, f"reading it took more than {self.seconds:g} s")
        return data

    def close(self) -> None:
        self.raw.close()
        if self.file is not None:  # under a decompressor, which leaves the file it was given open
            self.file.close()


class _Compressed:
    """The compressed file under the gzip decompressor, read within a cap of its own and the pass's
    deadline: a gzip file may be thousands of members that decompress to nothing (``gzip`` reads
    concatenated members as one stream), which :class:`_Bounded` never sees, since one read of
    the decompressor walks all of them before it returns a byte; 40 MB of empty members took
    8 s a pass, and the size of the file was bounded by nothing.  The cap is what a gzip of
    :meth:`Limits.max_stream` bytes can be (deflate's stored blocks add 5 bytes per 64 KiB, a
    member header 10 and a trailer 8).  threat-model: P6"""

    def __init__(self, raw, bounded: _Bounded) -> None:
        self.raw, self.bounded = raw, bounded
        self.cap = bounded.cap + bounded.cap // 1000 + (1 << 20)
        self.left = self.cap

    def read(self, n: int = -1) -> bytes:
        want = (1 << 20) if n is None or n < 0 else n
        data = self.raw.read(min(want, self.left + 1))
        self.left -= len(data)
        if self.left < 0:
            raise refused(self.bounded.src, f"its compressed data is more than {self.cap} bytes, more than a gzip "
                                          f"of what it may unpack to")
        if time.monotonic() > self.bounded.deadline:
            raise refused(self.bounded.src, f"reading it took more than {self.bounded.seconds:g} s")
        return data

    def close(self) -> None:
        self.raw.close()


def _open_tar(src: str, limits: Limits):
    """``(tar, file)``: the archive streamed (headers seen one at a time, nothing held) from a
    regular file, opened without blocking (a FIFO given as the export hung ``cache import``),
    accepted only when its first bytes say tar or gzip (what `cache export` writes), and read
    through :class:`_Bounded`."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError) as exc:
        raise CacheError(f"cannot read {formats.shown(src, 200)}: {getattr(exc, 'strerror', None) or exc}; "
                         f"{FIX}", "archive", FIX) from None
    fh = os.fdopen(fd, "rb")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CacheError(f"{formats.shown(src, 200)} is neither a directory nor a regular file; {FIX}", "archive", FIX)
        os.set_blocking(fd, True)
        kind = compression(os.pread(fd, 512, 0))
        if kind not in _WRITTEN:  # threat-model: P6 (only what we write; bzip2 bombs grew quadratically)
            fix = ("unpack it and give the directory, or recompress it with gzip; better: give the file "
                   "`flashinfer-sm120 cache export` wrote (.tar or .tar.gz)")
            raise CacheError(f"{formats.shown(src, 200)} is {kind} data ({'compressed ' if kind != 'unknown' else ''}"
                             f"by its first bytes, whatever its name), not a tar or gzip-compressed tar; {fix}",
                             "archive", fix)
        stream = _Bounded(fh, src, limits)
        if kind == "gzip":  # threat-model: P6 (the compressed bytes and the time under the decompressor)
            stream.raw, stream.file = gzip.GzipFile(fileobj=_Compressed(fh, stream), mode="rb"), fh
        return tarfile.open(fileobj=stream, mode="r|", tarinfo=_BoundedTarInfo), stream
    except (OSError, tarfile.TarError, EOFError, zlib.error) as exc:
        fh.close()
        raise CacheError(f"cannot read {src}: {formats.shown(str(exc), 200)}; {FIX}", "archive", FIX) from None
    except (BuildError, FormatError):
        fh.close()
        raise
    except _HEADER_ERRORS as exc:  # opening reads the first member's header
        fh.close()
        raise _malformed(src, exc) from None
    except BaseException:
        fh.close()
        raise


def members(src: str, limits: Limits):
    """Each member of the archive ``src`` with its path under TOP, checked on its header before
    its data is read: ``meta.json`` first (threat-model: P6: a pass for meta.json reads one member),
    a plain relative path under TOP/, a regular file or a directory, within the member-count,
    per-file and total caps; the whole pass within the decompressed-bytes and time caps."""
    count = total = 0
    tar, fh = _open_tar(src, limits)
    try:
        with tar:
            try:
                for m in tar:
                    count += 1
                    if count > limits.max_members:
                        raise refused(src, f"it has more than {limits.max_members} members")
                    rel = member_rel(m.name, src)
                    if count == 1 and rel != "meta.json":
                        raise refused(src, f"its first member is {formats.shown(m.name)}, not {TOP}/meta.json")
                    if not (m.isfile() or m.isdir()):
                        raise refused(src, f"member {formats.shown(m.name)} is a link or device")
                    if m.isfile() and m.size > limits.max_file:
                        raise refused(src, f"member {formats.shown(m.name)} is {m.size} bytes, more than the "
                                         f"{limits.max_file}-byte cap (cache import --max-bytes)")
                    total += m.size if m.isfile() and count > 1 else 0  # meta.json: MAX_META_BYTES
                    if total > limits.max_total:
                        raise refused(src, f"its files add up to more than the {limits.max_total}-byte cap "
                                         f"(cache import --max-bytes)")
                    yield tar, m, rel
            finally:
                fh.close()
        if count == 0:
            raise refused(src, f"it has no members (no {TOP}/meta.json)")
    except (OSError, tarfile.TarError, EOFError, zlib.error) as exc:
        raise CacheError(f"cannot read {src}: {formats.shown(str(exc), 200)}; {FIX}", "archive", FIX) from None
    except (BuildError, FormatError):  # ours (FormatError is a ValueError too)
        raise
    except _HEADER_ERRORS as exc:
        raise _malformed(src, exc) from None


def _malformed(src: str, exc: BaseException) -> BuildError:
    return refused(src, f"a member header is malformed ({formats.shown(str(exc) or type(exc).__name__, 120)})")


def check_members(src: str, limits: Limits = Limits()) -> Meta:
    """Check an export without writing anything: every archive member's header
    (under TOP/, a plain relative path, a regular file or directory, within the
    caps), then meta.json (:func:`read_meta`), then that every member is one
    meta.json lists.  A directory export is checked file by file when installed.

    :returns: the parsed meta.json.
    :raises BuildError: the first unsafe member, an unreadable archive, or a bad meta.json."""
    if not os.path.isdir(src):
        for _ in members(src, limits):
            pass
    meta = read_meta(src, limits)
    if not os.path.isdir(src):
        files_dirs = listed(meta)
        total = 0
        for _, m, rel in members(src, limits):
            total += m.size if m.isfile() else 0
            check_listed(src, m, rel, files_dirs, total, limits)
    return meta


def read_meta(src: str, limits: Limits = Limits()) -> Meta:
    """meta.json of an export (directory or archive), read bounded and parsed by
    :func:`parse_meta`, without unpacking anything else.

    :raises BuildError: unreadable, no meta.json, or a field of the wrong form."""
    name = f"{src}/{TOP}/meta.json" if os.path.isdir(src) else f"{src}: {TOP}/meta.json"
    try:
        if os.path.isdir(src):
            raw = formats.read_bytes(formats.safe_join(src, f"{TOP}/meta.json", src, fix=FIX), MAX_META_BYTES,
                                     follow=False, fix=FIX)
        else:
            raw = None
            for tar, m, rel in members(src, limits):
                if rel == "meta.json" and m.isfile():
                    if m.size > MAX_META_BYTES:
                        raise CacheError(f"{name} is {m.size} bytes, more than {MAX_META_BYTES}; {FIX}", "archive", FIX)
                    raw = tar.extractfile(m).read(m.size)  # type: ignore[union-attr]  (size checked above)
                    break
            if raw is None:
                raise CacheError(f"{src} has no {TOP}/meta.json; {FIX}", "archive", FIX)
        return parse_meta(formats.loads_json(raw, name, fix=FIX), name)
    except FormatError as exc:
        raise CacheError(str(exc), "archive", exc.fix or FIX) from None
