"""Private temporary directories, made only in a place of our own (P4), held while their maker
lives and swept by the next maker after a kill (:mod:`flashinfer_sm120.safety.fs.atomic`, P5)."""

from __future__ import annotations

import os
import shutil
import tempfile

from flashinfer_sm120.errors import PlaceError
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.fs.atomic import hold, sweep
from flashinfer_sm120.safety.ownership import trust_reason

__all__ = ["Private", "make_private"]

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_DIRECTORY


class Private:
    """A locked temporary directory: ``path``; :meth:`close` (or leaving ``with``, which yields the
    path) removes it and drops the lock."""

    def __init__(self, path: str, fd: int) -> None:
        self.path, self._fd = path, fd

    def __enter__(self) -> str:
        return self.path

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)
        self._fd = None


def make_private(prefix: str, parent: str | None = None) -> Private:
    """A new ``mkdtemp`` directory ``parent/prefix*``, locked while this process lives, after sweeping what
    killed processes left; :class:`PlaceError` when ``parent`` is not a place of our own."""
    parent = parent or tempfile.gettempdir()
    why = trust_reason(os.path.join(parent, prefix))  # check, then create (threat-model: P4)
    if why:
        raise PlaceError(f"will not make a temporary directory in {shown(parent, 200)}: {why}. Fix: set "
                         f"TMPDIR to a directory of your own (mkdir -m 700 ~/tmp; TMPDIR=~/tmp) or unset it")
    sweep(prefix, parent)
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    fd = os.open(path, _FLAGS)
    hold(fd)  # without flock, it is still removed on a normal exit
    return Private(path, fd)
