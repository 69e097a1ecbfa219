"""Move a warmed JIT cache: write a manifest's JIT cache entries to a directory or
archive, and install them on another machine (Docker build stages, fleets).

Layout (directory or ``.tar``/``.tar.gz``/``.tgz``)::

    flashinfer-sm120-cache/meta.json          fingerprint, manifest entries, sha256 of every file
    flashinfer-sm120-cache/jit/NAME/...       FlashInfer's module dir: objects, .so, build.ninja, ninja log/deps
    flashinfer-sm120-cache/generated/...      sources FlashInfer generated for the module

A JIT cache entry is only reusable where FlashInfer would write the same
``build.ninja`` (ninja recompiles when a command line changes): the same FlashInfer
release (it keys the cache directory, flashinfer/jit/env.py), the same targets (the
directory name and ``-gencode`` flags) and the same toolkit (``cuda_home`` and the
nvcc release are written into the file, flashinfer/jit/cpp_ext.py).  Import checks
these first and refuses with the mismatch and the fix; it then regenerates each
module's ``build.ninja`` with this machine's FlashInfer, and asks ninja (``-n``)
whether anything would be rebuilt, reporting the truth per module.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from .. import formats
from ..errors import FormatError
from . import ninjadeps, pool
from .manifest import make_spec, parse_entry
from .session import BuildError, Session

__all__ = ["export", "install", "read_meta", "parse_meta", "check_members", "Limits", "Meta", "Module", "TOP"]

TOP = "flashinfer-sm120-cache"
_FORMAT = 1
_SKIP = {".ninja_lock"}
_NINJA_OWN = ("/build.ninja", "/.ninja_log", "/.ninja_deps")
_MAX_META_BYTES = 64 << 20


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _is_archive(path: str) -> bool:
    return path.endswith((".tar", ".tar.gz", ".tgz"))


def export(entries: list[dict], sess: Session, out: str) -> list[str]:
    """Write the JIT cache entries of ``entries`` (built on this machine) to ``out``.

    :returns: the module names written.
    :raises BuildError: a module is not built or not up to date here, or ``out`` exists
        and is not an empty directory (never overwritten).
    """
    from flashinfer.jit import env as jit_env

    if os.path.lexists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise BuildError(f"{out} already exists; choose a new path (an export never overwrites)")
    files: list[tuple[str, Path]] = []
    modules, names = [], []
    gen_root = Path(jit_env.FLASHINFER_GEN_SRC_DIR)
    for entry in entries:
        spec = make_spec(entry, sess.flashinfer)
        job = pool.Job(spec.name, spec.build_dir, spec.ninja_path)
        if not spec.jit_library_path.exists() or pool.dry_run(job):
            raise BuildError(f"{spec.name} is not built for {' '.join(sess.targets)} here; run "
                             "`flashinfer-sm120 build --from MANIFEST` first")
        mod_files = {}
        for f in sorted(spec.build_dir.iterdir()):
            if f.is_file() and not f.is_symlink() and f.name not in _SKIP and not f.name.endswith(".lock"):
                rel = f"jit/{spec.name}/{f.name}"
                files.append((rel, f))
                mod_files[rel] = _sha(f)
        for portable in (entry.get("generated") or {}):
            f = gen_root / portable[len("@GEN@/"):]
            rel = "generated/" + portable[len("@GEN@/"):]
            files.append((rel, f))
            mod_files[rel] = _sha(f)
        modules.append({"name": spec.name, "files": mod_files})
        names.append(spec.name)
    meta = {"format": _FORMAT, "fingerprint": sess.fingerprint(), "modules": modules, "manifest": entries,
            "created": time.time()}
    blob = json.dumps(meta, indent=1).encode()
    if _is_archive(out):
        tmp = out + ".partial"
        with tarfile.open(tmp, "w:gz" if out.endswith("gz") else "w") as tar:
            info = tarfile.TarInfo(f"{TOP}/meta.json")
            info.size, info.mtime, info.mode = len(blob), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(blob))
            for rel, f in files:
                tar.add(str(f), arcname=f"{TOP}/{rel}", recursive=False)
        os.replace(tmp, out)
    else:
        formats.make_private_dirs(Path(out) / TOP)
        root = Path(out) / TOP
        for rel, f in files:
            dest = formats.safe_join(root, rel, out)
            formats.make_private_dirs(dest.parent)
            shutil.copy2(f, dest)
        formats.safe_join(root, "meta.json", out).write_bytes(blob)
    return names


@dataclasses.dataclass(frozen=True)
class Limits:
    """Caps on what an import may write, checked on each member's header before
    any of its bytes are written (``cache import --max-bytes``)."""

    max_total: int = 32 << 30
    max_file: int = 8 << 30
    max_members: int = 100_000


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


def _fail(src: str, what: str) -> BuildError:
    return BuildError(f"{src}: {what}; refusing the whole archive")


def parse_meta(obj: Any, source: str) -> Meta:
    """Check a decoded ``meta.json`` field by field (:mod:`flashinfer_sm120.formats`).

    :raises BuildError: the first field that is not of its grammar, named with a
        cut value; module names are names, file paths relative paths of names
        under ``jit/<module>/`` or ``generated/``, no path is both a file and a
        directory, every digest is SHA-256, manifest entries parse
        (:func:`~flashinfer_sm120.warmup.manifest.parse_entry`)."""
    f = formats.field
    try:
        fmt = f(obj, "format", int, source, fix=_FIX)
        if fmt != _FORMAT:
            raise BuildError(f"{source} is export format {fmt}; this version reads {_FORMAT}")
        fp_obj = f(obj, "fingerprint", dict, source, fix=_FIX)
        fp = {k: f(fp_obj, k, kind, f"{source} 'fingerprint'", fix=_FIX, max_len=4096)
              for k, kind in _FINGERPRINT.items()}
        fp["targets"] = [formats.parse_target(t, f"{source} 'fingerprint'", fix=_FIX) for t in fp["targets"]]
        mods, seen, names = [], {}, set()
        for m in f(obj, "modules", list, source, fix=_FIX, max_len=10_000):
            name = formats.parse_name(f(m, "name", str, f"{source} module", fix=_FIX), f"{source} module", fix=_FIX)
            if name in names:
                raise BuildError(f"{source}: module {name} is listed twice; {_FIX}")
            names.add(name)
            files = {}
            for rel, sha in f(m, "files", dict, f"{source} module {name}", fix=_FIX, max_len=100_000).items():
                parts = formats.parse_relpath(rel, f"{source} module {name}", fix=_FIX)
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


def _safe_rel(name: str, src: str) -> str:
    """``name`` relative to the top folder (an archive member), refusing anything
    that could land outside it: every part must be a name (no ``..``, no absolute
    part, no empty part, no backslash)."""
    try:
        parts = formats.parse_relpath(name, f"{src}: archive member")
    except FormatError as exc:
        raise _fail(src, f"member {formats.shown(name)} is not a plain relative path ({exc})") from None
    if parts[0] != TOP:
        raise _fail(src, f"member {formats.shown(name)} is outside {TOP}/")
    return "/".join(parts[1:])


def _open_tar(src: str) -> tarfile.TarFile:
    try:
        return tarfile.open(src, "r|*")  # streamed: headers are seen one at a time, nothing is held
    except (OSError, tarfile.TarError) as exc:
        raise BuildError(f"cannot read {src}: {formats.shown(str(exc), 200)}; {_FIX}") from None


def _members(src: str, limits: Limits):
    """Each member of the archive ``src`` with its path under TOP, checked on its
    header: a plain relative path under TOP/, a regular file or a directory,
    within the member-count and per-file caps."""
    count = 0
    tar = _open_tar(src)
    try:
        with tar:
            for m in tar:
                count += 1
                if count > limits.max_members:
                    raise _fail(src, f"it has more than {limits.max_members} members")
                rel = _safe_rel(m.name, src)
                if not (m.isfile() or m.isdir()):
                    raise _fail(src, f"member {formats.shown(m.name)} is a link or device")
                if m.isfile() and m.size > limits.max_file:
                    raise _fail(src, f"member {formats.shown(m.name)} is {m.size} bytes, more than the "
                                     f"{limits.max_file}-byte cap (cache import --max-bytes)")
                yield tar, m, rel
    except (OSError, tarfile.TarError, EOFError, zlib.error) as exc:
        raise BuildError(f"cannot read {src}: {formats.shown(str(exc), 200)}; {_FIX}") from None


def check_members(src: str, limits: Limits = Limits()) -> Meta:
    """Check an export without writing anything: every archive member's header
    (under TOP/, a plain relative path, a regular file or directory, within the
    caps), then meta.json (:func:`read_meta`), then that every member is one
    meta.json lists.  A directory export is checked file by file when installed.

    :returns: the parsed meta.json.
    :raises BuildError: the first unsafe member, an unreadable archive, or a bad meta.json."""
    if not os.path.isdir(src):
        for _ in _members(src, limits):
            pass
    meta = read_meta(src, limits)
    if not os.path.isdir(src):
        listed = _listed(meta)
        total = 0
        for _, m, rel in _members(src, limits):
            total += m.size if m.isfile() else 0
            _check_listed(src, m, rel, listed, total, limits)
    return meta


def _listed(meta: Meta) -> tuple[set[str], set[str]]:
    files = {rel for mod in meta.modules for rel in mod.files}
    dirs = {"/".join(rel.split("/")[:i]) for rel in files for i in range(1, rel.count("/") + 1)}
    return files, dirs


def _check_listed(src: str, m: tarfile.TarInfo, rel: str, listed: tuple[set[str], set[str]], total: int,
                  limits: Limits) -> None:
    files, dirs = listed
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
            raw = formats.read_bytes(formats.safe_join(src, f"{TOP}/meta.json", src, fix=_FIX), _MAX_META_BYTES,
                                     follow=False, fix=_FIX)
        else:
            raw = None
            for tar, m, rel in _members(src, limits):
                if rel == "meta.json" and m.isfile():
                    if m.size > _MAX_META_BYTES:
                        raise BuildError(f"{name} is {m.size} bytes, more than {_MAX_META_BYTES}; {_FIX}")
                    raw = tar.extractfile(m).read(m.size)  # type: ignore[union-attr]  (size checked above)
                    break
            if raw is None:
                raise BuildError(f"{src} has no {TOP}/meta.json; {_FIX}")
        return parse_meta(formats.loads_json(raw, name, fix=_FIX), name)
    except FormatError as exc:
        raise BuildError(str(exc)) from None


def _unpack(src: str, into: Path, meta: Meta, limits: Limits) -> Path:
    """The folder to read the export's files from: ``src/TOP`` for a directory
    export (read in place; each file is opened without following links, see
    :func:`_copy_verified`), else the members meta.json lists, extracted below
    ``into`` with tarfile's ``data`` filter (PEP 706) after each header passed the
    caps and the free space was checked, before any byte of it is written."""
    if os.path.isdir(src):
        root = Path(src) / TOP
        if os.path.islink(root) or not root.is_dir():
            raise BuildError(f"{src} has no {TOP}/ folder (or it is a symlink); {_FIX}")
        return root
    listed = _listed(meta)
    total = 0
    for tar, m, rel in _members(src, limits):
        total += m.size if m.isfile() else 0
        _check_listed(src, m, rel, listed, total, limits)
        if m.isdir() or rel == "meta.json":  # meta.json was read already (read_meta)
            continue
        free = shutil.disk_usage(into).free
        if m.size > free:
            raise BuildError(f"{src}: {m.name} needs {m.size} bytes and {into} has {free} free; free space "
                             f"or set TMPDIR to a larger disk")
        try:
            tar.extract(m, into, filter="data")
        except (OSError, tarfile.TarError) as exc:
            raise BuildError(f"cannot unpack {m.name} from {src} into {into}: "
                             f"{formats.shown(str(exc), 200)}; free space or set TMPDIR") from None
    return into / TOP


def _copy_verified(src: Path, dest: Path, sha: str, limit: int) -> None:
    """Copy ``src`` (opened without following a link, a regular file only) to a
    new file next to ``dest``, hashing while copying, then rename it over ``dest``
    only if the digest is ``sha``."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(src, flags)
    part = None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BuildError(f"{src} is not a regular file; {_FIX}")
        os.set_blocking(fd, True)
        h, size = hashlib.sha256(), 0
        part = dest.with_name(f".{dest.name}.import-{os.getpid()}")
        out = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                      0o644)
        with os.fdopen(out, "wb") as fo:
            while True:
                block = os.read(fd, 1 << 20)
                if not block:
                    break
                size += len(block)
                if size > limit:
                    raise BuildError(f"{src} is more than the {limit}-byte cap (cache import --max-bytes)")
                h.update(block)
                fo.write(block)
        if h.hexdigest() != sha:
            raise BuildError(f"{src}: its checksum does not match meta.json; {_FIX}")
        os.replace(part, dest)
        part = None
    finally:
        os.close(fd)
        if part is not None:
            try:
                os.unlink(part)
            except OSError:
                pass


def _plan(meta: Meta, root: Path, targets: dict[str, Path], src: str) -> list[tuple[Module, dict[str, tuple[Path, Path]]]]:
    """For each module, ``{rel: (file in the export, destination)}``; every
    destination by :func:`flashinfer_sm120.formats.safe_join` under its target
    root, every source by the same under the export (no link followed)."""
    out = []
    for mod in meta.modules:
        paths = {}
        for rel in mod.files:
            kind, rest = rel.split("/", 1)
            try:
                paths[rel] = (formats.safe_join(root, rel, f"{src}", fix=_FIX),
                              formats.safe_join(targets[kind], rest, f"{src}: meta.json", fix=_FIX))
            except FormatError as exc:
                raise BuildError(str(exc)) from None
            if not paths[rel][0].is_file() or paths[rel][0].is_symlink():
                raise BuildError(f"{src}: {rel} is missing or not a regular file; {_FIX}")
        out.append((mod, paths))
    return out


def _mismatch(theirs: dict, ours: dict) -> str | None:
    fixes = {
        "flashinfer": "install the same flashinfer-python on both machines (the JIT cache is keyed by its version)",
        "targets": "export for this machine's targets (`flashinfer-sm120 build --from M --arch ...` then "
                   "`cache export --arch ...`), or pass the archive's targets with --arch here",
        "cuda_version": "use the same nvcc release on both machines (e.g. the same cuda-toolkit pip pin)",
        "cuda_home": "FlashInfer writes CUDA_HOME into each build.ninja, so a different path recompiles "
                     "everything: give both machines the same toolkit path and FLASHINFER_SM120_CACHE_DIR",
        "jit_dir": "FlashInfer writes its JIT dir into each build.ninja: use the same FLASHINFER_WORKSPACE_BASE "
                   "(default: $HOME) on both machines",
    }
    for k, fix in fixes.items():
        if theirs.get(k) != ours.get(k):
            return f"archive has {k} {theirs.get(k)!r}, this machine {ours.get(k)!r}: {fix}"
    return None


def install(src: str, sess: Session, *, force: bool = False, limits: Limits = Limits()) -> list[dict]:
    """Install an exported JIT cache into this machine's FlashInfer JIT cache.

    Each module is reported with ``status``: ``installed``, ``already present``,
    ``kept existing`` (a different entry is here; ``force`` replaces it) or ``stale``
    (installed, but ninja would rebuild it here; ``why`` says which command).

    :raises BuildError: unreadable source, an unsafe archive member, a file whose
        checksum does not match meta.json, a fingerprint mismatch (message names
        the mismatch and the fix), or a full disk.
    """
    from flashinfer.jit import env as jit_env

    meta = read_meta(src, limits)
    problem = _mismatch(meta.fingerprint, sess.fingerprint())
    if problem:
        raise BuildError(f"refusing {src}: {problem}")
    targets = {"jit": Path(jit_env.FLASHINFER_JIT_DIR), "generated": Path(jit_env.FLASHINFER_GEN_SRC_DIR)}
    with tempfile.TemporaryDirectory(prefix="fi-sm120-import-") as tmp:
        root = _unpack(src, Path(tmp), meta, limits)
        try:
            return _install_from(root, meta, targets, sess, force, limits, src)
        except OSError as exc:
            full = " (the disk is full)" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
            raise BuildError(f"cannot install {src}: {formats.shown(str(exc), 200)}{full}; free space in "
                             f"{targets['jit']} or set FLASHINFER_WORKSPACE_BASE elsewhere") from None


def _install_from(root: Path, meta: Meta, targets: dict[str, Path], sess: Session, force: bool,
                  limits: Limits, src: str) -> list[dict]:
    entries = {e["name"]: e for e in meta.manifest}
    report = []
    for mod, paths in _plan(meta, root, targets, src):
        # build.ninja and ninja's logs are rewritten here by design (see _settle)
        content = {rel: d for rel, (_, d) in paths.items() if not rel.endswith(_NINJA_OWN)}
        differing = [str(d) for rel, d in content.items() if d.is_file() and _sha(d) != mod.files[rel]]
        present = all(d.is_file() and _sha(d) == mod.files[rel] for rel, d in content.items())
        if differing and not force:
            report.append({"module": mod.name, "status": "kept existing",
                           "why": f"a different {differing[0]} is already here; pass --force to replace it"})
            continue
        if not present:
            for rel, (s_path, d) in paths.items():
                formats.make_private_dirs(d.parent)
                if d.is_dir() and not d.is_symlink():
                    raise BuildError(f"{src}: {rel} would replace the directory {d}; remove it first")
                _copy_verified(s_path, d, mod.files[rel], limits.max_file)
        report.append({"module": mod.name, "status": "already present" if present else "installed",
                       "replaced": differing})
    for r in report:
        if r["status"] in ("installed", "already present"):
            r.update(_settle(entries.get(r["module"]), sess))
    return report


def _settle(entry: dict | None, sess: Session) -> dict:
    """Regenerate the module's build.ninja with this FlashInfer, make the imported outputs
    newer than this machine's inputs (objects before the library), record that in ninja's
    log (``ninja -t restat``), and ask ninja whether it would rebuild."""
    if entry is None:
        return {"status": "stale", "why": "meta.json has no manifest entry for it"}
    spec = make_spec(entry, sess.flashinfer)
    from .session import write_ninjas

    write_ninjas([spec])
    # Make the imported outputs newer than this machine's inputs (its pip install may be
    # later than the export): objects first, the library last; then tell ninja's logs.
    now = time.time_ns()
    outs = sorted(p for p in spec.build_dir.iterdir() if p.suffix == ".o")
    if spec.jit_library_path.exists():
        outs.append(spec.jit_library_path)
    stamps = {}
    for i, p in enumerate(outs):
        ns = now + i * 1_000_000
        os.utime(p, ns=(ns, ns))
        stamps[str(p.resolve())] = os.stat(p).st_mtime_ns
    job = pool.Job(spec.name, spec.build_dir, spec.ninja_path)
    ninjadeps.restamp(str(spec.build_dir / ".ninja_deps"), stamps)
    subprocess.run(pool._cmd(job, "-t", "restat"), capture_output=True, timeout=120)
    left = pool.dry_run(job)
    if left:
        return {"status": "stale", "why": f"ninja would run: {left[0][:300]}"}
    return {}
