"""What a cache export is, read as untrusted input and written by ``cache export`` (threat-model: P6, P7):
``flashinfer-sm120-cache/`` with ``meta.json`` (fingerprint, modules, sha256 of every file) and ``jit/NAME/FILE``
(FlashInfer's module dir); a new directory or a ``.tar``/``.tar.gz``/``.tgz``."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import os
import resource
import shutil
import stat
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from flashinfer_sm120.core.facts import buildline
from flashinfer_sm120.core.facts.arch import nvcc_spelling
from flashinfer_sm120.core.jitenv import record
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.formats.grammar import parse, parse_relpath
from flashinfer_sm120.safety.formats.grammar import safe_join
from flashinfer_sm120.safety.fs.places import make_private_dirs
from flashinfer_sm120.safety.ownership import deepest_existing
from flashinfer_sm120.safety.formats.fields import field
from flashinfer_sm120.safety.fs.atomic import write_atomic
from flashinfer_sm120.warmup.moddir import dry_run
from flashinfer_sm120.warmup.pool import Job
from flashinfer_sm120.warmup.kinds import TOP
from flashinfer_sm120.warmup.replay import make_spec
from flashinfer_sm120.warmup.session import BuildError, Session

FORMAT = 1
MAX_META_BYTES = 64 << 20  # meta.json carries a manifest entry per module
FIX = "give the path `flashinfer-sm120 cache export` wrote"
_FINGERPRINT = {"flashinfer": str, "targets": list, "cuda_version": str, "cuda_home": str, "jit_dir": str}
#: Archive names `cache export` writes; any other archive-looking name is refused, never made a directory.
ARCHIVES = (".tar", ".tar.gz", ".tgz")
_NOT_WRITTEN = (".zip", ".gz", ".xz", ".txz", ".bz2", ".tbz", ".tbz2", ".zst", ".tzst", ".lz4", ".lzma", ".7z", ".rar",
                ".z")


class CacheError(BuildError):
    """A refused export or import: ``kind`` (``archive``: not what `cache export` writes; ``mismatch``: made
    for another machine; ``limit``: a cap; else :data:`~flashinfer_sm120.safety.oserrors.BY_ERRNO`'s).  P8"""

    def __init__(self, message: str, kind: str = "archive", fix: str = FIX) -> None:
        super().__init__(message, fix)
        self.kind = kind


@contextlib.contextmanager
def format_errors():
    """A :class:`FormatError` of the bounded readers raised as the refusal of the export."""
    try:
        yield
    except FormatError as exc:
        raise CacheError(str(exc), "archive", exc.fix or FIX) from None


@dataclasses.dataclass(frozen=True)
class Limits:
    """Caps of an export and an import, the same for an archive and a directory (P6, P7)."""

    max_total: int = 32 << 30
    max_file: int = 8 << 30
    max_members: int = 100_000
    max_seconds: float = 600.0

    def max_stream(self) -> int:
        """Most bytes one pass may read out of an archive's decompressor (P6)."""
        return self.max_total + MAX_META_BYTES + (self.max_members + 2) * 3 * 512


@dataclasses.dataclass(frozen=True)
class Module:
    """One module of an export: FlashInfer's name, ``{jit/<name>/<file>: sha256}``, the name ``build`` gave it."""

    name: str
    files: dict[str, str]
    label: str = ""


@dataclasses.dataclass(frozen=True)
class Meta:
    fingerprint: dict[str, Any]
    modules: tuple[Module, ...]
    manifest: tuple[dict, ...]


def refused(src: str, what: str) -> CacheError:
    return CacheError(f"{src}: {what}; refusing the whole archive; {FIX}")


def parse_meta(obj: Any, source: str) -> Meta:
    """Check a decoded ``meta.json`` field by field; :raises CacheError: the first field off its grammar."""
    f = field
    with format_errors():
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
        fp["targets"] = [parse("target", t, f"{source} 'fingerprint'", fix=FIX) for t in fp["targets"]]
        if "build_vars" in fp_obj:  # since flashinfer-sm120 0.2.x; older exports lack it
            fp["build_vars"] = buildline.checked(fp_obj["build_vars"])
            if fp["build_vars"] is None:
                raise CacheError(f"{source}: 'fingerprint' 'build_vars' is not a set of FlashInfer's build-line "
                                 f"variables; {FIX}")
        mods = []
        for m in f(obj, "modules", list, source, fix=FIX, max_len=10_000):
            name = parse("name", f(m, "name", str, f"{source} module", fix=FIX), f"{source} module", fix=FIX)
            files = {}
            for rel, sha in f(m, "files", dict, f"{source} module {name}", fix=FIX, max_len=100_000).items():
                parts = parse_relpath(rel, f"{source} module {name}", fix=FIX, max_parts=3)
                if parts[:2] != ("jit", name) or len(parts) != 3:  # 0.2.0's exports also carried generated/
                    raise CacheError(f"{source}: module {name} names {shown(rel)}, not a file in jit/{name}/; {FIX}")
                files[rel] = parse("sha256", sha, f"{source} module {name} {rel}", fix=FIX)
            label = f(m, "label", str, f"{source} module {name}", default=name, fix=FIX)
            mods.append(Module(name, files, parse("name", label, f"{source} module {name} 'label'", fix=FIX)))
        entries = [record.parse_entry(e, f"{source} manifest entry {i + 1}")
                   for i, e in enumerate(f(obj, "manifest", list, source, default=[], fix=FIX, max_len=10_000))]
    return Meta(fp, tuple(mods), tuple(entries))


def member_rel(name: str, src: str) -> str:
    """Archive member ``name`` relative to the top folder; every part a name (nothing can land outside)."""
    try:  # the top folder and meta.json's jit/NAME/FILE
        parts = parse_relpath(name, f"{src}: archive member", max_parts=4)
    except FormatError as exc:
        raise refused(src, f"member {shown(name)} is not a plain relative path ({exc})") from None
    if parts[0] != TOP:
        raise refused(src, f"member {shown(name)} is outside {TOP}/")
    return "/".join(parts[1:])


def over_cap(src: str, what: str, limits: Limits, *, per_file: bool, total: int = 0) -> CacheError:
    """The refusal of ``src`` for ``what`` over the per-file cap or ``--max-bytes`` (the files' ``total``, which it
    names with the cap).  P6, P8"""
    if per_file:
        return CacheError(f"{src}: {what}, over the per-file cap of {limits.max_file} bytes (which no "
                          f"option changes); refusing the whole export; {FIX}")
    fix = f"pass --max-bytes {total} or more if you trust this export, or export fewer modules"
    return CacheError(f"{src}: {what}, over the {limits.max_total}-byte cap of --max-bytes (default 32G); "
                      f"refusing the whole export; {fix}", "limit", fix)


def check_fsize(src: str, what: str, size: int) -> None:
    """:raises CacheError: writing ``what`` (``size`` bytes) would pass this process's ``ulimit -f``.  P6, P8"""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY or size <= limit:
        return
    fix = f"raise the limit (`ulimit -f unlimited`, or above {size} bytes) in the shell that runs the command"
    raise CacheError(f"{src}: {what} is {size} bytes, more than this process's file-size limit of {limit} bytes "
                      f"(ulimit -f, RLIMIT_FSIZE); {fix}", "limit", fix)


def check_sizes(src: str, files: list[tuple[str, int]], limits: Limits, elsewhere: str,
                archive: str | None = None) -> None:
    """Refuse, before anything is written, ``(destination, lstat size)`` pairs over the caps, ``ulimit -f``
    or the free space of their disks (a sparse file is copied whole); one rule for export and import.  P6, P7"""
    if len(files) > limits.max_members:
        raise CacheError(f"{src}: it has {len(files)} files, more than {limits.max_members}; refusing the whole "
                         f"export; {FIX}")
    total, need = 0, {}
    for dest, size in files:
        if size > limits.max_file:
            raise over_cap(src, f"{dest} is {size} bytes", limits, per_file=True)
        total += size
        if total > limits.max_total:
            total = sum(size for _, size in files)
            raise over_cap(src, f"its files add up to {total} bytes", limits, per_file=False, total=total)
        if not archive:
            check_fsize(src, str(dest), size)
            root = deepest_existing(str(dest))
            made = need.setdefault(root, ([], set()))
            made[0].append(size)
            parent = os.path.dirname(os.path.abspath(dest))
            while parent != root and parent not in made[1]:  # each new directory: a block of its own
                made[1].add(parent)
                parent = os.path.dirname(parent)
    if archive:
        check_fsize(src, "the archive (its files before compression)", total)  # a .tar.gz is known only after
        need[deepest_existing(archive)] = ([_tar_bound(files, archive)], set())
    for root, (sizes, dirs) in need.items():
        n, free = _on_disk(root, sizes, len(dirs)), shutil.disk_usage(root).free
        if n > free:
            fix = f"free space on the disk of {root}, or {elsewhere}"
            raise CacheError(f"{src} needs up to {n} bytes in {root} and that disk has {free} free; {fix}",
                             "space", fix)


def _tar_bound(files: list[tuple[str, int]], archive: str) -> int:
    """An upper bound of the bytes ``tarfile`` writes for ``files`` (each a header, a pax header with its records,
    the data padded to 512; the end blocks, the 10240-byte record), gzip's worst case added for a .tar.gz."""
    n = sum(1024 + _up(len(os.fsencode(dest)) + 512, 512) + _up(size, 512) for dest, size in files)
    n = _up(n + 1024, tarfile.RECORDSIZE)
    return n if archive.lower().endswith(".tar") else n + n // 1024 + 1024  # zlib's deflateBound, the gzip header


def _on_disk(root: str, sizes: list[int], dirs: int) -> int:
    """An upper bound of the space files of ``sizes`` and ``dirs`` new directories take on ``root``'s file
    system: each rounded up to its block, plus one block in 256 for indirect/extent blocks."""
    st = os.statvfs(root)
    block = max(st.f_frsize, st.f_bsize, 512)
    blocks = sum(_up(size, block) // block for size in sizes) + dirs
    return (blocks + _up(blocks, 256) // 256) * block


def _up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def copy_file(src: Path, dest: Path, size: int, sha: str | None = None) -> None:
    """Copy the regular file ``src`` (no link followed) to ``dest`` by the one atomic writer, refused past
    ``size``, the bytes the caps were checked on; with ``sha``, put in place only if its digest is that.  P5, P6"""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)

    def copy(fo) -> None:
        h, n = hashlib.sha256(), 0
        for block in iter(lambda: os.read(fd, 1 << 20), b""):
            n += len(block)
            if n > size:
                raise CacheError(f"{src} grew past the {size} bytes its caps were checked on; {FIX}")
            h.update(block)
            fo.write(block)
        if sha is not None and h.hexdigest() != sha:
            raise CacheError(f"{src}: its checksum does not match meta.json; {FIX}")

    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CacheError(f"{src} is not a regular file; {FIX}")
        os.set_blocking(fd, True)
        write_atomic(str(dest), copy, mode=0o644 & ~umask(), replace=sha is not None)  # as open() would make it
    finally:
        os.close(fd)


def umask() -> int:
    """This process's umask; 077 while it is read (never less private for a file made meanwhile)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def nvcc_targets(targets: list[str]) -> str:
    """``['12.0f', '12.1f']`` -> ``sm_120f sm_121f``."""
    return " ".join(nvcc_spelling(t) for t in targets)


def built_targets() -> dict[str, int]:
    """``{target set ("sm_120f sm_121f"): modules built}`` in FlashInfer's ``<workspace>/<release>/<targets>/``,
    read without importing anything (an export without ``--arch`` and without a GPU)."""
    from flashinfer_sm120.core.facts.workspace import workspace_path
    from flashinfer_sm120.core.patch.state import flashinfer_version

    root = Path(workspace_path()[0]) / (flashinfer_version() or "none")
    out = {}
    for key in sorted(os.listdir(root)) if root.is_dir() else ():
        built = {so.parent.name for pattern in ("*/cached_ops/*/*.so", "cached_ops/*/*.so")
                 for so in (root / key).glob(pattern) if so.stem == so.parent.name}
        if built:
            out[" ".join("sm_" + k for k in key.split("_"))] = len(built)
    return out


def check_out(out: str) -> None:
    """Refuse ``out`` unless it is absent or an empty directory (P5), named as a directory or one of
    :data:`ARCHIVES` (``usage`` for another archive name)."""
    name = out.lower()
    if not name.endswith(ARCHIVES) and name.endswith(_NOT_WRITTEN):
        fix = f"name the archive {', '.join(ARCHIVES[:-1])} or {ARCHIVES[-1]}, or give a directory"
        raise CacheError(f"{out} names an archive `cache export` cannot write; {fix}", "usage", fix)
    if os.path.lexists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        fix = "choose a new path (an export never overwrites)"
        raise CacheError(f"{out} already exists; {fix}", "exists", fix)


def export(labelled: list[tuple[str, dict]], sess: Session, out: str, *, limits: Limits = Limits(),
           rebuild: str = "flashinfer-sm120 build") -> list[tuple[str, str]]:
    """Write the modules of ``(build's name, manifest entry)`` pairs (built here, else ``rebuild`` is the fix) to
    ``out``, a directory or an archive, with the same checks and caps for both (P4-P7); ``(build's name,
    FlashInfer's)`` of each written."""
    from flashinfer_sm120.safety.ownership import check_place

    check_out(out)
    files: list[tuple[str, Path, int]] = []  # (path in the export, file here, its size)
    mods = []
    for label, entry in labelled:
        spec = make_spec(entry, sess.flashinfer)
        if not spec.jit_library_path.exists() or dry_run(Job(spec.name, spec.build_dir, spec.ninja_path)):
            fix = f"run '{rebuild}' first (with the same CUDA_HOME/PATH as that build if it used another nvcc)"
            raise BuildError(f"{label} is not built (or not up to date) for {nvcc_targets(sess.targets)} with nvcc "
                             f"{sess.cuda_version} in {sess.jit_dir}; {fix}", fix)
        mine = _module_files(spec.build_dir, spec.name, label)
        files += mine
        mods.append({"name": spec.name, "label": label, "files": {rel: file_sha256(f) for rel, f, _ in mine}})
    blob = json.dumps({"format": FORMAT, "fingerprint": sess.fingerprint(), "modules": mods,
                       "manifest": [entry for _, entry in labelled],
                       "created": time.time()}, indent=1).encode()
    # threat-model: P7 (what export writes, import accepts: checked by the import's own grammar first,
    # which also makes each file's member name one the import's walk accepts)
    parse_meta(json.loads(blob), "the export's meta.json")
    archive = out.lower().endswith(ARCHIVES)
    check_sizes(out, [(os.path.join(out, TOP, rel), size) for rel, _, size in files]
                + [(os.path.join(out, TOP, "meta.json"), len(blob))], limits, "export to another disk",
                archive=out if archive else None)
    # threat-model: P4, P7: both forms go where another user can neither write nor replace what we put
    # (an archive there could be swapped for one carrying their .so; a planted link could redirect writes)
    problem = check_place(os.path.dirname(os.path.abspath(out)) if archive else out,
                          "the export's directory" if archive else "the export directory",
                          "export to a new path in a directory of your own")
    if problem:
        raise CacheError(str(problem), "place", problem.fix)
    if archive:
        _write_archive(out, blob, files)
    else:
        _write_directory(out, blob, files)
    return [(m["label"], m["name"]) for m in mods]


def _module_files(build_dir: Path, name: str, label: str) -> list[tuple[str, Path, int]]:
    """``(path in the export, file, size)`` of a module's files here; a link or a special file in this workspace
    (the module's directory included) is refused naming it, never dropped from the export or followed (P5, P8)."""
    mine = []
    for f in [build_dir, *sorted(build_dir.iterdir())]:
        st = os.lstat(f)
        if f.name.endswith((".lock", ".ninja_lock")) or (f != build_dir and stat.S_ISDIR(st.st_mode)):
            continue
        if not (stat.S_ISDIR if f == build_dir else stat.S_ISREG)(st.st_mode):
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            fix = f"remove {shown(str(f), 1000)} and build {label} again here (`flashinfer-sm120 build`), then export"
            raise CacheError(f"{shown(str(f), 1000)} in this machine's FlashInfer JIT workspace is {what}, not what "
                             f"FlashInfer's build wrote; {fix}", "path", fix)
        if f != build_dir:
            mine.append((f"jit/{name}/{f.name}", f, st.st_size))
    return mine


def _appeared(out: str) -> BuildError:
    return BuildError(f"{out} appeared while the export was written; choose a new path (an export never overwrites)")


def _write_directory(out: str, blob: bytes, files: list[tuple[str, Path, int]]) -> None:
    """Write into a new private directory beside ``out``, renamed onto it when whole (onto nothing or an
    empty directory): a failed export leaves nothing behind.  P4, P5"""
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}.", suffix=".partial",
                           dir=os.path.dirname(os.path.abspath(out)))
    try:
        root = Path(tmp) / TOP
        make_private_dirs(root)
        for rel, f, size in files:
            dest = safe_join(root, rel, out)
            make_private_dirs(dest.parent)
            copy_file(f, dest, size)  # nothing there is followed or replaced
            shutil.copystat(f, dest)
        write_atomic(str(root / "meta.json"), blob, mode=0o644 & ~umask(), replace=False)
        os.chmod(tmp, 0o777 & ~umask())  # as a plain mkdir would have made it
        try:
            os.rename(tmp, out)  # replaces only an empty directory; never a file or a full directory
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                raise _appeared(out) from None
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_archive(out: str, blob: bytes, files: list[tuple[str, Path, int]]) -> None:
    """The archive, by the one atomic writer (nothing that appeared at ``out`` meanwhile is replaced).  P5"""
    def write(fh) -> None:
        with tarfile.open(fileobj=fh, mode="w:gz" if out.lower().endswith("gz") else "w") as tar:
            info = tarfile.TarInfo(f"{TOP}/meta.json")
            info.size, info.mtime, info.mode = len(blob), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(blob))
            for rel, f, _ in files:
                tar.add(str(f), arcname=f"{TOP}/{rel}", recursive=False)

    try:
        write_atomic(os.path.abspath(out), write, mode=0o666 & ~umask(), replace=False)  # as open() would make it
    except FileExistsError:
        raise _appeared(out) from None
