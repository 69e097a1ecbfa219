"""The on-disk memo of ``nvcc --version`` answers, one entry per nvcc binary.

File: ``<cache_root>/nvcc-version.json`` (see :mod:`flashinfer_sm120.safety.fs.statedir`),
schema version :data:`SCHEMA`::

    {"schema": 2,
     "entries": {"/usr/local/cuda-12.8/bin/nvcc":
                   {"stat": [dev, ino, size, mtime_ns, ctime_ns],
                    "full": "12.8.93" | null, "problem": null | "why", "at": 1764570000.0}}}

* an entry is used only while the binary's stat fingerprint is unchanged;
* a failure (hung, garbage) is remembered for :data:`FAILURE_MEMORY_S` so a
  server's workers do not each wait the timeout; an entry dated in the future
  counts as expired; only the *binary's* failures are remembered (exit status,
  timeout, output): a run that could not start for this process's own reasons
  (``EAGAIN`` under ``RLIMIT_NPROC``, ``EMFILE``...; :data:`flashinfer_sm120.safety.proc.LOCAL_ERRNOS`)
  is reported to the caller and not stored, so it cannot reject a good toolkit
  for every later process;
* a remembered version goes through :func:`flashinfer_sm120.safety.formats.parse_version`
  when read: an entry holding anything else (``" 13.0.88\n"``) is dropped;
* entries of the wrong shape are dropped (the file is named at INFO) and the
  file is rewritten on the next store; a file that is not ours, not regular
  (a FIFO), a symlink, or over :data:`MAX_MEMO_BYTES` is ignored and replaced;
* at most :data:`MAX_ENTRIES` entries are kept (oldest dropped);
* :func:`probe_once` holds a file lock while probing, so when sixteen workers
  start at once one runs nvcc and the others read its answer.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable

from flashinfer_sm120.safety import formats
from flashinfer_sm120.safety.fs.statedir import cache_root, lists_only
from flashinfer_sm120.safety.fs.statefiles import compute_once, read_json, write_json_atomic
from flashinfer_sm120.errors import FormatError, StateFileError

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["SCHEMA", "FAILURE_MEMORY_S", "MAX_ENTRIES", "MAX_MEMO_BYTES", "memo_path", "fingerprint",
           "lookup", "store", "probe_once"]

SCHEMA = 2

#: Seconds a failed ``nvcc --version`` (hung, garbage) is remembered, so every
#: worker process of a server does not wait the full timeout again.
FAILURE_MEMORY_S = 600.0

#: Entries kept; one per nvcc binary ever probed on this machine by this user.
MAX_ENTRIES = 64

#: Largest memo file read, bytes (64 entries take ~20 KiB).
MAX_MEMO_BYTES = 256 << 10

_FUTURE_SLACK_S = 60.0
_MAX_PROBLEM_CHARS = 4096  # a stored reason longer than this is not ours  # clock skew tolerated before an entry counts as "from the future"


def memo_path() -> str:
    """``<cache_root>/nvcc-version.json``.

    Raises:
        StateFileError: no usable cache root (see :func:`flashinfer_sm120.safety.fs.statedir.cache_root`).
    """
    return os.path.join(cache_root(), "nvcc-version.json")


def fingerprint(path: str) -> list[int] | None:
    """``[dev, ino, size, mtime_ns, ctime_ns]`` of ``path`` (links followed), or ``None``."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _valid(entry: object) -> bool:
    if not isinstance(entry, dict):
        return False
    fp, full, problem, at = (entry.get(k) for k in ("stat", "full", "problem", "at"))
    if full is not None:
        try:  # the one version grammar; only its canonical form is stored
            if not isinstance(full, str) or str(formats.parse_version(full, "memo")) != full:
                return False
        except FormatError:
            return False
    return (isinstance(fp, list) and len(fp) == 5 and all(type(x) is int for x in fp)
            and (problem is None or (isinstance(problem, str) and len(problem) <= _MAX_PROBLEM_CHARS))
            and (full is None) != (problem is None)
            and _finite_time(at))


def _finite_time(at: object) -> bool:
    """A number usable as a time: NaN never expires (compares as neither old nor
    new) and an int past float range makes ``now - at`` raise OverflowError."""
    if isinstance(at, bool) or not isinstance(at, (int, float)):
        return False
    try:
        return math.isfinite(at)
    except OverflowError:
        return False


def _load(path: str) -> dict[str, dict]:
    """Valid entries of the memo file; anything else is dropped with an INFO line."""
    data, why = read_json(path, max_bytes=MAX_MEMO_BYTES)
    if why:
        logger.info("flashinfer-sm120: ignoring the nvcc memo %s (%s); it will be rewritten", path, why)
        return {}
    if data is None:
        return {}
    entries = data.get("entries") if isinstance(data, dict) and data.get("schema") == SCHEMA else None
    if not isinstance(entries, dict):
        logger.info("flashinfer-sm120: ignoring the nvcc memo %s (not schema %d); it will be rewritten",
                    path, SCHEMA)
        return {}
    good = {k: v for k, v in entries.items() if isinstance(k, str) and _valid(v)}
    if len(good) != len(entries):
        logger.info("flashinfer-sm120: dropped %d malformed entr%s from the nvcc memo %s",
                    len(entries) - len(good), "y" if len(entries) - len(good) == 1 else "ies", path)
    return good


def lookup(nvcc: str, *, now: float | None = None) -> tuple[str | None, str | None] | None:
    """The remembered ``(full_version, problem)`` for ``nvcc``, or ``None``.

    ``None`` when there is no entry, the binary changed (fingerprint), the
    memo is unusable, or a failure entry expired (or is dated in the future).
    """
    try:
        path = memo_path()
    except StateFileError:
        return None
    entry = _load(path).get(nvcc)
    if entry is None or entry["stat"] != fingerprint(nvcc):
        return None
    now = time.time() if now is None else now
    if entry["problem"] is not None:
        age = now - entry["at"]
        if age > FAILURE_MEMORY_S or age < -_FUTURE_SLACK_S:
            return None
    return entry["full"], entry["problem"]


def store(nvcc: str, full: str | None, problem: str | None) -> None:
    """Remember an answer (atomic rewrite; oldest entries beyond
    :data:`MAX_ENTRIES` dropped).  A memo that cannot be written only costs
    time later: the reason is logged at INFO, nothing is raised."""
    if full is not None:  # only the canonical form of a version is ever written
        full = str(formats.parse_version(full, "nvcc --version"))
    try:
        path = memo_path()
        entries = _load(path)
        entries[nvcc] = {"stat": fingerprint(nvcc) or [0, 0, 0, 0, 0], "full": full,
                         "problem": problem, "at": time.time()}
        if len(entries) > MAX_ENTRIES:
            keep = sorted(entries, key=lambda k: entries[k]["at"], reverse=True)[:MAX_ENTRIES]
            entries = {k: entries[k] for k in keep}
        write_json_atomic(path, {"schema": SCHEMA, "entries": entries})  # sweeps killed writers' temp files
    except StateFileError as exc:
        logger.info("flashinfer-sm120: nvcc memo not saved: %s", exc)


def probe_once(nvcc: str, probe: Callable[[], tuple[str | None, str | None, bool]],
               lock_timeout: float) -> tuple[str | None, str | None]:
    """The memo's answer for ``nvcc``, else ``probe()`` run by one process at a time.

    ``probe()`` returns ``(full, problem, remember)``; the answer is stored only
    when ``remember`` is true (a failure of this process's resources is not the
    binary's and must not be remembered for other processes).

    Concurrent callers (workers starting together) wait on a file lock next to
    the memo for at most ``lock_timeout`` seconds, then read the answer the
    first one stored; if the lock cannot be had in time (or at all: read-only
    or lock-less file systems), they probe themselves (bounded anyway).
    """
    if lists_only():  # threat-model: P4: a command that only lists writes no memo and no lock file
        hit = lookup(nvcc)
        return hit if hit is not None else probe()[:2]

    def compute() -> tuple[str | None, str | None]:
        full, problem, remember = probe()
        if remember:
            store(nvcc, full, problem)
        return full, problem

    try:
        lock_path = memo_path() + ".lock"
    except StateFileError:
        return compute()
    return compute_once(lock_path, lambda: lookup(nvcc), compute, timeout=lock_timeout, what=f"probing {nvcc}")
