"""Temporary directories a killed process does not leave behind for good.

``tempfile.mkdtemp``/``TemporaryDirectory`` clean up in ``finally``, which ``kill -9`` or the OOM killer
never reach: a ``cache import`` killed while unpacking left its archive's files (up to the 32 GiB cap)
in ``$TMPDIR/fi-sm120-import-*``, a build its jobserver FIFO, each run one more.  A directory made here
is ``flock``-ed for as long as its maker lives (the lock is the open directory, released by the kernel
when the process dies, in any PID namespace); the next process that makes one of the same kind removes
those whose lock it can take.  Nothing is made in a temporary directory another uid can change.
"""
# threat-model: P5 (private temporary directories; only their creator's leftovers are swept)

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator

from flashinfer_sm120.errors import PlaceError
from flashinfer_sm120.safety import formats
from flashinfer_sm120.safety.ownership import place_reason

__all__ = ["Private", "private_dir", "make_private", "sweep"]

#: A directory younger than this (seconds) is never swept: its maker may not have locked it yet
#: (``mkdtemp`` and ``flock`` are two steps).
GRACE_S = 60.0

_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class Private:
    """A locked temporary directory: ``path``; :meth:`close` removes it and drops the lock."""

    def __init__(self, path: str, fd: int) -> None:
        self.path, self._fd = path, fd

    def close(self) -> None:
        if self._fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)
        self._fd = None


def sweep(prefix: str, parent: str | None = None) -> None:
    """Remove ``parent/prefix*`` directories of yours that nobody holds locked and that are older
    than :data:`GRACE_S` (their maker was killed).  Never raises."""
    parent = parent or tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        try:
            fd = os.open(path, _FLAGS)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or not stat.S_ISDIR(st.st_mode) or time.time() - st.st_mtime < GRACE_S:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its maker is alive
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)


def make_private(prefix: str, parent: str | None = None) -> Private:
    """A new ``parent/prefix*`` directory (``mkdtemp``: mode 0700), locked while this process lives,
    after sweeping what killed processes left under the same prefix.

    Raises:
        PlaceError: ``parent`` (by default the temporary directory) is not a place of our own.
    """
    parent = parent or tempfile.gettempdir()
    why = place_reason(os.path.join(parent, prefix))  # check, then create (threat-model: P4)
    if why:
        raise PlaceError(f"will not make a temporary directory in {formats.shown(parent, 200)}: {why}. Fix: set "
                         f"TMPDIR to a directory of your own (mkdir -m 700 ~/tmp; TMPDIR=~/tmp) or unset it")
    sweep(prefix, parent)
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    fd = os.open(path, _FLAGS)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # a file system without flock: it is still removed on a normal exit
        pass
    return Private(path, fd)


@contextlib.contextmanager
def private_dir(prefix: str, parent: str | None = None) -> Iterator[str]:
    """:func:`make_private` as a context manager yielding the path."""
    d = make_private(prefix, parent)
    try:
        yield d.path
    finally:
        d.close()
