"""FlashInfer's per-module lock, taken as FlashInfer takes it: a wait is told, a holder of another uid refused.

FlashInfer 0.4 - 0.7.x (``flashinfer/jit/core.py``) serialises the builds of one module on
``FileLock(get_tmpdir() / f"{name}.lock")``, ``get_tmpdir()`` being ``FLASHINFER_JIT_DIR/tmp``; a
server building a module, ``build`` and ``cache import`` installing it take turns on it
(threat-model: P5).  Anyone who can read the lock file can ``flock`` it, for as long as they like:
a holder of another uid ends the wait at once with its pid and the fix (threat-model: P6).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock, Timeout  # a dependency (and FlashInfer's)

from flashinfer_sm120.errors import PlaceError
from flashinfer_sm120.safety.fs.locks import Holder, holders

__all__ = ["lock_path", "try_take", "foreign_holder", "refusal", "take", "held", "SAY_EVERY_S"]

#: Seconds between two "still waiting" lines while another process of this user builds the module.
SAY_EVERY_S = 60.0


def lock_path(jit_dir: str | os.PathLike, name: str) -> Path:
    """Where FlashInfer locks module ``name`` (``JitSpecNvcc.lock_path``)."""
    return Path(jit_dir) / "tmp" / f"{name}.lock"


def try_take(path: str | os.PathLike) -> FileLock | None:
    """The lock at ``path`` taken without waiting, or ``None`` when another process holds it."""
    lock = FileLock(str(path), thread_local=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return None
    return lock


def foreign_holder(path: str | os.PathLike) -> Holder | None:
    """A process of another uid holding the lock at ``path`` (from ``/proc/locks``), or ``None``."""
    me = os.geteuid()
    return next((h for h in holders(path) if h.uid is not None and h.uid != me), None)


def refusal(path: str | os.PathLike, label: str, h: Holder) -> str:
    """Why a lock ``h`` holds is not waited for, naming it, its holder and the fix."""
    return (f"{label}: FlashInfer's lock {path} is held by pid {h.pid} of uid {h.uid}, not you; it can hold "
            f"your build off for as long as it likes, so it is not waited for. Fix: build in a JIT directory "
            f"others cannot enter (mkdir -m 700 ~/fi-jit; FLASHINFER_WORKSPACE_BASE=~/fi-jit), or ask uid "
            f"{h.uid} to end pid {h.pid}")


def take(path: str | os.PathLike, label: str, say: Callable[[str], None], *,
         every: float = SAY_EVERY_S, poll: float = 0.5) -> FileLock:
    """The lock at ``path``, waited for while processes of this user hold it (``say`` is told at
    once and every ``every`` seconds, naming the lock).

    Raises:
        PlaceError: a process of another uid holds it (its pid, uid and the fix).
    """
    t0, said = time.monotonic(), None
    while (lock := try_take(path)) is None:
        h = foreign_holder(path)
        if h is not None:
            raise PlaceError(refusal(path, label, h))
        now = time.monotonic()
        if said is None or now - said >= every:
            said = now
            pids = ", ".join(str(x.pid) for x in holders(path)) or "not visible here"
            say(f"{label}: waiting for another process building it (FlashInfer's lock {path}, held by "
                f"pid {pids}){f'; {round(now - t0)} s so far' if now > t0 + 1 else ''}")
        time.sleep(poll)
    return lock


@contextlib.contextmanager
def held(path: str | os.PathLike, label: str, say: Callable[[str], None]) -> Iterator[None]:
    """:func:`take` as a context manager."""
    lock = take(path, label, say)
    try:
        yield
    finally:
        lock.release()
