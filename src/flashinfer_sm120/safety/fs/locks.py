"""Who holds a file lock: the processes ``/proc/locks`` names for one file (Linux).

A lock file any local user can read can be ``flock``-ed by any of them (a shared lock needs no write
permission): FlashInfer's per-module lock in a JIT directory is such a file.  A wait on it is told, and
a holder of another uid is named and not waited for (threat-model: P6, A4).
"""
# threat-model: P6 (no wait without end on another uid's process)

from __future__ import annotations

import dataclasses
import os

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety import formats

__all__ = ["Holder", "parse_proc_locks", "holders", "PROC_LOCKS_MAX"]

#: Bytes of ``/proc/locks`` read: a few thousand locks; a holder past them is not named (the wait
#: is still told).
PROC_LOCKS_MAX = 1 << 20


@dataclasses.dataclass(frozen=True)
class Holder:
    """A process holding a lock: ``pid`` as this PID namespace sees it, ``uid`` its owner
    (``None`` when it is gone or cannot be seen)."""

    pid: int
    uid: int | None


def parse_proc_locks(text: str, dev: int, ino: int) -> list[int]:
    """The pids of the ``/proc/locks`` lines on the file ``(dev, ino)``: ``1: FLOCK ADVISORY WRITE
    9174 fe:00:2146629 0 EOF`` (pid, then major:minor in hex and the inode in decimal; fs/locks.c
    ``lock_get_status``).  A line of another form is skipped; a pid 0 (a holder in a PID namespace
    this one cannot see) is dropped.  Never raises."""
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
    """The processes holding a lock on ``path``, with their owners; ``[]`` when none is seen,
    the file is absent or ``/proc/locks`` cannot be read.  Never raises."""
    try:
        st = os.stat(path)
        text = formats.read_prefix("/proc/locks", PROC_LOCKS_MAX).decode("ascii", "replace")
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
