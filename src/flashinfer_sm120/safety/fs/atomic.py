"""The one atomic writer, and the one sweep of what a killed process left (standard library only:
``enable``/``disable`` use it with the package broken).  ``finally`` never runs under ``kill -9``, so
a temporary entry is ``flock``-ed while its maker lives and :func:`sweep` removes what it can then lock.
"""
# threat-model: P5 (temporary entries have random names; only their creator removes them, or the next
# process once the creator's lock is gone; final files are put in place atomically), P3 (never removed
# on a guess from /proc or a pid)

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
import time
from typing import BinaryIO, Callable

__all__ = ["GRACE_S", "hold", "sweep", "temp_prefix", "write_atomic"]

#: An entry younger than this (seconds) is never swept: its maker may not have locked it yet
#: (``mkdtemp``/``mkstemp`` and ``flock`` are two steps).
GRACE_S = 60.0

_SWEEP_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO never blocks a sweep


def hold(fd: int) -> None:
    """Mark the temporary entry open on ``fd`` in use while it stays open (without ``flock``, only
    :data:`GRACE_S` keeps it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass


def sweep(prefix: str, parent: str | None = None) -> None:
    """Remove ``parent/prefix*`` entries of yours older than :data:`GRACE_S` that nobody holds; never a
    link nor another uid's entry.  Never raises."""
    parent = parent or tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        try:
            fd = os.open(path, _SWEEP_FLAGS)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            kind = stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)
            if st.st_uid != os.geteuid() or not kind or time.time() - st.st_mtime < GRACE_S:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its maker is alive
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path, ignore_errors=True)
            elif _same_file(path, st):
                os.unlink(path)
        except OSError:
            continue
        finally:
            os.close(fd)


def _same_file(path: str, st: os.stat_result) -> bool:
    """``path`` still names the file ``st`` describes (not one renamed over it meanwhile)."""
    now = os.lstat(path)
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def temp_prefix(path: str) -> str:
    """The name every temporary file of :func:`write_atomic` for ``path`` starts with (beside it)."""
    return ".tmp-" + os.path.basename(path)[:200] + "."  # with mkstemp's 8 characters, a name Linux takes


def write_atomic(path: str, data: bytes | Callable[[BinaryIO], None], *, mode: int = 0o600,
                 replace: bool = True) -> None:
    """Write ``data`` (bytes, or a function streaming them into the open file) to ``path`` so a reader
    sees the old file or the new one, never half (P5): a ``mkstemp`` file beside it, held, given
    ``mode``, renamed over ``path`` (``replace=False``: linked, so ``FileExistsError`` rather than
    replace); removed on any failure.  Raises ``OSError`` (the caller words it) and what ``data`` raises."""
    directory = os.path.dirname(path) or "."
    sweep(temp_prefix(path), directory)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), dir=directory)
    try:
        hold(fd)
        with os.fdopen(os.dup(fd), "wb") as fh:
            data(fh) if callable(data) else fh.write(data)
        os.fchmod(fd, mode)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
            os.unlink(tmp)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)
