"""Install an exported JIT cache on this machine (``cache import``): check that it was made for this
machine, install each module under FlashInfer's lock, and ask ninja whether it would rebuild it.

The layout is in :mod:`.cachemeta`, the checks of what is read in :mod:`.cacheread`, the export
in :mod:`.cacheexport`.

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

import contextlib
import os
import platform
import shutil
import tarfile
import time
from pathlib import Path

from flashinfer_sm120.core.facts import buildline
from flashinfer_sm120.safety import formats
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.fs.tmpdirs import private_dir
from flashinfer_sm120.warmup import cacheinstall, ninjacmd, ninjadeps, pool
from flashinfer_sm120.warmup.cachemeta import FIX, TOP, CacheError, Limits, Meta, Module, check_listed, listed
from flashinfer_sm120.warmup.cacheread import members, read_meta
from flashinfer_sm120.core.jitenv.manifest import CannotRegenerate, make_spec
from flashinfer_sm120.warmup.session import Session

__all__ = ["install"]

_NINJA_OWN = ("/build.ninja", "/.ninja_log", "/.ninja_deps")


def _unpack(src: str, into: Path, meta: Meta, limits: Limits) -> Path:
    """The folder to read the export's files from: ``src/TOP`` for a directory
    export (read in place; each file is opened without following links, see
    :func:`.cacheinstall.copy_verified`), else the members meta.json lists, extracted below
    ``into`` with tarfile's ``data`` filter (PEP 706) after each header passed the
    caps and the free space was checked, before any byte of it is written."""
    if os.path.isdir(src):
        root = Path(src) / TOP
        if os.path.islink(root) or not root.is_dir():
            raise CacheError(f"{src} has no {TOP}/ folder (or it is a symlink); {FIX}", "archive", FIX)
        return root
    if not hasattr(tarfile, "data_filter"):  # PEP 706 came in 3.10.12, 3.11.4, 3.12 (Debian 12: 3.11.2)
        fix = ("use a Python with tarfile's extraction filters (3.10.12+, 3.11.4+, 3.12+), or export a "
               "directory (cache export OUT, OUT not ending in .tar...) and import that")
        raise CacheError(f"cannot unpack {src}: this Python {platform.python_version()} has no tarfile extraction "
                         f"filters, and archives are unpacked only with the 'data' filter", "python", fix)
    files_dirs = listed(meta)
    total = 0
    for tar, m, rel in members(src, limits):
        total += m.size if m.isfile() else 0
        check_listed(src, m, rel, files_dirs, total, limits)
        if m.isdir() or rel == "meta.json":  # meta.json was read already (read_meta)
            continue
        free = shutil.disk_usage(into).free
        if m.size > free:  # threat-model: P6
            fix = "free space there or set TMPDIR to a larger disk"
            raise CacheError(f"{src}: {m.name} needs {m.size} bytes and {into} has {free} free; {fix}", "space", fix)
        try:
            tar.extract(m, into, filter="data")  # threat-model: P6 (PEP 706 data filter)
        except OSError as exc:
            raise cacheinstall.os_error(exc, into, "set TMPDIR to another directory") from None
        except tarfile.TarError as exc:
            raise CacheError(f"cannot unpack {m.name} from {src}: {formats.shown(str(exc), 200)}; {FIX}",
                             "archive", FIX) from None
    return into / TOP


def _plan(meta: Meta, root: Path, targets: dict[str, Path], src: str) -> list[tuple[Module, dict[str, tuple[Path, Path]]]]:
    """For each module, ``{rel: (file in the export, destination)}``; every
    destination by :func:`flashinfer_sm120.safety.formats.safe_join` under its target
    root, every source by the same under the export (no link followed)."""
    out = []
    for mod in meta.modules:
        paths = {}
        for rel in mod.files:
            kind, rest = rel.split("/", 1)
            try:
                paths[rel] = (formats.safe_join(root, rel, f"{src}", fix=FIX),
                              formats.safe_join(targets[kind], rest, f"{src}: meta.json", fix=FIX))
            except FormatError as exc:
                raise CacheError(str(exc), "archive", FIX) from None
            if not paths[rel][0].is_file() or paths[rel][0].is_symlink():
                raise CacheError(f"{src}: {rel} is missing or not a regular file; {FIX}", "archive", FIX)
        out.append((mod, paths))
    return out


def _mismatch(theirs: dict, ours: dict) -> tuple[str, str] | None:
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
            return f"archive has {k} {theirs.get(k)!r}, this machine {ours.get(k)!r}: {fix}", fix
    changed = buildline.changes(theirs["build_vars"], ours.get("build_vars") or {}) if "build_vars" in theirs else []
    if changed:
        said = "; ".join(f"{c.name}={c.built or '(unset)'} there, {c.now or '(unset)'} here" for c in changed)
        fix = "set them here as there, or build here"
        return (f"the archive was built with other FlashInfer build-line variables ({said}): they change every "
                f"build line, so every module would be rebuilt; {fix}", fix)
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
        raise CacheError(f"refusing {src}: {problem[0]}", "mismatch", problem[1])
    targets = {"jit": Path(jit_env.FLASHINFER_JIT_DIR), "generated": Path(jit_env.FLASHINFER_GEN_SRC_DIR)}
    with private_dir("fi-sm120-import-") as tmp:  # swept by the next import if this one is killed
        root = _unpack(src, Path(tmp), meta, limits)
        try:
            return _install_from(root, meta, targets, sess, force, limits, src)
        except OSError as exc:  # threat-model: P8 (the words come from the errno)
            raise cacheinstall.os_error(exc, exc.filename or targets["jit"]) from None


def _install_from(root: Path, meta: Meta, targets: dict[str, Path], sess: Session, force: bool,
                  limits: Limits, src: str) -> list[dict]:
    """The one install step for an archive (unpacked to ``root``) and a directory export (``root`` in
    it): caps and free space checked on every file before anything is written, then module by module
    under FlashInfer's per-module lock: copied and verified, then settled.  threat-model: P5, P6, P7"""
    entries = {e["name"]: e for e in meta.manifest}
    plan = _plan(meta, root, targets, src)
    cacheinstall.check_space(plan, limits, src)
    budget = cacheinstall.Budget(limits)
    report = []
    for mod, paths in plan:
        # threat-model: P4 -- the refusal is decided before the module's lock is taken: taking it
        # creates cached_ops/tmp/<name>.lock, and a refused module (a name of the export's choosing)
        # must leave nothing in the JIT dir.  (The generation it compares with is FlashInfer's own,
        # which FlashInfer does outside this lock too; the copy and settle below run under it.)
        refused = _place_problem(paths) or _refusal(entries.get(mod.name), mod, sess, targets["generated"])
        if refused:  # before any file of it is installed
            report.append({"module": mod.name, "status": "refused", "why": refused})
            continue
        made: list[Path] = []  # what this import wrote of the module that was not there before
        try:
            with cacheinstall.module_lock(targets["jit"], mod.name):
                try:
                    r = _install_module(mod, paths, force, limits, budget, src, made)
                    if r["status"] in ("installed", "already present"):
                        r.update(_settle(entries.get(mod.name), sess))
                except BaseException:
                    _undo(made)  # a failed module is left as it was, never half installed (round 5, P32)
                    raise
        except OSError as exc:  # a full disk, a permission: said for this module; the ones before stay installed
            err = cacheinstall.os_error(exc, exc.filename or targets["jit"])
            report.append({"module": mod.name, "status": "failed", "why": str(err), "kind": err.kind, "fix": err.fix})
            break
        report.append(r)
    return report


def _undo(made: list[Path]) -> None:
    """Remove the files (then the directories, deepest first, when empty) an install made."""
    for p in reversed(made):
        with contextlib.suppress(OSError):
            if p.is_dir() and not p.is_symlink():
                p.rmdir()
            else:
                p.unlink()


def _install_module(mod: Module, paths: dict[str, tuple[Path, Path]], force: bool, limits: Limits,
                    budget: cacheinstall.Budget, src: str, made: list[Path]) -> dict:
    # build.ninja and ninja's logs are rewritten here by design (see _settle)
    content = {rel: d for rel, (_, d) in paths.items() if not rel.endswith(_NINJA_OWN)}
    differing = [str(d) for rel, d in content.items() if d.is_file() and cacheinstall.file_sha256(d) != mod.files[rel]]
    present = all(d.is_file() and cacheinstall.file_sha256(d) == mod.files[rel] for rel, d in content.items())
    if differing and not force:  # threat-model: P5 (an existing different file is kept unless --force)
        return {"module": mod.name, "status": "kept existing",
                "why": f"a different {differing[0]} is already here; pass --force to replace it"}
    if not present:
        for rel, (s_path, d) in paths.items():
            missing = [p for p in (d.parent, *d.parent.parents) if not os.path.lexists(p)]
            formats.make_private_dirs(d.parent)
            made.extend(reversed(missing))  # outermost first: undone deepest first
            if d.is_dir() and not d.is_symlink():
                raise CacheError(f"{src}: {rel} would replace the directory {d}; remove it first", "exists",
                                 f"remove {d} first")
            new = not os.path.lexists(d)
            cacheinstall.copy_verified(s_path, d, mod.files[rel], limits, budget)
            if new:
                made.append(d)
    return {"module": mod.name, "status": "already present" if present else "installed", "replaced": differing}


def _place_problem(paths: dict[str, tuple[Path, Path]]) -> str | None:
    """Why a module's files cannot be written where they go, or None: every directory they go into
    must be root's or yours and not writable by others (a module directory another user left in a
    shared workspace would let them swap the .so a server loads).  threat-model: P2, P4"""
    from flashinfer_sm120.safety.ownership import check_place

    for d in sorted({str(dest.parent) for _, dest in paths.values()}):
        problem = check_place(d, "the module's directory", "remove it if another user made it, or set "
                              "FLASHINFER_WORKSPACE_BASE to a directory of your own", doing="install into")
        if problem:
            return str(problem)
    return None


def _refusal(entry: dict | None, mod: Module, sess: Session, gen_root: Path) -> str | None:
    """Why the module cannot be imported, or None: its manifest entry must be made by this
    FlashInfer's generator (:func:`~flashinfer_sm120.core.jitenv.manifest.make_spec`, which writes FlashInfer's own sources),
    and every generated source the export carries must be exactly what that wrote."""
    # threat-model: P2 (an export's source text is compared with the local generation, never compiled)
    if entry is None:
        return ("meta.json has no manifest entry for it, so this FlashInfer cannot make its sources; export "
                "it again with `flashinfer-sm120 cache export`")
    if not any(rel.startswith(f"jit/{mod.name}/") and rel.endswith(".so") for rel in mod.files):
        # threat-model: P4, P6 -- decided before FlashInfer's generator writes any source for it
        return ("the export carries no library for it, so there is nothing to install; export it again "
                "with `flashinfer-sm120 cache export` after building it")
    try:
        spec = make_spec(entry, sess.flashinfer)
    except CannotRegenerate as exc:
        return str(exc)
    library = f"jit/{mod.name}/{spec.jit_library_path.name}"
    if library not in mod.files:
        # threat-model: P4, P6 -- an entry without its library installs nothing: it only made a module
        # directory with FlashInfer's build.ninja and ran ninja twice, each of up to 10,000 entries
        return (f"the export carries no {formats.shown(library, 200)}, the module's library, so there is "
                "nothing to install; export it again with `flashinfer-sm120 cache export` after building it")
    for rel, sha in mod.files.items():
        if rel.startswith("generated/"):
            local = gen_root / rel[len("generated/"):]
            if not local.is_file() or local.is_symlink() or cacheinstall.file_sha256(local) != sha:
                return (f"{formats.shown(rel)} differs from what FlashInfer {sess.flashinfer} generates for "
                        "the module, so the export carries source of its own; export it again with "
                        "`flashinfer-sm120 cache export`")
    return None


def _settle(entry: dict | None, sess: Session) -> dict:
    """Under the module's lock (held by :func:`_install_from`): regenerate the module's build.ninja with
    this FlashInfer, make the imported outputs
    newer than this machine's inputs (objects before the library), record that in ninja's
    log (``ninja -t restat``), and ask ninja whether it would rebuild."""
    if entry is None:
        return {"status": "stale", "why": "meta.json has no manifest entry for it"}
    spec = make_spec(entry, sess.flashinfer)
    spec.write_ninja()  # FlashInfer's own; the caller holds the module's lock (spec.lock_path)
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
    from flashinfer_sm120.safety import proc

    proc.run(ninjacmd.command(job, "-t", "restat"), timeout=120, max_output=1 << 20)
    left = ninjacmd.dry_run(job)
    if left:
        return {"status": "stale", "why": f"ninja would run its steps again here{_absent_here(left[0])}: "
                                          f"{formats.shown(left[0], 600)}"}
    return {}


def _absent_here(command: str) -> str:
    """Why a command ninja would rerun differs here, when a path it names does not exist on this machine
    (another Python's include directory, another toolkit): `` (it names X, absent here)``; else ``""``."""
    for token in command.split():
        path = token[2:] if token.startswith(("-I", "-L")) else token.split("=", 1)[-1]
        if path.startswith("/") and not os.path.exists(path):
            return f" (it names {formats.shown(path, 200)}, absent here: the export was made with other paths)"
    return ""
