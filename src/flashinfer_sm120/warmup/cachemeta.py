"""The export format of a warmed JIT cache, read as untrusted input: ``meta.json``
field by field, archive members by their headers, and the caps on what an import
may write.  Nothing here writes; :mod:`.cachepack` exports and installs.

Layout (directory or ``.tar``/``.tar.gz``/``.tgz``)::

    flashinfer-sm120-cache/meta.json          fingerprint, manifest entries, sha256 of every file
    flashinfer-sm120-cache/jit/NAME/...       FlashInfer's module dir: objects, .so, build.ninja, ninja log/deps
    flashinfer-sm120-cache/generated/...      sources FlashInfer generated for the module
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import stat
import tarfile
import time
import zlib
from typing import Any

from flashinfer_sm120.core.facts import buildline
from flashinfer_sm120.safety import formats
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.core.jitenv.manifest import _MAX_TARGETS, parse_entry
from flashinfer_sm120.warmup.session import BuildError

__all__ = ["TOP", "FORMAT", "MAX_META_BYTES", "CacheError", "Limits", "Module", "Meta", "parse_meta", "read_meta",
           "check_members", "members", "member_rel", "check_listed", "listed", "compression"]

TOP = "flashinfer-sm120-cache"
FORMAT = 1
#: Most parts of a path meta.json lists (``generated/a/b/...``); a member adds the top folder.
_MAX_PARTS = 16
#: Largest meta.json read (bytes): it carries manifest entries with their generated sources.
MAX_META_BYTES = 64 << 20


class CacheError(BuildError):
    """A refused export or import.  ``kind`` says what kind of refusal (``archive``: the export
    itself is not what `cache export` writes; ``mismatch``: it was made for another machine;
    ``space``, ``permission``, ``path``, ``exists``...: :data:`flashinfer_sm120.safety.oserrors.BY_ERRNO`),
    ``fix`` the fix alone (also at the end of the message).  threat-model: P8"""

    def __init__(self, message: str, kind: str = "archive", fix: str = "") -> None:
        super().__init__(message)
        self.kind, self.fix = kind, fix

    def __reduce__(self):
        return (type(self), (str(self), self.kind, self.fix))


@dataclasses.dataclass(frozen=True)
class Limits:
    """Caps on what an import reads and writes (``cache import --max-bytes``), the same for an
    archive and a directory export (threat-model: P6, P7): files, bytes and members counted on
    headers and sizes before anything is written, and on the bytes actually read while copying;
    ``max_seconds`` bounds each pass over an archive."""

    max_total: int = 32 << 30
    max_file: int = 8 << 30
    max_members: int = 100_000
    max_seconds: float = 600.0

    def max_stream(self) -> int:
        """Most bytes one pass may read out of an archive's decompressor: the files, meta.json,
        and a header and padding per member (threat-model: P6)."""
        return self.max_total + MAX_META_BYTES + (self.max_members + 2) * 3 * 512


@dataclasses.dataclass(frozen=True)
class Module:
    """One module of an export: its name and ``{relative path: sha256}``; every
    jit/ path is under ``jit/<name>/``, every other under ``generated/``."""

    name: str
    files: dict[str, str]


@dataclasses.dataclass(frozen=True)
class Meta:
    """An export's ``meta.json``, every field checked (:func:`parse_meta`)."""

    format: int
    fingerprint: dict[str, Any]
    modules: tuple[Module, ...]
    manifest: tuple[dict, ...]


_FINGERPRINT = {"flashinfer": str, "targets": list, "cuda_version": str, "cuda_home": str, "jit_dir": str}
_FIX = "give the path `flashinfer-sm120 cache export` wrote"


def _fail(src: str, what: str) -> CacheError:
    return CacheError(f"{src}: {what}; refusing the whole archive; {_FIX}", "archive", _FIX)


def parse_meta(obj: Any, source: str) -> Meta:
    """Check a decoded ``meta.json`` field by field (:mod:`flashinfer_sm120.safety.formats`).

    :raises BuildError: the first field that is not of its grammar, named with a
        cut value; module names are names, file paths relative paths of names
        under ``jit/<module>/`` or ``generated/``, no path is both a file and a
        directory, every digest is SHA-256, manifest entries parse
        (:func:`~flashinfer_sm120.core.jitenv.manifest.parse_entry`)."""
    f = formats.field
    try:
        fmt = f(obj, "format", int, source, fix=_FIX)
        if fmt != FORMAT:
            raise BuildError(f"{source} is export format {fmt}; this version reads {FORMAT}")
        fp_obj = f(obj, "fingerprint", dict, source, fix=_FIX)
        # threat-model: P6, P8 -- as many targets as a manifest entry may carry: 4096 of them were
        # printed whole ("using the archive's targets ...", 21 kB) and refused as a too-long "--arch"
        # the user never gave
        fp = {k: f(fp_obj, k, kind, f"{source} 'fingerprint'", fix=_FIX,
                   max_len=_MAX_TARGETS if k == "targets" else 4096)
              for k, kind in _FINGERPRINT.items()}
        fp["targets"] = [formats.parse_target(t, f"{source} 'fingerprint'", fix=_FIX) for t in fp["targets"]]
        if "build_vars" in fp_obj:  # since flashinfer-sm120 0.2.x; older exports lack it
            fp["build_vars"] = buildline.checked(fp_obj["build_vars"])
            if fp["build_vars"] is None:
                raise BuildError(f"{source}: 'fingerprint' 'build_vars' is not a set of FlashInfer's build-line "
                                 f"variables; {_FIX}")
        mods, seen, names = [], {}, set()
        for m in f(obj, "modules", list, source, fix=_FIX, max_len=10_000):
            name = formats.parse_name(f(m, "name", str, f"{source} module", fix=_FIX), f"{source} module", fix=_FIX)
            if name in names:
                raise BuildError(f"{source}: module {name} is listed twice; {_FIX}")
            names.add(name)
            files = {}
            for rel, sha in f(m, "files", dict, f"{source} module {name}", fix=_FIX, max_len=100_000).items():
                parts = formats.parse_relpath(rel, f"{source} module {name}", fix=_FIX, max_parts=_MAX_PARTS)
                if not ((parts[0] == "jit" and len(parts) > 2 and parts[1] == name)
                        or (parts[0] == "generated" and len(parts) > 1)):
                    raise BuildError(f"{source}: module {name} names {formats.shown(rel)}, outside jit/{name}/ "
                                     f"and generated/; {_FIX}")
                files[rel] = formats.parse_sha256(sha, f"{source} module {name} {rel}", fix=_FIX)
                for i in range(1, len(parts) + 1):  # a path cannot be a file and a directory at once
                    prefix = "/".join(parts[:i])
                    kind = "file" if i == len(parts) else "dir"
                    if seen.setdefault(prefix, kind) != kind:
                        raise BuildError(f"{source}: {formats.shown(prefix)} is both a file and a directory; {_FIX}")
            mods.append(Module(name, files))
        entries = []
        for i, e in enumerate(f(obj, "manifest", list, source, default=[], fix=_FIX, max_len=10_000)):
            entries.append(parse_entry(e, f"{source} manifest entry {i + 1}"))
    except FormatError as exc:
        raise BuildError(str(exc)) from None
    return Meta(fmt, fp, tuple(mods), tuple(entries))


def member_rel(name: str, src: str) -> str:
    """``name`` relative to the top folder (an archive member), refusing anything
    that could land outside it: every part must be a name (no ``..``, no absolute
    part, no empty part, no backslash)."""
    try:
        # one more part than meta.json's paths may have: the top folder (a path meta.json accepts, at
        # its deepest, was refused as a member, "not a plain relative path")
        parts = formats.parse_relpath(name, f"{src}: archive member", max_parts=_MAX_PARTS + 1)
    except FormatError as exc:
        raise _fail(src, f"member {formats.shown(name)} is not a plain relative path ({exc})") from None
    if parts[0] != TOP:
        raise _fail(src, f"member {formats.shown(name)} is outside {TOP}/")
    return "/".join(parts[1:])


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
            raise _fail(self.src, f"it unpacks to more than {self.cap} bytes (the files' cap from cache "
                                  f"import --max-bytes, meta.json and headers)")
        if time.monotonic() > self.deadline:
            raise _fail(self.src, f"reading it took more than {self.seconds:g} s")
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
            raise _fail(self.bounded.src, f"its compressed data is more than {self.cap} bytes, more than a gzip "
                                          f"of what it may unpack to")
        if time.monotonic() > self.bounded.deadline:
            raise _fail(self.bounded.src, f"reading it took more than {self.bounded.seconds:g} s")
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
        raise BuildError(f"cannot read {formats.shown(src, 200)}: {getattr(exc, 'strerror', None) or exc}; "
                         f"{_FIX}") from None
    fh = os.fdopen(fd, "rb")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BuildError(f"{formats.shown(src, 200)} is neither a directory nor a regular file; {_FIX}")
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
        raise BuildError(f"cannot read {src}: {formats.shown(str(exc), 200)}; {_FIX}") from None
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
                        raise _fail(src, f"it has more than {limits.max_members} members")
                    rel = member_rel(m.name, src)
                    if count == 1 and rel != "meta.json":
                        raise _fail(src, f"its first member is {formats.shown(m.name)}, not {TOP}/meta.json")
                    if not (m.isfile() or m.isdir()):
                        raise _fail(src, f"member {formats.shown(m.name)} is a link or device")
                    if m.isfile() and m.size > limits.max_file:
                        raise _fail(src, f"member {formats.shown(m.name)} is {m.size} bytes, more than the "
                                         f"{limits.max_file}-byte cap (cache import --max-bytes)")
                    total += m.size if m.isfile() and count > 1 else 0  # meta.json: MAX_META_BYTES
                    if total > limits.max_total:
                        raise _fail(src, f"its files add up to more than the {limits.max_total}-byte cap "
                                         f"(cache import --max-bytes)")
                    yield tar, m, rel
            finally:
                fh.close()
        if count == 0:
            raise _fail(src, f"it has no members (no {TOP}/meta.json)")
    except (OSError, tarfile.TarError, EOFError, zlib.error) as exc:
        raise BuildError(f"cannot read {src}: {formats.shown(str(exc), 200)}; {_FIX}") from None
    except (BuildError, FormatError):  # ours (FormatError is a ValueError too)
        raise
    except _HEADER_ERRORS as exc:
        raise _malformed(src, exc) from None


def _malformed(src: str, exc: BaseException) -> BuildError:
    return _fail(src, f"a member header is malformed ({formats.shown(str(exc) or type(exc).__name__, 120)})")


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


def listed(meta: Meta) -> tuple[set[str], set[str]]:
    """The files meta.json lists and the folders they need, as paths under TOP/."""
    files = {rel for mod in meta.modules for rel in mod.files}
    dirs = {"/".join(rel.split("/")[:i]) for rel in files for i in range(1, rel.count("/") + 1)}
    return files, dirs


def check_listed(src: str, m: tarfile.TarInfo, rel: str, files_dirs: tuple[set[str], set[str]], total: int,
                 limits: Limits) -> None:
    """Refuse member ``m`` unless meta.json lists it (or it is meta.json or a folder of a
    listed file) and the running ``total`` is within the cap."""
    files, dirs = files_dirs
    if m.isdir():
        if rel and rel not in dirs:
            raise _fail(src, f"directory {formats.shown(m.name)} is not part of any module in meta.json")
        return
    if rel != "meta.json" and rel not in files:
        raise _fail(src, f"member {formats.shown(m.name)} is not listed in meta.json")
    if total > limits.max_total:
        raise _fail(src, f"its files add up to more than the {limits.max_total}-byte cap "
                         f"(cache import --max-bytes)")


def read_meta(src: str, limits: Limits = Limits()) -> Meta:
    """meta.json of an export (directory or archive), read bounded and parsed by
    :func:`parse_meta`, without unpacking anything else.

    :raises BuildError: unreadable, no meta.json, or a field of the wrong form."""
    name = f"{src}/{TOP}/meta.json" if os.path.isdir(src) else f"{src}: {TOP}/meta.json"
    try:
        if os.path.isdir(src):
            raw = formats.read_bytes(formats.safe_join(src, f"{TOP}/meta.json", src, fix=_FIX), MAX_META_BYTES,
                                     follow=False, fix=_FIX)
        else:
            raw = None
            for tar, m, rel in members(src, limits):
                if rel == "meta.json" and m.isfile():
                    if m.size > MAX_META_BYTES:
                        raise BuildError(f"{name} is {m.size} bytes, more than {MAX_META_BYTES}; {_FIX}")
                    raw = tar.extractfile(m).read(m.size)  # type: ignore[union-attr]  (size checked above)
                    break
            if raw is None:
                raise BuildError(f"{src} has no {TOP}/meta.json; {_FIX}")
        return parse_meta(formats.loads_json(raw, name, fix=_FIX), name)
    except FormatError as exc:
        raise BuildError(str(exc)) from None
