"""flashinfer-sm120's state files (the nvcc memo, launcher probes, memory estimates, view
metadata): read safely, written atomically, computed once by one process at a time.

* writes are atomic (:func:`flashinfer_sm120.safety.fs.atomic.write_atomic`; threat-model: P5);
* reads never follow a symlink (``O_NOFOLLOW``), never block on a FIFO
  (``O_NONBLOCK`` + regular-file check), are capped in size, and accept only
  files owned by the current uid (or root): :mod:`flashinfer_sm120.safety.formats` (threat-model: P6).

Where they live is :func:`flashinfer_sm120.safety.fs.statedir.cache_root`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

from flashinfer_sm120.errors import FormatError, StateFileError
from flashinfer_sm120.safety import oserrors
from flashinfer_sm120.safety.formats import read_json_file
from flashinfer_sm120.safety.fs import atomic

logger = logging.getLogger("flashinfer_sm120")

T = TypeVar("T")

__all__ = ["MAX_STATE_BYTES", "read_json", "write_json_atomic", "compute_once"]

#: Largest state file read (bytes).  The memo holds one small entry per nvcc
#: binary seen; anything larger is not ours and is rewritten.
MAX_STATE_BYTES = 1 << 20


def read_json(path: str, *, max_bytes: int = MAX_STATE_BYTES) -> tuple[Any, str | None]:
    """Read a JSON state file without following symlinks or blocking
    (:func:`flashinfer_sm120.safety.formats.read_json_file`: size cap while reading,
    depth-bounded, ``NaN`` refused, owner checked).

    Args:
        path: the file.
        max_bytes: size cap in bytes; a larger file is refused.

    Returns:
        ``(data, None)``, or ``(None, reason)`` when the file is absent, not a
        regular file, not owned by the current uid or root, too large, or not
        JSON.  ``reason`` is ``None`` too when the file simply does not exist.
    """
    if not os.path.lexists(path):
        return None, None
    try:
        return read_json_file(path, max_bytes, follow=False, owners=(0, os.geteuid())), None
    except FormatError as exc:
        return None, str(exc)


def write_json_atomic(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (:func:`flashinfer_sm120.safety.fs.atomic.write_atomic`, mode ``0600``).

    Raises:
        StateFileError: the directory is not writable or the disk is full; the
            message names the directory and ``FLASHINFER_SM120_CACHE_DIR``.
    """
    try:
        atomic.write_atomic(path, json.dumps(data).encode("utf-8"))
    except OSError as exc:  # the message by errno, never by exception class (threat-model: P8)
        directory = os.path.dirname(path) or "."
        why = oserrors.describe(exc, directory, "set FLASHINFER_SM120_CACHE_DIR to another directory")
        raise StateFileError(f"cannot write {path}: {why}") from exc


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
