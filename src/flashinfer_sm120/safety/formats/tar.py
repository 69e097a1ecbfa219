"""A tar or gzip-compressed tar as untrusted input (threat-model: P6): kind told by its first bytes, hostile headers
refused before ``tarfile`` reads them, every byte in and out of the decompressor capped, and a deadline."""

from __future__ import annotations

import gzip
import os
import tarfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.base import _fail, shown
from flashinfer_sm120.safety.formats.reads import _open_regular

#: Largest pax or GNU long-name header accepted, bytes.  ``tarfile`` reads such a header's declared
#: size into one bytes object (a 4 GiB header is 4 MiB gzipped) and, before CPython 3.11.10/3.12.6
#: (CVE-2024-6232), scans it quadratically; ours hold a path of at most a few hundred characters.
MAX_EXTENDED_HEADER = 16 << 10

_EXTENDED = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
             tarfile.GNUTYPE_LONGLINK)

#: An archive's first bytes -> its compression (magic numbers).
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
          (b"\x5d\x00\x00", "lzma"), (b"PK\x03\x04", "zip"))
#: What is read; any other compression is refused (skipping bzip2 data in stream mode is quadratic).
READ = ("tar", "gzip")


def compression(head: bytes) -> str:
    """What the first 512 bytes say a file is: ``tar``, ``gzip``, ``bzip2``, ``xz``, ``zstd``, ``lzma``, ``zip``, ``unknown``."""
    ustar = "tar" if head[257:262] == b"ustar" else "unknown"
    return next((name for magic, name in _MAGIC if head.startswith(magic)), ustar)


class _Refused(Exception):
    """A refused header (not a ``HeaderError``: ``TarFile.next`` reads one after the first as the end)."""


class _BoundedTarInfo(tarfile.TarInfo):
    """``tarfile``'s header reader refusing extended headers over the cap and sparse members (unbounded maps)."""

    def _proc_member(self, tarfile_):
        if self.type in _EXTENDED and self.size > MAX_EXTENDED_HEADER:
            raise _Refused(f"an extended header of {self.size} bytes, more than {MAX_EXTENDED_HEADER}")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise _Refused("a sparse member (regular files only)")
        return super()._proc_member(tarfile_)

    def _proc_gnusparse_00(self, *_args):
        raise _Refused("a sparse member (regular files only)")

    _proc_gnusparse_01 = _proc_gnusparse_10 = _proc_gnusparse_00


#: What ``tarfile`` raises from a hostile header besides its own errors (``int()`` of pax numbers,
#: ``.decode("utf-8")`` of ``hdrcharset``, indexing a short block at the end).
_HEADER_ERRORS = (_Refused, ValueError, IndexError, OverflowError)
#: What reading a damaged archive raises.
_READ_ERRORS = (OSError, tarfile.TarError, EOFError, zlib.error)


class _Capped:
    """A reader of ``raw`` refused past ``cap`` bytes or the deadline, so a bomb stops when it made the cap."""

    def __init__(self, raw, cap: int, reader: TarReader, what: str) -> None:
        self.raw, self.cap, self.left, self.reader, self.what = raw, cap, cap, reader, what

    def read(self, n: int = -1) -> bytes:
        want = (1 << 20) if n is None or n < 0 else n
        data = self.raw.read(min(want, self.left + 1))
        self.left -= len(data)
        if self.left < 0:
            raise self.reader.refused(self.what.format(cap=self.cap))
        if time.monotonic() > self.reader.deadline:
            raise self.reader.refused(f"reading it took more than {self.reader.max_seconds:g} s")
        return data

    def close(self) -> None:
        self.raw.close()


class TarReader:
    """The archive at ``path``, streamed within ``max_bytes`` decompressed and ``max_seconds``; refusals are ``FormatError``."""

    def __init__(self, path: str, *, max_bytes: int, max_seconds: float, cap: str, fix: str) -> None:
        self.path, self.fix, self.max_seconds = path, fix, max_seconds
        self.deadline = time.monotonic() + max_seconds
        fd, _ = _open_regular(path, fix)  # a FIFO is never waited on; a regular file only
        self.file = os.fdopen(fd, "rb")
        try:
            kind = compression(os.pread(fd, 512, 0))
            if kind not in READ:
                how = "compressed by its first bytes" if kind != "unknown" else "by its first bytes"
                fixed = f"recompress it with gzip, or give it unpacked; {fix}"
                problem = f"is {kind} data ({how}, whatever its name), not a tar or gzip-compressed tar"
                raise FormatError(f"{shown(path, 200)} {problem}; {fixed}", source=path, problem=problem,
                                  fix=fixed)
            raw = self.file
            if kind == "gzip":  # its input capped too, at what a gzip of max_bytes can be (stored blocks add 5
                # bytes per 64 KiB): thousands of members that decompress to nothing took 8 s a read
                raw = gzip.GzipFile(fileobj=_Capped(self.file, max_bytes + max_bytes // 1000 + (1 << 20), self,
                                                    "its compressed data is more than {cap} bytes, more than a "
                                                    "gzip of what it may unpack to"), mode="rb")
            self.stream = _Capped(raw, max_bytes, self, f"it unpacks to more than {{cap}} bytes ({cap})")
            self.tar = self._reading(lambda: tarfile.open(fileobj=self.stream, mode="r|", tarinfo=_BoundedTarInfo))
        except BaseException:
            self.file.close()
            raise

    def refused(self, what: str) -> FormatError:
        return _fail(self.path, what, self.fix)

    def _reading(self, step):
        """``step()``, any error of a damaged or hostile archive as our refusal."""
        try:
            return step()
        except FormatError:
            raise
        except _READ_ERRORS as exc:
            raise self.refused(f"cannot be read ({shown(str(exc), 200)})") from None
        except _HEADER_ERRORS as exc:
            raise self.refused(f"a member header is malformed ({shown(str(exc) or type(exc).__name__, 120)})") from None

    def __iter__(self) -> Iterator[tarfile.TarInfo]:
        members = iter(self.tar)
        seen: set[str] = set()
        while (m := self._reading(lambda: next(members, None))) is not None:
            name = m.name.removeprefix("./").rstrip("/")
            if name in seen:  # a later member would replace what an earlier one's checks passed (P7)
                raise self.refused(f"holds the member {shown(name)} twice")
            seen.add(name)
            yield m  # the caller's own errors pass through unchanged

    def read(self, m: tarfile.TarInfo) -> bytes:
        """The data of the regular member ``m`` (its size checked by the caller)."""
        return self._reading(lambda: self.tar.extractfile(m).read(m.size))  # type: ignore[union-attr]

    def extract(self, m: tarfile.TarInfo, into: Path) -> None:
        """``m`` written under ``into`` by tarfile's ``data`` filter (PEP 706); ``OSError`` of writing left to the caller."""
        try:
            self.tar.extract(m, into, filter="data")
        except _READ_ERRORS as exc:
            if isinstance(exc, OSError) and exc.errno is not None:  # writing failed (EFBIG, ENOSPC...)
                raise
            raise self.refused(f"cannot unpack {shown(m.name)} ({shown(str(exc), 200)})") from None

    def __enter__(self) -> TarReader:
        return self

    def __exit__(self, *exc) -> None:
        self.stream.close()
        self.file.close()
