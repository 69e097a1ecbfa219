"""What prune does with leases (P3): whether one is held (:func:`lease_state`, creates nothing), taking it
exclusively without waiting; and who holds a lock, from ``/proc/locks`` (P6, naming only)."""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import os

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.reads import read_bytes
from flashinfer_sm120.safety.fs.lease import same_file, try_lock, would_block, lease_path

__all__ = ["target_of", "lease_state", "take_exclusive", "end_exclusive", "Holder", "parse_proc_locks", "holders",
           "PROC_LOCKS_MAX"]


def target_of(path: str) -> str | None:
    """The directory whose lease file ``path`` is, or ``None`` when ``path`` is not one."""
    name = os.path.basename(path)
    if not (name.startswith(".") and name.endswith(".lease")) or len(name) <= len("..lease"):
        return None
    return os.path.join(os.path.dirname(path), name[1:-len(".lease")])


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
        if would_block(exc):
            return f"in use: a running process holds its lease ({path})"
        return f"its lease file {path} cannot be locked ({exc.strerror or exc}), so it is treated as in use"
    finally:
        os.close(fd)


# threat-model: P3
def take_exclusive(target: str) -> int | None:
    """The lease on ``target`` taken exclusively without waiting, to remove it: the descriptor, or ``None``."""
    return try_lock(lease_path(target), fcntl.LOCK_EX)[0]


def end_exclusive(target: str, fd: int, removed: bool) -> None:
    """Let go of :func:`take_exclusive`'s lock, first unlinking the lease file of a removed ``target``."""
    try:
        if removed and same_file(fd, lease_path(target)):
            with contextlib.suppress(OSError):
                os.unlink(lease_path(target))
    finally:
        os.close(fd)


#: Bytes of ``/proc/locks`` read: a few thousand locks (a holder past them is not named).
PROC_LOCKS_MAX = 1 << 20


#: A lock's holder: ``pid`` in this PID namespace, ``uid`` (``None``: gone or not visible).
Holder = collections.namedtuple("Holder", "pid uid")


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
