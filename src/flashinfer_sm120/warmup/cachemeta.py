"""The export format of a warmed JIT cache: ``meta.json`` checked field by field, the paths its
members may have, and the caps on what an import may read and write.  Nothing here reads a file or
writes; :mod:`.cacheread` reads an export, :mod:`.cacheexport` writes one, :mod:`.cachepack` installs one.

Layout (directory or ``.tar``/``.tar.gz``/``.tgz``)::

    flashinfer-sm120-cache/meta.json          fingerprint, manifest entries, sha256 of every file
    flashinfer-sm120-cache/jit/NAME/...       FlashInfer's module dir: objects, .so, build.ninja, ninja log/deps
    flashinfer-sm120-cache/generated/...      sources FlashInfer generated for the module
"""

from __future__ import annotations

import dataclasses
import tarfile
from typing import Any

from flashinfer_sm120.core.facts import buildline
from flashinfer_sm120.safety import formats
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.core.jitenv.manifest import _MAX_TARGETS, parse_entry
from flashinfer_sm120.warmup.session import BuildError

__all__ = ["TOP", "FORMAT", "MAX_META_BYTES", "FIX", "CacheError", "Limits", "Module", "Meta", "parse_meta",
           "refused", "member_rel", "check_listed", "listed"]

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
FIX = "give the path `flashinfer-sm120 cache export` wrote"


def refused(src: str, what: str) -> CacheError:
    """The refusal of the whole export ``src`` for ``what``, with the fix."""
    return CacheError(f"{src}: {what}; refusing the whole archive; {FIX}", "archive", FIX)


def parse_meta(obj: Any, source: str) -> Meta:
    """Check a decoded ``meta.json`` field by field (:mod:`flashinfer_sm120.safety.formats`).

    :raises BuildError: the first field that is not of its grammar, named with a
        cut value; module names are names, file paths relative paths of names
        under ``jit/<module>/`` or ``generated/``, no path is both a file and a
        directory, every digest is SHA-256, manifest entries parse
        (:func:`~flashinfer_sm120.core.jitenv.manifest.parse_entry`)."""
    f = formats.field
    try:
        fmt = f(obj, "format", int, source, fix=FIX)
        if fmt != FORMAT:
            raise CacheError(f"{source} is export format {fmt}; this version reads {FORMAT}", "archive",
                             f"export it again with this flashinfer-sm120 (format {FORMAT})")
        fp_obj = f(obj, "fingerprint", dict, source, fix=FIX)
        # threat-model: P6, P8 -- as many targets as a manifest entry may carry: 4096 of them were
        # printed whole ("using the archive's targets ...", 21 kB) and refused as a too-long "--arch"
        # the user never gave
        fp = {k: f(fp_obj, k, kind, f"{source} 'fingerprint'", fix=FIX,
                   max_len=_MAX_TARGETS if k == "targets" else 4096)
              for k, kind in _FINGERPRINT.items()}
        fp["targets"] = [formats.parse_target(t, f"{source} 'fingerprint'", fix=FIX) for t in fp["targets"]]
        if "build_vars" in fp_obj:  # since flashinfer-sm120 0.2.x; older exports lack it
            fp["build_vars"] = buildline.checked(fp_obj["build_vars"])
            if fp["build_vars"] is None:
                raise BuildError(f"{source}: 'fingerprint' 'build_vars' is not a set of FlashInfer's build-line "
                                 f"variables; {FIX}")
        mods, seen, names = [], {}, set()
        for m in f(obj, "modules", list, source, fix=FIX, max_len=10_000):
            name = formats.parse_name(f(m, "name", str, f"{source} module", fix=FIX), f"{source} module", fix=FIX)
            if name in names:
                raise CacheError(f"{source}: module {name} is listed twice; {FIX}", "archive", FIX)
            names.add(name)
            files = {}
            for rel, sha in f(m, "files", dict, f"{source} module {name}", fix=FIX, max_len=100_000).items():
                parts = formats.parse_relpath(rel, f"{source} module {name}", fix=FIX, max_parts=_MAX_PARTS)
                if not ((parts[0] == "jit" and len(parts) > 2 and parts[1] == name)
                        or (parts[0] == "generated" and len(parts) > 1)):
                    raise BuildError(f"{source}: module {name} names {formats.shown(rel)}, outside jit/{name}/ "
                                     f"and generated/; {FIX}")
                files[rel] = formats.parse_sha256(sha, f"{source} module {name} {rel}", fix=FIX)
                for i in range(1, len(parts) + 1):  # a path cannot be a file and a directory at once
                    prefix = "/".join(parts[:i])
                    kind = "file" if i == len(parts) else "dir"
                    if seen.setdefault(prefix, kind) != kind:
                        raise CacheError(f"{source}: {formats.shown(prefix)} is both a file and a directory; {FIX}", "archive", FIX)
            mods.append(Module(name, files))
        entries = []
        for i, e in enumerate(f(obj, "manifest", list, source, default=[], fix=FIX, max_len=10_000)):
            entries.append(parse_entry(e, f"{source} manifest entry {i + 1}"))
    except FormatError as exc:
        raise CacheError(str(exc), "archive", exc.fix or FIX) from None
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
        raise refused(src, f"member {formats.shown(name)} is not a plain relative path ({exc})") from None
    if parts[0] != TOP:
        raise refused(src, f"member {formats.shown(name)} is outside {TOP}/")
    return "/".join(parts[1:])


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
            raise refused(src, f"directory {formats.shown(m.name)} is not part of any module in meta.json")
        return
    if rel != "meta.json" and rel not in files:
        raise refused(src, f"member {formats.shown(m.name)} is not listed in meta.json")
    if total > limits.max_total:
        raise refused(src, f"its files add up to more than the {limits.max_total}-byte cap "
                         f"(cache import --max-bytes)")
