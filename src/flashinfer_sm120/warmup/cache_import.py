"""``cache import``: an archive or a directory through one install step (threat-model: P7), reusable only
where FlashInfer writes the same ``build.ninja`` (flashinfer/jit/env.py, cpp_ext.py): checked first, then
``ninja -n`` says whether anything would be rebuilt."""

from __future__ import annotations

import contextlib
import os
import platform
import tarfile
import time
from pathlib import Path

from flashinfer_sm120.core.facts import buildline
from flashinfer_sm120.safety import oserrors
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.formats.grammar import safe_join
from flashinfer_sm120.safety.fs.places import make_private_dirs
from flashinfer_sm120.safety.formats.reads import loads_json, read_bytes
from flashinfer_sm120.safety.formats.tar import TarReader
from flashinfer_sm120.safety.fs.atomic import make_private
from flashinfer_sm120.warmup import moddir, pool
from flashinfer_sm120.warmup.cache import (FIX, MAX_META_BYTES, CacheError, Limits, Meta, Module,
                                           check_fsize, check_sizes, copy_file, file_sha256, format_errors,
                                           member_rel, nvcc_targets, over_cap, parse_meta, refused)
from flashinfer_sm120.warmup.kinds import TOP, instead
from flashinfer_sm120.warmup.replay import CannotRegenerate, make_spec
from flashinfer_sm120.warmup.session import Session

def _walk(src: str, limits: Limits, meta: Meta | None = None, into: Path | None = None) -> Meta:
    """The one bounded pass over the archive ``src``: each member checked on its header against the caps and
    meta.json (its first member, unless given) before its data is read; with ``into``, extracted there.  P6, P7"""
    total = 0
    with format_errors(), TarReader(src, max_bytes=limits.max_stream(), max_seconds=limits.max_seconds, fix=FIX,
                                    cap="the files' cap of cache import --max-bytes, plus meta.json and headers") as tar:
        for count, m in enumerate(tar, 1):
            rel = member_rel(m.name, src)
            if count > limits.max_members:
                raise refused(src, f"it has more than {limits.max_members} members")
            if not (m.isfile() or m.isdir()):
                raise refused(src, f"member {shown(m.name)} is a link or device")
            if count == 1:  # meta.json: within MAX_META_BYTES, not the files' caps
                if rel != "meta.json" or m.size > MAX_META_BYTES:
                    raise refused(src, f"its first member is {shown(m.name)} ({m.size} bytes), not {TOP}/meta.json "
                                       f"of at most {MAX_META_BYTES} bytes")
                name = f"{src}: {TOP}/meta.json"
                meta = meta or parse_meta(loads_json(tar.read(m), name, fix=FIX), name)
                files = {rel for mod in meta.modules for rel in mod.files}
                dirs = {"", "jit", *(f"jit/{mod.name}" for mod in meta.modules)}
                continue
            size = m.size if m.isfile() else 0
            if size > limits.max_file:
                raise over_cap(src, f"member {shown(m.name)} is {size} bytes", limits, per_file=True)
            total += size
            if total > limits.max_total:
                raise over_cap(src, f"its files add up to at least {total} bytes (counted up to this member)", limits,
                               per_file=False, total=total)
            if rel not in (files if m.isfile() else dirs):
                raise refused(src, f"member {shown(m.name)} is not listed in meta.json")
            if into is not None and m.isfile():
                _extract(src, tar, m, into)
    if meta is None:
        raise refused(src, f"it has no members (no {TOP}/meta.json)")
    return meta


def _extract(src: str, tar: TarReader, m: tarfile.TarInfo, into: Path) -> None:
    check_fsize(src, shown(m.name), m.size)
    try:
        tar.extract(m, into)  # threat-model: P6 (PEP 706 data filter)
    except OSError as exc:
        p = oserrors.describe(exc, into, "set TMPDIR to another directory")
        raise CacheError(f"{src}: unpacking {shown(m.name)}: {p.message}; {p.fix}", p.kind, p.fix) from None


def _top(src: str) -> Path:
    root = Path(src) / TOP
    if os.path.islink(root) or not root.is_dir():
        raise CacheError(f"{src} has no {TOP}/ folder (or it is a symlink); {FIX}")
    return root


def check(src: str, limits: Limits = Limits()) -> Meta:
    """The meta.json of an export, checked without writing: an archive whole; a directory's meta.json and its
    entries' names, as an archive's members are (P7; its files are checked one by one when installed); a
    manifest or the folder inside an export is refused naming what to give instead."""
    try:
        return _check(src, limits)
    except CacheError:
        other = instead(src, "export")
        if other is None:
            raise
        raise CacheError(other[0], "archive", other[1]) from None


def _check(src: str, limits: Limits) -> Meta:
    if not os.path.isdir(src):
        return _walk(src, limits)
    name, top = f"{src}/{TOP}/meta.json", _top(src)
    with format_errors():
        raw = read_bytes(safe_join(top, "meta.json", src, fix=FIX), MAX_META_BYTES, follow=False, fix=FIX)
        meta = parse_meta(loads_json(raw, name, fix=FIX), name)
    listed: dict[str, set[str]] = {"": {"meta.json", "jit"}, "jit": {mod.name for mod in meta.modules}}
    for rel in (r for mod in meta.modules for r in mod.files):  # jit/NAME/FILE, by meta.json's grammar
        folder, _, base = rel.rpartition("/")
        listed.setdefault(folder, set()).add(base)
    for folder, names in listed.items():  # stops at the first entry not listed: bounded whatever the tree (P6)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(top / folder) as it:
            for entry in it:
                if entry.name not in names:
                    member = "/".join(filter(None, (TOP, folder, entry.name)))
                    raise refused(src, f"member {shown(member)} is not listed in meta.json")
    return meta


def unpack(src: str, into: Path, meta: Meta, limits: Limits) -> Path:
    """The folder to read the export's files from: ``src/TOP`` of a directory, else the archive unpacked
    below ``into``."""
    if os.path.isdir(src):
        return _top(src)
    if not hasattr(tarfile, "data_filter"):  # PEP 706 came in 3.10.12, 3.11.4, 3.12 (Debian 12: 3.11.2)
        fix = ("use a Python with tarfile's extraction filters (3.10.12+, 3.11.4+, 3.12+), or export a "
               "directory (cache export OUT, OUT not ending in .tar...) and import that")
        raise CacheError(f"cannot unpack {src}: this Python {platform.python_version()} has no tarfile extraction "
                         f"filters, and archives are unpacked only with the 'data' filter", "python", fix)
    _walk(src, limits, meta, into)
    return into / TOP


#: What must be the same on both machines (FlashInfer writes it into each build.ninja), with the fix.
_SAME = {
    "flashinfer": "install the same flashinfer-python on both machines (the JIT cache is keyed by its version)",
    "targets": "export for this machine's targets (`flashinfer-sm120 build --from M --arch ...` then "
               "`cache export --arch ...`), or pass the archive's targets with --arch here",
    "cuda_version": "use the same nvcc release on both machines (e.g. the same cuda-toolkit pip pin)",
    "cuda_home": "FlashInfer writes CUDA_HOME into each build.ninja, so a different path recompiles "
                 "everything: give both machines the same toolkit path and FLASHINFER_SM120_CACHE_DIR",
    "jit_dir": "FlashInfer writes its JIT dir into each build.ninja: use the same FLASHINFER_WORKSPACE_BASE "
               "(default: $HOME) on both machines",
}


def _said(key: str, value) -> str:
    return repr(nvcc_targets(value)) if key == "targets" and isinstance(value, list) else repr(value)


def _mismatch(src: str, theirs: dict, ours: dict) -> None:
    """Refuse the first of :data:`_SAME` (that ``ours`` has), then build-line variable, that differs."""
    for k, fix in _SAME.items():
        if k in ours and theirs.get(k) != ours[k]:
            raise CacheError(f"refusing {src}: archive has {k} {_said(k, theirs.get(k))}, this machine "
                             f"{_said(k, ours[k])}: {fix}", "mismatch", fix)
    changed = buildline.changes(theirs["build_vars"], ours["build_vars"] or {}) if "build_vars" in theirs and "build_vars" in ours else []
    if changed:
        said = "; ".join(f"{c.name}={c.built or '(unset)'} there, {c.now or '(unset)'} here" for c in changed)
        fix = "set them here as there, or build here"
        raise CacheError(f"refusing {src}: the archive was built with other FlashInfer build-line variables "
                         f"({said}): they change every build line, so every module would be rebuilt; {fix}",
                         "mismatch", fix)


def precheck(src: str, meta: Meta) -> None:
    """Refuse, before FlashInfer's set-up creates files (P4), another FlashInfer release (by release
    number: metadata may spell a local build otherwise) or a JIT dir outside this workspace."""
    from packaging.version import InvalidVersion, Version

    from flashinfer_sm120.core.facts.workspace import workspace_path
    from flashinfer_sm120.core.patch.state import flashinfer_version

    ours, theirs = {}, meta.fingerprint
    try:
        if Version(theirs["flashinfer"]).release != Version(flashinfer_version() or "0").release:
            ours["flashinfer"] = flashinfer_version()
    except InvalidVersion:
        pass  # told after set-up, by the whole fingerprint
    root = workspace_path()[0]
    if not str(theirs["jit_dir"]).startswith(root.rstrip(os.sep) + os.sep):
        ours["jit_dir"] = os.path.join(root, "...")
    _mismatch(src, theirs, ours)


def install(src: str, meta: Meta, sess: Session, *, force: bool = False, limits: Limits = Limits()) -> list[dict]:
    """Install the export ``src`` (``meta`` from :func:`check`), an archive or a directory by one step (P5-P7); a
    report per module: ``installed``, ``already present``, ``kept existing``, ``refused``, ``failed``, ``stale``."""
    from flashinfer.jit import env as jit_env

    _mismatch(src, meta.fingerprint, sess.fingerprint())
    with make_private("fi-sm120-import-") as tmp:  # swept by the next import if this one is killed
        return _install_from(unpack(src, Path(tmp), meta, limits), meta, Path(jit_env.FLASHINFER_JIT_DIR), sess,
                             force, limits, src)


def _install_from(root: Path, meta: Meta, jit_dir: Path, sess: Session, force: bool, limits: Limits,
                  src: str) -> list[dict]:
    """The one install step for an archive (unpacked to ``root``) and a directory (``root`` in it)."""
    try:
        plan = _plan(meta, root, jit_dir, src)
        check_sizes(src, [(str(d), n) for _, files in plan for _, d, n in files.values()], limits, _ELSEWHERE)
    except OSError as exc:  # threat-model: P8 (the words come from the errno)
        raise _os_error(exc, exc.filename or jit_dir) from None
    entries = {e["name"]: e for e in meta.manifest}
    report = []
    for mod, files in plan:
        # threat-model: P4 -- decided before the lock is taken, which creates cached_ops/tmp/<name>.lock:
        # a refused module (a name of the export's choosing) leaves nothing in the JIT dir
        why = _refusal(entries.get(mod.name), mod, sess, jit_dir)
        if why:  # before any file of it is installed
            report.append({"module": mod.label, "name": mod.name, "status": "refused", "why": why})
            continue
        made: list[Path] = []  # what this import wrote of the module that was not there before
        try:
            lock = moddir.lock_path(jit_dir, mod.name)
            make_private_dirs(lock.parent)  # 0700 if absent
            # threat-model: P5 -- FlashInfer's own per-module lock: a server building it and we take turns
            with moddir.held(lock, mod.name):
                try:
                    r = _install_module(mod, files, force, made)
                    if r["status"] in ("installed", "already present"):
                        r.update(_settle(entries.get(mod.name), sess))
                except BaseException:
                    _undo(made)  # a failed module is left as it was, never half installed
                    raise
        except OSError as exc:  # a full disk, a permission: said for this module; those before stay installed
            err = _os_error(exc, exc.filename or jit_dir)
            report.append({"module": mod.label, "name": mod.name, "status": "failed", "why": str(err),
                           "kind": err.kind, "fix": err.fix})
            break
        report.append(r)
    return report


def _plan(meta: Meta, root: Path, jit_dir: Path, src: str) -> list[tuple[Module, dict[str, tuple[Path, Path, int]]]]:
    """For each module, ``{rel: (file in the export, destination, size)}``, both by ``safe_join`` (no link followed)."""
    out = []
    for mod in meta.modules:
        files = {}
        for rel in mod.files:
            with format_errors():
                s_path = safe_join(root, rel, src, fix=FIX)
                dest = safe_join(jit_dir, rel.removeprefix("jit/"), f"{src}: meta.json", fix=FIX)
            if not s_path.is_file() or s_path.is_symlink():
                raise CacheError(f"{src}: {rel} is missing or not a regular file; {FIX}")
            files[rel] = (s_path, dest, os.lstat(s_path).st_size)
        out.append((mod, files))
    return out


#: An import must land in the JIT directory the export was made for: the fix for space is a larger disk.
_ELSEWHERE = ("mount a larger disk at that path (an import goes into the JIT directory the export was made "
              "for: FLASHINFER_WORKSPACE_BASE must be the same on both machines)")


def _os_error(exc: OSError, path: object) -> CacheError:
    """``exc`` as a :class:`CacheError` whose words come from its errno.  P8"""
    p = oserrors.describe(exc, path, _ELSEWHERE)
    return CacheError(f"{p.message}; {p.fix}", p.kind, p.fix)


def _undo(made: list[Path]) -> None:
    """Remove the files (then the directories, deepest first, when empty) an install made."""
    for p in reversed(made):
        with contextlib.suppress(OSError):
            if p.is_dir() and not p.is_symlink():
                p.rmdir()
            else:
                p.unlink()


_NINJA_OWN = ("/build.ninja", "/.ninja_log", "/.ninja_deps")


def _install_module(mod: Module, files: dict[str, tuple[Path, Path, int]], force: bool, made: list[Path]) -> dict:
    # build.ninja and ninja's logs are rewritten here by design (see _settle)
    content = {rel: d for rel, (_, d, _) in files.items() if not rel.endswith(_NINJA_OWN)}
    here = {rel: file_sha256(d) for rel, d in content.items() if d.is_file()}  # each file hashed once
    differing = [str(content[rel]) for rel, h in here.items() if h != mod.files[rel]]
    present = len(here) == len(content) and not differing
    if differing and not force:  # threat-model: P5 (an existing different file is kept unless --force)
        return {"module": mod.label, "name": mod.name, "status": "kept existing",
                "why": f"a different {differing[0]} is already here; pass --force to replace it"}
    if not present:
        for rel, (s_path, d, size) in files.items():
            if not os.path.lexists(d.parent):  # jit/NAME/: the JIT dir exists (it holds the module's lock)
                make_private_dirs(d.parent)
                made.append(d.parent)
            new = not os.path.lexists(d)
            copy_file(s_path, d, size, mod.files[rel])
            if new:
                made.append(d)
    return {"module": mod.label, "name": mod.name, "status": "already present" if present else "installed",
            "replaced": differing}


def _refusal(entry: dict | None, mod: Module, sess: Session, jit_dir: Path) -> str | None:
    """Why the module cannot be imported, or None: its directory is another user's (they could swap the .so a
    server loads, P2, P4), or this FlashInfer's generator cannot make its entry (P2)."""
    from flashinfer_sm120.safety.ownership import check_place

    problem = check_place(str(jit_dir / mod.name), "the module's directory", "remove it if another user made it, "
                          "or set FLASHINFER_WORKSPACE_BASE to a directory of your own")
    if problem:
        return str(problem)
    if entry is None:
        return ("meta.json has no manifest entry for it, so this FlashInfer cannot make its sources; export "
                "it again with `flashinfer-sm120 cache export`")
    library = f"jit/{mod.name}/{mod.name}.so"  # FlashInfer's jit_library_path (0.4 - 0.7.x)
    if library not in mod.files:
        # threat-model: P4, P6 -- decided before FlashInfer's generator writes any source for it: an entry
        # without its library would only make a module directory, a build.ninja and two ninja runs
        return (f"the export carries no library for it ({shown(library, 200)}), so there is nothing to "
                "install; export it again with `flashinfer-sm120 cache export` after building it")
    try:
        make_spec(entry, sess.flashinfer)
    except CannotRegenerate as exc:
        return str(exc)
    return None


def _settle(entry: dict, sess: Session) -> dict:
    """Under the module's lock: write its build.ninja with this FlashInfer, make the outputs newer than
    this machine's inputs, tell ninja's logs, and ask ninja whether it would rebuild."""
    spec = make_spec(entry, sess.flashinfer)
    spec.write_ninja()  # FlashInfer's own; the caller holds the module's lock (spec.lock_path)
    # this machine's pip install may be later than the export: objects first, the library last
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
    moddir.restamp(str(spec.build_dir / ".ninja_deps"), stamps)
    from flashinfer_sm120.safety import proc

    proc.run(moddir.command(job, "-t", "restat"), timeout=120, max_output=1 << 20)
    left = moddir.dry_run(job)
    if left:
        return {"status": "stale", "why": f"ninja would run its steps again here{_absent_here(left[0])}: "
                                          f"{shown(left[0], 600)}"}
    return {}


def _absent_here(command: str) -> str:
    for token in command.split():
        path = token[2:] if token.startswith(("-I", "-L")) else token.split("=", 1)[-1]
        if path.startswith("/") and not os.path.exists(path):
            return f" (it names {shown(path, 200)}, absent here: the export was made with other paths)"
    return ""
