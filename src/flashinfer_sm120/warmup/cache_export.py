"""``cache export``: FlashInfer's JIT cache entries of modules built here, with a ``meta.json`` checked
first by the grammar the import reads it with (threat-model: P7).  The layout: :mod:`.cache_format`.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

from flashinfer_sm120.core.jitenv import record
from flashinfer_sm120.safety.formats.paths import deepest_existing, make_private_dirs, safe_join
from flashinfer_sm120.safety.fs.atomic import write_atomic
from flashinfer_sm120.warmup import modules as _modules
from flashinfer_sm120.warmup.cache_format import (FORMAT, TOP, Budget, CacheError, Limits, file_sha256, member_rel,
                                                  nvcc_targets, parse_meta, too_large, umask)
from flashinfer_sm120.warmup.replay import make_spec
from flashinfer_sm120.warmup import ninjacmd, pool, session
from flashinfer_sm120.warmup.session import BuildError, Session


@contextlib.contextmanager
def _capturing():
    """While active, every ``JitSpecNvcc`` made notes its generator and parameters, as the recorder does."""
    from flashinfer.jit import core

    from flashinfer_sm120.core.jitenv.record import capture

    cls = core.JitSpecNvcc
    original = cls.__dict__["__init__"]

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        capture(self)

    cls.__init__ = init
    try:
        yield
    finally:
        cls.__init__ = original


def built_entries(names: list[str], everything: bool, arch: str | None, *, head_dims=None, dtypes=None,
                  kv_dtypes=None, acts=None):
    """``(entries, skipped, session)``: a manifest entry per variant of ``names`` built here (``everything``:
    every name ``build`` knows), so an export needs no recorded manifest; ``(name, why)`` for the rest."""
    variants = _modules.expand(["all"] if everything else names, head_dims=head_dims, dtypes=dtypes,
                               kv_dtypes=kv_dtypes, acts=acts)
    sess = session.prepare(arch)  # the caller pointed the workspace at the server's (apply_server_cache)
    entries, skipped, exported = [], [], set()
    with _capturing():
        for v in variants:
            try:
                spec = v.spec()
            except Exception as exc:  # FlashInfer refuses this combination here
                skipped.append((v.label, f"FlashInfer's {v.generator} raised {exc!r}"))
                continue
            if everything and not spec.jit_library_path.exists():
                continue  # --all: only what is built here
            entry = record.encode(spec, sess.flashinfer, sess.targets)
            if not entry.get("regenerable"):
                skipped.append((v.label, entry.get("why", "")))
                continue
            entries.append(entry)
            exported.add(spec.name)
    if everything:
        for d in sorted(sess.jit_dir.iterdir()) if sess.jit_dir.is_dir() else ():
            if d.is_dir() and d.name not in exported and (d / f"{d.name}.so").exists():
                skipped.append((d.name, "built with parameters `build` does not name; record a manifest "
                                        "(FLASHINFER_SM120_RECORD) and export with --from"))
        if not entries:
            raise BuildError(f"nothing `build` can name is built in {sess.jit_dir} for "
                             f"{nvcc_targets(sess.targets)}; build it first (`flashinfer-sm120 build "
                             f"--arch ... MODULE`) or give the same --head-dim/--dtype as the build")
    return entries, skipped, sess


def built_targets() -> dict[str, int]:
    """``{target set ("sm_120f sm_121f"): modules built}`` in FlashInfer's ``<workspace>/<release>/<targets>/``
    directories, read without importing anything (an export without ``--arch`` and without a GPU)."""
    from flashinfer_sm120.core.facts.workspace import workspace_path
    from flashinfer_sm120.core.patch.resolve import flashinfer_version

    root = Path(workspace_path()[0]) / (flashinfer_version() or "none")
    out = {}
    for key in sorted(os.listdir(root)) if root.is_dir() else ():
        built = {so.parent.name for pattern in ("*/cached_ops/*/*.so", "cached_ops/*/*.so")
                 for so in (root / key).glob(pattern) if so.stem == so.parent.name}
        if built:
            out[" ".join("sm_" + k for k in key.split("_"))] = len(built)
    return out


#: Archive names `cache export` writes; any other archive-looking name is refused, never made a directory.
ARCHIVES = (".tar", ".tar.gz", ".tgz")
_NOT_WRITTEN = (".zip", ".gz", ".xz", ".txz", ".bz2", ".tbz", ".tbz2", ".zst", ".tzst", ".lz4", ".lzma", ".7z", ".rar",
                ".z")


def check_out(out: str) -> None:
    """Refuse ``out`` unless it is absent or an empty directory (P5), and named as a directory or one of
    :data:`ARCHIVES` (``usage`` for another archive name)."""
    name = out.lower()
    if not name.endswith(ARCHIVES) and name.endswith(_NOT_WRITTEN):
        fix = f"name the archive {', '.join(ARCHIVES[:-1])} or {ARCHIVES[-1]}, or give a directory"
        raise CacheError(f"{out} names an archive `cache export` cannot write; {fix}", "usage", fix)
    if os.path.lexists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        fix = "choose a new path (an export never overwrites)"
        raise CacheError(f"{out} already exists; {fix}", "exists", fix)


def export(entries: list[dict], sess: Session, out: str, *,
           limits: Limits = Limits()) -> list[tuple[str, str]]:
    """Write the JIT cache entries of ``entries`` (built here) to ``out``, a directory or an archive, with
    the same checks and caps for both (P4-P7); ``(build's name, FlashInfer's)`` of each module written."""
    from flashinfer.jit import env as jit_env

    from flashinfer_sm120.safety.ownership import check_place

    check_out(out)
    files: list[tuple[str, Path]] = []
    mods = []
    gen_root = Path(jit_env.FLASHINFER_GEN_SRC_DIR)
    for entry in entries:
        spec = make_spec(entry, sess.flashinfer)
        if not spec.jit_library_path.exists() or ninjacmd.dry_run(pool.Job(spec.name, spec.build_dir, spec.ninja_path)):
            raise BuildError(f"{_modules.user_name(spec.name)} is not built (or not up to date) for "
                             f"{nvcc_targets(sess.targets)} with nvcc {sess.cuda_version} in {sess.jit_dir}; "
                             "build it first (`flashinfer-sm120 build` with the same module names, or --from "
                             "MANIFEST), with the same CUDA_HOME/PATH as that build if it was made with another nvcc")
        mine = [(f"jit/{spec.name}/{f.name}", f) for f in sorted(spec.build_dir.iterdir())
                if f.is_file() and not f.is_symlink() and not f.name.endswith((".lock", ".ninja_lock"))]
        mine += [("generated/" + p[len("@GEN@/"):], gen_root / p[len("@GEN@/"):]) for p in entry.get("generated") or {}]
        files += mine
        mods.append({"name": spec.name, "files": {rel: file_sha256(f) for rel, f in mine}})
    blob = json.dumps({"format": FORMAT, "fingerprint": sess.fingerprint(), "modules": mods, "manifest": entries,
                       "created": time.time()}, indent=1).encode()
    # threat-model: P7 (what export writes, import accepts: checked by the import's own grammar first)
    parse_meta(json.loads(blob), "the export's meta.json")
    for rel, _ in files:
        member_rel(f"{TOP}/{rel}", out)
    sizes = [os.lstat(f).st_size for _, f in files]
    _check_space(out, len(blob) + sum(sizes), limits)
    # threat-model: P4, P7: both forms go where another user can neither write nor replace what we put
    # (an archive there could be swapped for one carrying their .so; a planted link could redirect writes)
    archive = out.lower().endswith(ARCHIVES)
    too_big = too_large(out, "the archive", len(blob) + sum(sizes)) if archive else \
        too_large(out, "its largest file", max(sizes, default=0))  # threat-model: P6 (ulimit -f)
    if too_big:
        raise too_big
    problem = check_place(os.path.dirname(os.path.abspath(out)) if archive else out,
                          "the export's directory" if archive else "the export directory",
                          "export to a new path in a directory of your own", doing="export into")
    if problem:
        raise CacheError(str(problem), "place", problem.fix)
    if archive:
        _write_archive(out, blob, files)
    else:
        _write_directory(out, blob, files, Budget(limits))
    return [(_modules.user_name(m["name"]), m["name"]) for m in mods]


def _check_space(out: str, total: int, limits: Limits) -> None:
    """Refuse ``total`` bytes (``lstat`` sizes) over ``--max-bytes`` or the free space, before writing.  P6"""
    if total > limits.max_total:
        fix = "pass a larger --max-bytes, or export fewer modules"
        raise CacheError(f"the export to {out} would be {total} bytes, more than the {limits.max_total}-byte "
                         f"cap (--max-bytes); {fix}", "limit", fix)
    where = deepest_existing(out)
    free = shutil.disk_usage(where).free
    if total > free:
        fix = f"free space on the disk of {where}, or export to another disk"
        raise CacheError(f"the export to {out} needs {total} bytes and {where} has {free} free; {fix}", "space", fix)


def _appeared(out: str) -> BuildError:
    return BuildError(f"{out} appeared while the export was written; choose a new path (an export never overwrites)")


def _write_directory(out: str, blob: bytes, files: list[tuple[str, Path]], budget: Budget) -> None:
    """Write into a new private directory beside ``out``, renamed onto it when whole (onto nothing or an
    empty directory): a failed export leaves nothing behind.  P4, P5"""
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}.", suffix=".partial",
                           dir=os.path.dirname(os.path.abspath(out)))
    try:
        root = Path(tmp) / TOP
        make_private_dirs(root)
        for rel, f in [*files, ("meta.json", None)]:
            dest = safe_join(root, rel, out)
            make_private_dirs(dest.parent)
            # O_EXCL | O_NOFOLLOW: nothing there is followed or replaced
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            with os.fdopen(fd, "wb") as fh, (open(f, "rb") if f else io.BytesIO(blob)) as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    budget.take(len(block), dest)  # threat-model: P6
                    fh.write(block)
            if f:
                shutil.copystat(f, dest)
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


def _write_archive(out: str, blob: bytes, files: list[tuple[str, Path]]) -> None:
    """The archive, by the one atomic writer (nothing that appeared at ``out`` meanwhile is replaced).  P5"""
    def write(fh) -> None:
        with tarfile.open(fileobj=fh, mode="w:gz" if out.lower().endswith("gz") else "w") as tar:
            info = tarfile.TarInfo(f"{TOP}/meta.json")
            info.size, info.mtime, info.mode = len(blob), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(blob))
            for rel, f in files:
                tar.add(str(f), arcname=f"{TOP}/{rel}", recursive=False)

    try:
        write_atomic(os.path.abspath(out), write, mode=0o666 & ~umask(), replace=False)  # as open() would make it
    except FileExistsError:
        raise _appeared(out) from None
