"""What a cache export is, and reading one as untrusted input (threat-model: P6, P7)::

    flashinfer-sm120-cache/meta.json          fingerprint, modules (FlashInfer's names), sha256 of every file
    flashinfer-sm120-cache/jit/NAME/...       FlashInfer's module dir: objects, .so, build.ninja, ninja log/deps
    flashinfer-sm120-cache/generated/...      sources FlashInfer generated for the module

A new directory, or a ``.tar``/``.tar.gz``/``.tgz`` archive; :func:`parse_meta` is meta.json's grammar
(an export is checked with it before it is written), :func:`check` reads an export without writing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import platform
import resource
import shutil
import tarfile
from pathlib import Path
from typing import Any

from flashinfer_sm120.core.facts import buildline
from flashinfer_sm120.core.facts.arch import nvcc_spelling
from flashinfer_sm120.core.jitenv import record
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety import oserrors
from flashinfer_sm120.safety.formats.reads import field, loads_json, read_bytes, read_text
from flashinfer_sm120.safety.formats.grammar import parse_name, parse_relpath, parse_sha256, parse_target
from flashinfer_sm120.safety.formats.paths import safe_join
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.formats.tar import TarReader
from flashinfer_sm120.warmup.modules import user_name
from flashinfer_sm120.warmup.session import BuildError

TOP = "flashinfer-sm120-cache"
FORMAT = 1
#: Most parts of a path meta.json lists (``generated/a/b/...``); a member adds the top folder.
_MAX_PARTS = 16
#: Largest meta.json read (bytes): it carries manifest entries with their generated sources.
MAX_META_BYTES = 64 << 20
FIX = "give the path `flashinfer-sm120 cache export` wrote"
_FINGERPRINT = {"flashinfer": str, "targets": list, "cuda_version": str, "cuda_home": str, "jit_dir": str}


class CacheError(BuildError):
    """A refused export or import: ``kind`` (``archive``: not what `cache export` writes; ``mismatch``:
    made for another machine; else :data:`~flashinfer_sm120.safety.oserrors.BY_ERRNO`'s), ``fix``.  P8"""

    def __init__(self, message: str, kind: str = "archive", fix: str = "") -> None:
        super().__init__(message)
        self.kind, self.fix = kind, fix

    def __reduce__(self):
        return (type(self), (str(self), self.kind, self.fix))


@dataclasses.dataclass(frozen=True)
class Limits:
    """Caps of an export and an import, the same for an archive and a directory (P6, P7): counted on
    headers and sizes before anything is written, and on the bytes read while copying."""

    max_total: int = 32 << 30
    max_file: int = 8 << 30
    max_members: int = 100_000
    max_seconds: float = 600.0

    def max_stream(self) -> int:
        """Most bytes one pass may read out of an archive's decompressor (P6)."""
        return self.max_total + MAX_META_BYTES + (self.max_members + 2) * 3 * 512


@dataclasses.dataclass(frozen=True)
class Module:
    """One module of an export: FlashInfer's name, ``{path under jit/<name>/ or generated/: sha256}``."""

    name: str
    files: dict[str, str]

    @property
    def label(self) -> str:
        return user_name(self.name)


@dataclasses.dataclass(frozen=True)
class Meta:
    """An export's ``meta.json``, every field checked (:func:`parse_meta`)."""

    format: int
    fingerprint: dict[str, Any]
    modules: tuple[Module, ...]
    manifest: tuple[dict, ...]


def refused(src: str, what: str) -> CacheError:
    """The refusal of the whole export ``src`` for ``what``, with the fix."""
    return CacheError(f"{src}: {what}; refusing the whole archive; {FIX}", "archive", FIX)


def parse_meta(obj: Any, source: str) -> Meta:
    """Check a decoded ``meta.json`` field by field; :raises CacheError: the first field off its grammar."""
    f = field
    try:
        fmt = f(obj, "format", int, source, fix=FIX)
        if fmt != FORMAT:
            raise CacheError(f"{source} is export format {fmt}; this version reads {FORMAT}", "archive",
                             f"export it again with this flashinfer-sm120 (format {FORMAT})")
        fp_obj = f(obj, "fingerprint", dict, source, fix=FIX)
        # threat-model: P6, P8 -- as many targets as a manifest entry may carry: more would be printed
        # whole ("using the archive's targets ...") and refused as a too-long "--arch" never given
        fp = {k: f(fp_obj, k, kind, f"{source} 'fingerprint'", fix=FIX,
                   max_len=record.MAX_TARGETS if k == "targets" else 4096)
              for k, kind in _FINGERPRINT.items()}
        fp["targets"] = [parse_target(t, f"{source} 'fingerprint'", fix=FIX) for t in fp["targets"]]
        if "build_vars" in fp_obj:  # since flashinfer-sm120 0.2.x; older exports lack it
            fp["build_vars"] = buildline.checked(fp_obj["build_vars"])
            if fp["build_vars"] is None:
                raise CacheError(f"{source}: 'fingerprint' 'build_vars' is not a set of FlashInfer's build-line "
                                 f"variables; {FIX}", "archive", FIX)
        mods, seen, names = [], {}, set()
        for m in f(obj, "modules", list, source, fix=FIX, max_len=10_000):
            name = parse_name(f(m, "name", str, f"{source} module", fix=FIX), f"{source} module", fix=FIX)
            if name in names:
                raise CacheError(f"{source}: module {name} is listed twice; {FIX}", "archive", FIX)
            names.add(name)
            files = {}
            for rel, sha in f(m, "files", dict, f"{source} module {name}", fix=FIX, max_len=100_000).items():
                parts = parse_relpath(rel, f"{source} module {name}", fix=FIX, max_parts=_MAX_PARTS)
                if not ((parts[0] == "jit" and len(parts) > 2 and parts[1] == name)
                        or (parts[0] == "generated" and len(parts) > 1)):
                    raise CacheError(f"{source}: module {name} names {shown(rel)}, outside jit/{name}/ "
                                     f"and generated/; {FIX}", "archive", FIX)
                files[rel] = parse_sha256(sha, f"{source} module {name} {rel}", fix=FIX)
                for i in range(1, len(parts) + 1):  # a path cannot be a file and a directory at once
                    prefix = "/".join(parts[:i])
                    kind = "file" if i == len(parts) else "dir"
                    if seen.setdefault(prefix, kind) != kind:
                        raise CacheError(f"{source}: {shown(prefix)} is both a file and a directory; {FIX}",
                                         "archive", FIX)
            mods.append(Module(name, files))
        entries = [record.parse_entry(e, f"{source} manifest entry {i + 1}")
                   for i, e in enumerate(f(obj, "manifest", list, source, default=[], fix=FIX, max_len=10_000))]
    except FormatError as exc:
        raise CacheError(str(exc), "archive", exc.fix or FIX) from None
    return Meta(fmt, fp, tuple(mods), tuple(entries))


def member_rel(name: str, src: str) -> str:
    """Archive member ``name`` relative to the top folder; every part a name (nothing can land outside)."""
    try:  # one more part than meta.json's paths may have: the top folder
        parts = parse_relpath(name, f"{src}: archive member", max_parts=_MAX_PARTS + 1)
    except FormatError as exc:
        raise refused(src, f"member {shown(name)} is not a plain relative path ({exc})") from None
    if parts[0] != TOP:
        raise refused(src, f"member {shown(name)} is outside {TOP}/")
    return "/".join(parts[1:])


class Budget:
    """Bytes an export or import may still copy (``--max-bytes``), counted on what is read (P6)."""

    def __init__(self, limits: Limits) -> None:
        self.limits, self.left = limits, limits.max_total

    def take(self, n: int, src: object) -> None:
        self.left -= n
        if self.left < 0:
            raise over_cap(shown(str(src), 300), "the export's files add up to more", self.limits,
                           per_file=False)


def over_cap(src: str, what: str, limits: Limits, *, per_file: bool) -> CacheError:
    """The refusal of ``src`` for ``what`` over ``--max-bytes`` or the per-file cap.  P6, P8"""
    if per_file:
        return CacheError(f"{src}: {what}, over the per-file cap of {limits.max_file} bytes (which no "
                          f"option changes); refusing the whole export; {FIX}", "archive", FIX)
    fix = "pass a larger --max-bytes if you trust this export"
    return CacheError(f"{src}: {what} than the {limits.max_total}-byte cap of --max-bytes (default 32G); "
                      f"refusing the whole export; {fix}", "archive", fix)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def umask() -> int:
    """This process's umask, read without changing it (``/proc/self/status``); ``077`` if unknown."""
    try:
        for line in read_text("/proc/self/status", 1 << 16).splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8) & 0o777
    except (FormatError, ValueError, IndexError):
        pass
    return 0o077


def nvcc_targets(targets: list[str]) -> str:
    """``['12.0f', '12.1f']`` -> ``sm_120f sm_121f``."""
    return " ".join(nvcc_spelling(t) for t in targets)

def _walk(src: str, limits: Limits, meta: Meta | None = None, into: Path | None = None) -> Meta:
    """The one bounded pass over the archive ``src``: each member checked on its header before its data
    is read, against the caps and meta.json (read from the first member unless given); with ``into``,
    each listed file is extracted there.  Returns the meta.json.  P6, P7"""
    count = total = 0
    files: set[str] = set()
    dirs: set[str] = set()
    try:
        with TarReader(src, max_bytes=limits.max_stream(), max_seconds=limits.max_seconds, fix=FIX,
                       cap="the files' cap of cache import --max-bytes, plus meta.json and headers") as tar:
            for m in tar:
                count += 1
                if count > limits.max_members:
                    raise refused(src, f"it has more than {limits.max_members} members")
                rel = member_rel(m.name, src)
                if count == 1 and rel != "meta.json":
                    raise refused(src, f"its first member is {shown(m.name)}, not {TOP}/meta.json")
                if not (m.isfile() or m.isdir()):
                    raise refused(src, f"member {shown(m.name)} is a link or device")
                if m.isfile() and m.size > limits.max_file:
                    raise over_cap(src, f"member {shown(m.name)} is {m.size} bytes", limits, per_file=True)
                if count == 1:  # meta.json: within MAX_META_BYTES, not the files' total
                    meta = meta or _meta_member(src, tar, m)
                    files = {rel for mod in meta.modules for rel in mod.files}
                    dirs = {"/".join(r.split("/")[:i]) for r in files for i in range(1, r.count("/") + 1)}
                    continue
                total += m.size if m.isfile() else 0
                if total > limits.max_total:
                    raise over_cap(src, "its files add up to more", limits, per_file=False)
                if m.isdir():
                    if rel and rel not in dirs:
                        raise refused(src, f"directory {shown(m.name)} is not part of any module in meta.json")
                elif rel not in files:
                    raise refused(src, f"member {shown(m.name)} is not listed in meta.json")
                elif into is not None:
                    _extract(src, tar, m, into)
    except FormatError as exc:  # the reader's refusals
        raise CacheError(str(exc), "archive", exc.fix or FIX) from None
    if meta is None:
        raise refused(src, f"it has no members (no {TOP}/meta.json)")
    return meta


def _meta_member(src: str, tar: TarReader, m: tarfile.TarInfo) -> Meta:
    name = f"{src}: {TOP}/meta.json"
    if not m.isfile():
        raise CacheError(f"{src} has no {TOP}/meta.json; {FIX}", "archive", FIX)
    if m.size > MAX_META_BYTES:
        raise CacheError(f"{name} is {m.size} bytes, more than {MAX_META_BYTES}; {FIX}", "archive", FIX)
    try:
        return parse_meta(loads_json(tar.read(m), name, fix=FIX), name)
    except FormatError as exc:
        raise CacheError(str(exc), "archive", exc.fix or FIX) from None


def _file_size_limit() -> int | None:
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def too_large(src: str, what: str, size: int) -> CacheError | None:
    """The refusal of writing ``what`` (``size`` bytes) past this process's ``ulimit -f``, or None.  P6, P8"""
    limit = _file_size_limit()
    if limit is None or size <= limit:
        return None
    fix = f"raise the limit (`ulimit -f unlimited`, or above {size} bytes) in the shell that runs the command"
    return CacheError(f"{src}: {what} is {size} bytes, more than this process's file-size limit of {limit} bytes "
                      f"(ulimit -f, RLIMIT_FSIZE); {fix}", "limit", fix)


def _extract(src: str, tar: TarReader, m: tarfile.TarInfo, into: Path) -> None:
    problem = too_large(src, shown(m.name), m.size)
    if problem:
        raise problem
    free = shutil.disk_usage(into).free
    if m.size > free:  # threat-model: P6
        fix = "free space there or set TMPDIR to a larger disk"
        raise CacheError(f"{src}: {m.name} needs {m.size} bytes and {into} has {free} free; {fix}", "space", fix)
    try:
        tar.extract(m, into)  # threat-model: P6 (PEP 706 data filter)
    except OSError as exc:
        p = oserrors.describe(exc, into, "set TMPDIR to another directory")
        raise CacheError(f"{src}: unpacking {shown(m.name)}: {p.message}; {p.fix}", p.kind, p.fix) from None


def _top(src: str) -> Path:
    root = Path(src) / TOP
    if os.path.islink(root) or not root.is_dir():
        raise CacheError(f"{src} has no {TOP}/ folder (or it is a symlink); {FIX}", "archive", FIX)
    return root


def check(src: str, limits: Limits = Limits()) -> Meta:
    """The meta.json of an export, checked without writing: an archive whole (:func:`_walk`), a
    directory's meta.json (its files are checked one by one when installed)."""
    if not os.path.isdir(src):
        return _walk(src, limits)
    name = f"{src}/{TOP}/meta.json"
    try:
        raw = read_bytes(safe_join(_top(src), "meta.json", src, fix=FIX), MAX_META_BYTES,
                                 follow=False, fix=FIX)
        return parse_meta(loads_json(raw, name, fix=FIX), name)
    except FormatError as exc:
        raise CacheError(str(exc), "archive", exc.fix or FIX) from None


def unpack(src: str, into: Path, meta: Meta, limits: Limits) -> Path:
    """The folder to read the export's files from: ``src/TOP`` of a directory, else the archive's
    files unpacked below ``into``."""
    if os.path.isdir(src):
        return _top(src)
    if not hasattr(tarfile, "data_filter"):  # PEP 706 came in 3.10.12, 3.11.4, 3.12 (Debian 12: 3.11.2)
        fix = ("use a Python with tarfile's extraction filters (3.10.12+, 3.11.4+, 3.12+), or export a "
               "directory (cache export OUT, OUT not ending in .tar...) and import that")
        raise CacheError(f"cannot unpack {src}: this Python {platform.python_version()} has no tarfile extraction "
                         f"filters, and archives are unpacked only with the 'data' filter", "python", fix)
    _walk(src, limits, meta, into)
    return into / TOP
