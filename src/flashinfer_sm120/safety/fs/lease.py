"""Leases (threat-model: P3, docs/safety.md section 10): a shared ``flock`` on ``.<name>.lease`` beside a view or JIT
workspace, held for the process's lifetime (``O_CLOEXEC``: a forked child shares it, a program run does not)."""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time


__all__ = ["WAIT_S", "lease_path", "hold", "held", "release", "place_problem", "same_file", "try_lock", "would_block"]

#: Seconds :func:`hold` waits while a prune holds the lease exclusively (it removes one directory).
WAIT_S = 90.0
_POLL_S = 0.02
_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC

_lock = threading.Lock()
_held: dict[str, int] = {}  # lease path -> descriptor holding LOCK_SH (for the process's lifetime)


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # a thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_after_fork)


def lease_path(target: str) -> str:
    """The lease file of the directory ``target``: ``.<name>.lease`` beside it."""
    target = os.path.abspath(target).rstrip("/")
    return os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.lease")


def place_problem(target: str) -> str | None:
    """Why no lease on ``target`` may be made (its directory is not ours: P4), so prune keeps it (P3); creates nothing."""
    from flashinfer_sm120.safety.ownership import check_place

    problem = check_place(os.path.dirname(lease_path(target)), "the directory of its lease")
    return str(problem) if problem else None


def same_file(fd: int, path: str) -> bool:
    """The path still names the file open on ``fd`` (prune has not unlinked or replaced it)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def would_block(exc: OSError) -> bool:
    return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


def try_lock(path: str, how: int) -> tuple[int | None, bool]:
    """``(fd, False)`` of ``path`` created and locked ``how`` without waiting, else ``(None, busy)``."""
    try:
        fd = os.open(path, _FLAGS, 0o600)
    except OSError as exc:
        if exc.errno != errno.EROFS or how != fcntl.LOCK_SH:
            return None, False
        try:  # a read-only image's cache: flock needs no write access, and the file is there or not
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None, False
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        return None, would_block(exc)
    if same_file(fd, path):
        return fd, False
    os.close(fd)  # locked a file prune unlinked meanwhile: take the new one
    return None, True


# threat-model: P3
def hold(target: str, wait_s: float = WAIT_S) -> bool:
    """Take a shared lease on ``target`` for this process's lifetime; ``False`` when not had within ``wait_s``."""
    path = lease_path(target)
    with _lock:
        fd = _held.get(path)
        if fd is not None:
            if same_file(fd, path):
                return True
            os.close(fd)  # unlinked by a prune that found it free (a fork's parent dropped it)
            del _held[path]
        deadline = time.monotonic() + wait_s
        while True:
            fd, busy = try_lock(path, fcntl.LOCK_SH)
            if fd is not None:
                _held[path] = fd
                return True
            if not busy or time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)  # a prune is removing it: wait, then take it anew


def held(target: str) -> bool:
    """Whether this process holds the lease on ``target``."""
    with _lock:
        return lease_path(target) in _held


def release(target: str) -> None:
    """Give this process's lease on ``target`` back: closed, not unlocked (``LOCK_UN`` drops a forked child's too)."""
    with _lock:
        fd = _held.pop(lease_path(target), None)
    if fd is not None:
        os.close(fd)
