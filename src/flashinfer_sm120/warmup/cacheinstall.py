"""The one verified install step of ``cache import``, the same for an archive (unpacked first) and a
directory export (read in place): caps on files, bytes and members; the free-space check; FlashInfer's
per-module lock; copies into random-named temporary files that only their creator removes.

threat-model: P5, P6, P7.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from flashinfer_sm120.safety import formats, oserrors
from flashinfer_sm120.warmup import modlock
from flashinfer_sm120.warmup.cachemeta import FIX, CacheError, Limits

__all__ = ["Budget", "check_space", "copy_verified", "file_sha256", "module_lock", "os_error", "umask"]
#: Where else an import could go: nowhere by a variable (it must land in the JIT directory the export was
#: made for, same FLASHINFER_WORKSPACE_BASE), so the fix is a larger disk at that path (round 5, P31).
_ELSEWHERE = ("mount a larger disk at that path (an import goes into the JIT directory the export was made "
              "for: FLASHINFER_WORKSPACE_BASE must be the same on both machines)")


class Budget:
    """The bytes an import may still copy (``cache import --max-bytes``), counted on the bytes
    actually read, not on sizes a header or ``stat`` declared (a file may grow while read).
    threat-model: P6"""

    def __init__(self, limits: Limits) -> None:
        self.limits, self.left = limits, limits.max_total

    def take(self, n: int, src: object) -> None:
        self.left -= n
        if self.left < 0:
            raise CacheError(f"{formats.shown(str(src), 300)}: the export's files add up to more than the "
                             f"{self.limits.max_total}-byte cap (--max-bytes)",
                             "archive", "pass a larger --max-bytes if you trust this export")


def os_error(exc: OSError, path: object, elsewhere: str = _ELSEWHERE) -> CacheError:
    """``exc`` as a :class:`CacheError` whose words come from its errno
    (:data:`flashinfer_sm120.safety.oserrors.BY_ERRNO`).  threat-model: P8"""
    p = oserrors.describe(exc, path, elsewhere)
    return CacheError(f"{p.message}; {p.fix}", p.kind, p.fix)


def check_space(plan: list[tuple[object, dict[str, tuple[Path, Path]]]], limits: Limits, src: str) -> None:
    """Refuse before anything is written when the export's files are more than the member or byte caps,
    one is more than the per-file cap, or they do not fit in the free space of the disk they go to.
    Sizes are ``lstat`` sizes (a sparse file counts at its full length, as it is copied).
    threat-model: P6, P7"""
    count = sum(len(paths) for _, paths in plan)
    if count > limits.max_members:
        raise CacheError(f"{src}: it has {count} files, more than {limits.max_members}; refusing the whole "
                         f"export; {FIX}", "archive", FIX)
    total, need = 0, {}
    for _, paths in plan:
        for s_path, dest in paths.values():
            size = os.lstat(s_path).st_size
            if size > limits.max_file:
                raise CacheError(f"{s_path} is {size} bytes, more than the {limits.max_file}-byte cap "
                                 f"(cache import --max-bytes); refusing the whole export", "archive",
                                 "pass a larger --max-bytes if you trust this export")
            total += size
            if total > limits.max_total:
                raise CacheError(f"{src}: its files add up to more than the {limits.max_total}-byte cap "
                                 f"(cache import --max-bytes); refusing the whole export", "archive",
                                 "pass a larger --max-bytes if you trust this export")
            root = _existing(dest)
            need[root] = need.get(root, 0) + size
    for root, n in need.items():
        free = shutil.disk_usage(root).free
        if n > free:
            fix = f"free space on the disk of {root}, or {_ELSEWHERE}"  # one wording with os_error
            raise CacheError(f"{src} needs {n} bytes in {root} and that disk has {free} free; {fix}", "space", fix)


def _existing(p: Path) -> Path:
    while not os.path.lexists(p) and p.parent != p:
        p = p.parent
    return p


@contextlib.contextmanager
def module_lock(jit_dir: Path, name: str):
    """FlashInfer's own per-module build lock (:mod:`flashinfer_sm120.warmup.modlock`), its directory
    made ``0700`` if absent: a server building this module and an importer installing it take turns;
    a wait is told on stderr.  threat-model: P5"""
    path = modlock.lock_path(jit_dir, name)
    formats.make_private_dirs(path.parent)
    with modlock.held(path, name, lambda line: print(f"flashinfer-sm120: {line}", file=sys.stderr, flush=True)):
        yield


def copy_verified(src: Path, dest: Path, sha: str, limits: Limits, budget: Budget) -> None:
    """Copy ``src`` (opened without following a link, a regular file only) into a new temporary file
    beside ``dest`` (``mkstemp``: a random name, created here), hashing and counting while copying;
    rename it over ``dest`` only if the digest is ``sha``.  Only the file made here is ever removed.
    threat-model: P5, P6"""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(src, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CacheError(f"{src} is not a regular file; {FIX}", "archive", FIX)
        os.set_blocking(fd, True)
        out, part = tempfile.mkstemp(prefix=f".{dest.name[:64]}.", suffix=".import", dir=dest.parent)
        mine = True  # this process made ``part``: it alone removes it
        try:
            h, size = hashlib.sha256(), 0
            with os.fdopen(out, "wb") as fo:
                while True:
                    block = os.read(fd, 1 << 20)
                    if not block:
                        break
                    size += len(block)
                    if size > limits.max_file:
                        raise CacheError(f"{src} is more than the {limits.max_file}-byte cap (cache import "
                                         f"--max-bytes)", "archive", "pass a larger --max-bytes if you trust "
                                         "this export")
                    budget.take(len(block), src)
                    h.update(block)
                    fo.write(block)
            if h.hexdigest() != sha:
                raise CacheError(f"{src}: its checksum does not match meta.json; {FIX}", "archive", FIX)
            os.chmod(part, 0o644 & ~umask())  # as a plain open() would have made it
            os.replace(part, dest)
            mine = False
        finally:
            if mine:
                with contextlib.suppress(OSError):
                    os.unlink(part)
    finally:
        os.close(fd)


def file_sha256(path: Path) -> str:
    """The SHA-256 of the file at ``path``, as meta.json records each file of an export."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def umask() -> int:
    """This process's umask, read without changing it (``/proc/self/status``); ``077`` if unknown."""
    try:
        for line in formats.read_text("/proc/self/status", 1 << 16).splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8) & 0o777
    except (formats.FormatError, ValueError, IndexError):
        pass
    return 0o077
