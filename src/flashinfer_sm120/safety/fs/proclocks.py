"""Who holds a file lock, read from ``/proc/locks`` (threat-model: P6): a module lock another uid holds is named,
never waited on without end."""

from __future__ import annotations

import collections
import os

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.reads import read_bytes


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


def foreign(path: str | os.PathLike) -> Holder | None:
    """A holder of the lock on ``path`` of another uid than ours: it can hold it for ever, so it is named, never
    waited for (P6)."""
    return next((h for h in holders(path) if h.uid is not None and h.uid != os.geteuid()), None)
