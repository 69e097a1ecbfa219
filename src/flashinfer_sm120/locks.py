"""One process at a time computes what every worker wants (the nvcc probe, the launcher probe):
the others wait on a file lock, then read what the first one stored."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

logger = logging.getLogger("flashinfer_sm120")

T = TypeVar("T")

__all__ = ["compute_once"]


def compute_once(lock_path: str, lookup: Callable[[], T | None], compute: Callable[[], T], *,
                 timeout: float, what: str) -> T:
    """``lookup()``'s answer, else ``compute()`` run by one process at a time.

    Workers starting together wait on a file lock at ``lock_path`` for at most
    ``timeout`` seconds, then look again (the first one has stored its answer);
    when the lock cannot be had in time, or at all (a read-only or lock-less file
    system), they compute themselves.  ``compute`` stores what should be remembered.
    """
    hit = lookup()
    if hit is not None:
        return hit
    lock = None
    try:
        import filelock

        lock = filelock.FileLock(lock_path, timeout=timeout)
        lock.acquire()
    except Exception as exc:  # Timeout, OSError
        logger.debug("flashinfer-sm120: %s without the lock %s (%s)", what, lock_path, exc)
        lock = None
    try:
        if lock is not None:
            hit = lookup()
            if hit is not None:
                return hit
        return compute()
    finally:
        if lock is not None:
            try:
                lock.release()
            except Exception:
                pass
