"""What a killed process leaves behind, swept by the next one: one rule for temporary directories
and for the temporary files of atomic writes.

``tempfile.mkdtemp``/``TemporaryDirectory`` clean up in ``finally``, which ``kill -9`` or the OOM killer
never reach: a ``cache import`` killed while unpacking left its archive's files (up to the 32 GiB cap)
in ``$TMPDIR/fi-sm120-import-*``, a build its jobserver FIFO, a view builder its half-built view, an
``enable`` its half-written ``.pth``, each run one more.  A temporary entry made here (a directory, or
the temporary file of :func:`flashinfer_sm120.safety.fs.statefiles.write_atomic`) is ``flock``-ed for as
long as its maker uses it (the lock is the open file, released by the kernel when the process dies, in
any PID namespace); :func:`sweep` removes those of this uid whose lock it can take.  Nothing is made in a
temporary directory another uid can change.
"""
# threat-model: P5 (temporary entries have random names; only their creator removes them, or the next
# process once the creator's lock is gone), P3 (never removed on a guess from /proc or a pid)

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
from flashinfer_sm120.safety.ownership import trust_reason

__all__ = ["GRACE_S", "Private", "private_dir", "make_private", "hold", "sweep"]

#: An entry younger than this (seconds) is never swept: its maker may not have locked it yet
#: (``mkdtemp``/``mkstemp`` and ``flock`` are two steps).
GRACE_S = 60.0

_SWEEP_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO never blocks a sweep
_FLAGS = _SWEEP_FLAGS | os.O_DIRECTORY


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


def hold(fd: int) -> None:
    """Mark the temporary entry open on ``fd`` as in use for as long as it stays open (:func:`sweep`
    keeps it).  On a file system without ``flock`` it is kept by :data:`GRACE_S` only."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass


def sweep(prefix: str, parent: str | None = None) -> None:
    """Remove ``parent/prefix*`` directories and regular files of yours that nobody holds
    (:func:`hold`) and that are older than :data:`GRACE_S` (their maker was killed).  A link is never
    followed or removed, nor an entry of another uid.  Never raises."""
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


def make_private(prefix: str, parent: str | None = None) -> Private:
    """A new ``parent/prefix*`` directory (``mkdtemp``: mode 0700), locked while this process lives,
    after sweeping what killed processes left under the same prefix.

    Raises:
        PlaceError: ``parent`` (by default the temporary directory) is not a place of our own.
    """
    parent = parent or tempfile.gettempdir()
    why = trust_reason(os.path.join(parent, prefix))  # check, then create (threat-model: P4)
    if why:
        raise PlaceError(f"will not make a temporary directory in {formats.shown(parent, 200)}: {why}. Fix: set "
                         f"TMPDIR to a directory of your own (mkdir -m 700 ~/tmp; TMPDIR=~/tmp) or unset it")
    sweep(prefix, parent)
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    fd = os.open(path, _FLAGS)
    hold(fd)  # without flock, it is still removed on a normal exit
    return Private(path, fd)


@contextlib.contextmanager
def private_dir(prefix: str, parent: str | None = None) -> Iterator[str]:
    """:func:`make_private` as a context manager yielding the path."""
    d = make_private(prefix, parent)
    try:
        yield d.path
    finally:
        d.close()
