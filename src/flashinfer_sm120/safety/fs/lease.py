"""Leases (threat-model: P3, docs/safety.md section 10): a shared ``flock`` on ``.<name>.lease`` beside a view
or JIT workspace, held for the process's lifetime (``O_CLOEXEC``: a forked child shares it, a program run does
not); prune takes it exclusively without waiting.  And who holds a lock, from ``/proc/locks`` (P6, naming only)."""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import threading
import time

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.reads import read_bytes

__all__ = ["WAIT_S", "lease_path", "target_of", "hold", "held", "release", "leased", "lease_state", "take_exclusive",
           "end_exclusive", "place_problem", "Holder", "parse_proc_locks", "holders", "PROC_LOCKS_MAX"]

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


def target_of(path: str) -> str | None:
    """The directory whose lease file ``path`` is, or ``None`` when ``path`` is not one."""
    name = os.path.basename(path)
    if not (name.startswith(".") and name.endswith(".lease")) or len(name) <= len("..lease"):
        return None
    return os.path.join(os.path.dirname(path), name[1:-len(".lease")])


def place_problem(target: str) -> str | None:
    """Why no lease on ``target`` may be made (its directory is not ours: P4), so prune keeps it (P3); creates nothing."""
    from flashinfer_sm120.safety.ownership import check_place

    problem = check_place(os.path.dirname(lease_path(target)), "the directory of its lease")
    return str(problem) if problem else None


def _same_file(fd: int, path: str) -> bool:
    """The path still names the file open on ``fd`` (prune has not unlinked or replaced it)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _would_block(exc: OSError) -> bool:
    return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


def _try_lock(path: str, how: int) -> tuple[int | None, bool]:
    """``(fd, False)`` of ``path`` created and locked ``how`` without waiting, else ``(None, busy)``."""
    try:
        fd = os.open(path, _FLAGS, 0o600)
    except OSError:
        return None, False
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        return None, _would_block(exc)
    if _same_file(fd, path):
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
            if _same_file(fd, path):
                return True
            os.close(fd)  # unlinked by a prune that found it free (a fork's parent dropped it)
            del _held[path]
        deadline = time.monotonic() + wait_s
        while True:
            fd, busy = _try_lock(path, fcntl.LOCK_SH)
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


def leased(target: str) -> bool:
    """Whether some process holds a lease on ``target`` (read-only probe: creates nothing)."""
    return lease_state(target) is not None


def lease_state(target: str) -> str | None:
    """``None`` when nobody holds a lease on ``target``, else why it counts as held (P3, P8); creates nothing."""
    path = lease_path(target)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:  # cannot tell: treated as held
        if exc.errno == errno.ELOOP:
            return f"its lease file {path} is a symlink, so whether it is in use cannot be told; remove the link"
        return f"its lease file {path} cannot be checked ({exc.strerror or exc}), so it is treated as in use"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return None
    except OSError as exc:
        if _would_block(exc):
            return f"in use: a running process holds its lease ({path})"
        return f"its lease file {path} cannot be locked ({exc.strerror or exc}), so it is treated as in use"
    finally:
        os.close(fd)


# threat-model: P3
def take_exclusive(target: str) -> int | None:
    """The lease on ``target`` taken exclusively without waiting, to remove it: the descriptor, or ``None``."""
    return _try_lock(lease_path(target), fcntl.LOCK_EX)[0]


def end_exclusive(target: str, fd: int, removed: bool) -> None:
    """Let go of :func:`take_exclusive`'s lock, first unlinking the lease file of a removed ``target``."""
    try:
        if removed and _same_file(fd, lease_path(target)):
            try:
                os.unlink(lease_path(target))
            except OSError:
                pass
    finally:
        os.close(fd)


#: Bytes of ``/proc/locks`` read: a few thousand locks (a holder past them is not named).
PROC_LOCKS_MAX = 1 << 20


@dataclasses.dataclass(frozen=True)
class Holder:
    """A lock's holder: ``pid`` in this PID namespace, ``uid`` (``None``: gone or not visible)."""

    pid: int
    uid: int | None


def parse_proc_locks(text: str, dev: int, ino: int) -> list[int]:
    """The pids holding a lock on ``(dev, ino)`` in ``/proc/locks`` (Linux fs/locks.c ``lock_get_status``)."""
    want = f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}"
    out = []
    for line in text.splitlines():
        words = line.split()
        if "->" in words[1:2]:  # a waiter ("1: -> FLOCK ..."), not a holder
            continue
        for i, w in enumerate(words[:-1]):
            if words[i + 1] == want and w.isascii() and w.isdigit() and 0 < int(w) < 1 << 32:
                out.append(int(w))
                break
    return out


def holders(path: str | os.PathLike) -> list[Holder]:
    """The processes holding a lock on ``path`` (anyone who can read a file may ``flock`` it: P6); never raises."""
    try:
        st = os.stat(path)
        text = read_bytes("/proc/locks", PROC_LOCKS_MAX, prefix=True).decode("ascii", "replace")
    except (OSError, FormatError):
        return []
    out = []
    for pid in parse_proc_locks(text, st.st_dev, st.st_ino):
        try:
            uid: int | None = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            uid = None
        out.append(Holder(pid, uid))
    return out
