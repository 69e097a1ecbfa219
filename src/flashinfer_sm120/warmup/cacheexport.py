"""Write a warmed JIT cache to a new directory or archive (``cache export``): a manifest's JIT cache
entries, built and up to date here, with a meta.json that the import's own grammar accepts.

The layout is in :mod:`.cachemeta`; :mod:`.cachepack` installs an export on another machine.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

from flashinfer_sm120.safety import formats
from flashinfer_sm120.warmup import cacheinstall, ninjacmd, pool
from flashinfer_sm120.warmup.cachemeta import FORMAT, TOP, CacheError, Limits, member_rel, parse_meta
from flashinfer_sm120.core.jitenv.manifest import make_spec
from flashinfer_sm120.warmup.session import BuildError, Session

__all__ = ["export"]

_SKIP = {".ninja_lock"}


def _is_archive(path: str) -> bool:
    return path.endswith((".tar", ".tar.gz", ".tgz"))


def export(entries: list[dict], sess: Session, out: str, *, limits: Limits = Limits()) -> list[str]:
    """Write the JIT cache entries of ``entries`` (built on this machine) to ``out``, a directory or an
    archive, with the same caps and free-space check for both (threat-model: P6, P7).

    :returns: the module names written.
    :raises BuildError: a module is not built or not up to date here, ``out`` exists
        and is not an empty directory (never overwritten), the files are over ``limits``
        or do not fit on ``out``'s disk.
    """
    from flashinfer.jit import env as jit_env

    if os.path.lexists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        fix = "choose a new path (an export never overwrites)"
        raise CacheError(f"{out} already exists; {fix}", "exists", fix)
    files: list[tuple[str, Path]] = []
    modules, names = [], []
    gen_root = Path(jit_env.FLASHINFER_GEN_SRC_DIR)
    for entry in entries:
        spec = make_spec(entry, sess.flashinfer)
        job = pool.Job(spec.name, spec.build_dir, spec.ninja_path)
        if not spec.jit_library_path.exists() or ninjacmd.dry_run(job):
            raise BuildError(f"{spec.name} is not built (or not up to date) for {' '.join(sess.targets)} here; "
                             "build it first (`flashinfer-sm120 build` with the same module names, or --from "
                             "MANIFEST)")
        mod_files = {}
        for f in sorted(spec.build_dir.iterdir()):
            if f.is_file() and not f.is_symlink() and f.name not in _SKIP and not f.name.endswith(".lock"):
                rel = f"jit/{spec.name}/{f.name}"
                files.append((rel, f))
                mod_files[rel] = cacheinstall.file_sha256(f)
        for portable in (entry.get("generated") or {}):
            f = gen_root / portable[len("@GEN@/"):]
            rel = "generated/" + portable[len("@GEN@/"):]
            files.append((rel, f))
            mod_files[rel] = cacheinstall.file_sha256(f)
        modules.append({"name": spec.name, "files": mod_files})
        names.append(spec.name)
    meta = {"format": FORMAT, "fingerprint": sess.fingerprint(), "modules": modules, "manifest": entries,
            "created": time.time()}
    blob = json.dumps(meta, indent=1).encode()
    # threat-model: P7 (an export is checked by the import's own grammar before anything is written:
    # what export writes, import accepts; FlashInfer's attention module names once failed that)
    parse_meta(json.loads(blob), f"the export's meta.json")
    for rel, _ in files:
        member_rel(f"{TOP}/{rel}", out)
    _check_export_space(out, blob, files, limits)
    budget = cacheinstall.Budget(limits)
    from flashinfer_sm120.safety.ownership import check_place

    # threat-model: P4, P7: both forms go where another user can neither write nor replace what we put
    # (an archive there could be swapped for one carrying their .so; a planted link could redirect writes)
    archive = _is_archive(out)
    where = os.path.dirname(os.path.abspath(out)) if archive else out
    problem = check_place(where, "the export's directory" if archive else "the export directory",
                          "export to a new path in a directory of your own", doing="export into")
    if problem:
        from flashinfer_sm120.warmup.cachemeta import CacheError

        raise CacheError(str(problem), "place", problem.fix)
    if archive:
        _write_archive(out, blob, files)
    else:
        _write_directory(out, blob, files, budget)
    return names


def _write_directory(out: str, blob: bytes, files: list[tuple[str, Path]], budget: cacheinstall.Budget) -> None:
    """The export written into a new private directory beside ``out``, renamed to ``out`` when whole
    (onto nothing, or onto the empty directory that was there): a failed export leaves nothing
    behind, and only its creator removes the directory.  threat-model: P4, P5"""
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}.", suffix=".partial",
                           dir=os.path.dirname(os.path.abspath(out)))
    try:
        root = Path(tmp) / TOP
        formats.make_private_dirs(root)
        for rel, f in files:
            dest = formats.safe_join(root, rel, out)
            formats.make_private_dirs(dest.parent)
            with open(f, "rb") as src:
                _write_new(dest, src, budget)
            shutil.copystat(f, dest)
        _write_new(formats.safe_join(root, "meta.json", out), io.BytesIO(blob), budget)
        os.chmod(tmp, 0o777 & ~cacheinstall.umask())  # as a plain mkdir would have made it
        try:
            os.rename(tmp, out)  # replaces only an empty directory; never a file or a full directory
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                raise BuildError(f"{out} appeared while the export was written; choose a new path "
                                 f"(an export never overwrites)") from None
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_export_space(out: str, blob: bytes, files: list[tuple[str, Path]], limits: Limits) -> None:
    """Refuse an export over ``--max-bytes`` or larger than the free space where it goes, before anything
    is written; sizes are ``lstat`` sizes (a sparse file is written at its full length).
    threat-model: P6, P7 (one rule for a directory and an archive export)"""
    total = len(blob) + sum(os.lstat(f).st_size for _, f in files)
    if total > limits.max_total:
        fix = "pass a larger --max-bytes, or export fewer modules"
        raise CacheError(f"the export to {out} would be {total} bytes, more than the {limits.max_total}-byte "
                         f"cap (--max-bytes); {fix}", "limit", fix)
    where = Path(os.path.abspath(out))
    while not where.exists() and where.parent != where:
        where = where.parent
    free = shutil.disk_usage(where).free
    if total > free:
        fix = f"free space on the disk of {where}, or export to another disk"
        raise CacheError(f"the export to {out} needs {total} bytes and {where} has {free} free; {fix}", "space", fix)


def _write_new(dest: Path, src, budget: cacheinstall.Budget) -> None:
    """The file object ``src`` copied into a new file ``dest`` (``O_EXCL | O_NOFOLLOW``: nothing there
    is followed or replaced), counting the bytes against ``budget`` (threat-model: P6)."""
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as fh:
        for block in iter(lambda: src.read(1 << 20), b""):
            budget.take(len(block), dest)
            fh.write(block)


def _write_archive(out: str, blob: bytes, files: list[tuple[str, Path]]) -> None:
    """The archive, written to a new private file beside ``out`` (``O_EXCL``: nothing of that name
    is opened, followed or truncated), then linked to ``out``, which fails rather than replace
    anything that appeared there meanwhile."""
    # threat-model: P5 (a random name made here, linked into place without replacing anything)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(out)}.", suffix=".partial",
                               dir=os.path.dirname(os.path.abspath(out)))
    try:
        with os.fdopen(fd, "wb") as fh, tarfile.open(fileobj=fh, mode="w:gz" if out.endswith("gz") else "w") as tar:
            info = tarfile.TarInfo(f"{TOP}/meta.json")
            info.size, info.mtime, info.mode = len(blob), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(blob))
            for rel, f in files:
                tar.add(str(f), arcname=f"{TOP}/{rel}", recursive=False)
        os.chmod(tmp, 0o666 & ~cacheinstall.umask())  # as a plain open() would have made it
        try:
            os.link(tmp, out)
        except FileExistsError:
            raise BuildError(f"{out} appeared while the export was written; choose a new path "
                             f"(an export never overwrites)") from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
