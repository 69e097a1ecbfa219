"""Who holds a file lock: the processes ``/proc/locks`` names for one file (Linux).  Any local user who
can read FlashInfer's per-module lock file can ``flock`` it, so a wait on it is told and a holder of
another uid is named, not waited for (threat-model: P6, A4).  Naming only: nothing is removed on it (P3).
"""

from __future__ import annotations

import dataclasses
import os

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.reads import read_prefix

__all__ = ["Holder", "parse_proc_locks", "holders", "PROC_LOCKS_MAX"]

#: Bytes of ``/proc/locks`` read: a few thousand locks (a holder past them is not named).
PROC_LOCKS_MAX = 1 << 20


@dataclasses.dataclass(frozen=True)
class Holder:
    """A lock's holder: ``pid`` in this PID namespace, ``uid`` (``None``: gone or not visible)."""

    pid: int
    uid: int | None


def parse_proc_locks(text: str, dev: int, ino: int) -> list[int]:
    """The pids of the ``/proc/locks`` lines on the file ``(dev, ino)``: ``1: FLOCK ADVISORY WRITE
    9174 fe:00:2146629 0 EOF`` (Linux fs/locks.c ``lock_get_status``); other lines, waiters and pid 0
    (another PID namespace) are skipped.  Never raises."""
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
    """The processes holding a lock on ``path``; ``[]`` when none is seen or cannot be.  Never raises."""
    try:
        st = os.stat(path)
        text = read_prefix("/proc/locks", PROC_LOCKS_MAX).decode("ascii", "replace")
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
