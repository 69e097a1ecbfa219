"""flashinfer-sm120's JSON state files (the nvcc memo, launcher probes, memory estimates, view
metadata): read bounded, never through a link and only when this uid's or root's (P6), written
atomically (P5), computed once by one process at a time.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

from flashinfer_sm120.errors import FormatError, StateFileError
from flashinfer_sm120.safety import oserrors
from flashinfer_sm120.safety.formats.reads import read_json_file
from flashinfer_sm120.safety.fs import atomic

logger = logging.getLogger("flashinfer_sm120")

T = TypeVar("T")

__all__ = ["MAX_STATE_BYTES", "read_json", "write_json_atomic", "compute_once"]

#: Largest state file read (bytes): anything larger is not ours and is rewritten.
MAX_STATE_BYTES = 1 << 20


def read_json(path: str, *, max_bytes: int = MAX_STATE_BYTES) -> tuple[Any, str | None]:
    """``(data, None)`` of a JSON state file (:func:`flashinfer_sm120.safety.formats.reads.read_json_file`,
    no symlink, owned by this uid or root); ``(None, None)`` when absent, ``(None, reason)`` when refused."""
    if not os.path.lexists(path):
        return None, None
    try:
        return read_json_file(path, max_bytes, follow=False, owners=(0, os.geteuid())), None
    except FormatError as exc:
        return None, str(exc)


def write_json_atomic(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (mode ``0600``); :class:`StateFileError` by errno."""
    try:
        atomic.write_atomic(path, json.dumps(data).encode("utf-8"))
    except OSError as exc:  # the message by errno, never by exception class (threat-model: P8)
        directory = os.path.dirname(path) or "."
        why = oserrors.describe(exc, directory, "set FLASHINFER_SM120_CACHE_DIR to another directory")
        raise StateFileError(f"cannot write {path}: {why}") from exc


def compute_once(lock_path: str, lookup: Callable[[], T | None], compute: Callable[[], T], *,
                 timeout: float, what: str) -> T:
    """``lookup()``'s answer, else ``compute()`` (which stores it) run by one process at a time:
    workers wait on the file lock ``lock_path`` at most ``timeout`` seconds, then look again; without
    the lock (timeout, read-only or lock-less file system) they compute themselves."""
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
