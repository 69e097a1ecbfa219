"""The on-disk memo of ``--version`` answers (nvcc, ninja), so that a server's workers probe once.

``<cache_root>/nvcc-version.json`` = ``{"schema": 2, "entries": {path: {"stat": [dev, ino, size,
mtime_ns, ctime_ns], "full": "12.8.93" | null, "problem": null | "why", "at": time}}}``.  An entry
holds while the binary's stat is unchanged, a failure for :data:`FAILURE_MEMORY_S`; only the binary's
failures are stored.  Anything else is dropped and rewritten; a listing command writes nothing (P4).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable

from flashinfer_sm120.errors import FormatError, StateFileError
from flashinfer_sm120.safety.formats.grammar import parse_version
from flashinfer_sm120.safety.fs.statedir import cache_root, lists_only
from flashinfer_sm120.safety.fs.atomic import compute_once, read_json, write_json_atomic

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["SCHEMA", "FAILURE_MEMORY_S", "MAX_ENTRIES", "MAX_MEMO_BYTES", "memo_path", "fingerprint",
           "lookup", "store", "probe_once"]

SCHEMA = 2
#: Seconds a failed probe (hung, garbage) is remembered, so each worker does not wait the timeout again.
FAILURE_MEMORY_S = 600.0
#: Entries kept (oldest dropped beyond).
MAX_ENTRIES = 64
#: Largest memo file read, bytes (64 entries take ~20 KiB).
MAX_MEMO_BYTES = 256 << 10
_FUTURE_SLACK_S = 60.0  # clock skew tolerated before an entry counts as "from the future"
_MAX_PROBLEM_CHARS = 4096  # a stored reason longer than this is not ours


def memo_path() -> str:
    return os.path.join(cache_root(), "nvcc-version.json")


def fingerprint(path: str) -> list[int] | None:
    """``[dev, ino, size, mtime_ns, ctime_ns]`` of ``path`` (links followed), or ``None``."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _valid(e: object) -> bool:
    """An entry of our shape: a canonical version xor a bounded reason, an int stat, a finite time (P6)."""
    if not isinstance(e, dict):
        return False
    full, problem, at, fp = e.get("full"), e.get("problem"), e.get("at"), e.get("stat")
    try:
        if full is not None and not (isinstance(full, str) and str(parse_version(full, "memo")) == full):
            return False
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
            return False
    except (FormatError, OverflowError):
        return False
    return (isinstance(fp, list) and len(fp) == 5 and all(type(x) is int for x in fp)
            and (full is None) != (problem is None)
            and (problem is None or (isinstance(problem, str) and len(problem) <= _MAX_PROBLEM_CHARS)))


def _load(path: str) -> dict[str, dict]:
    data, why = read_json(path, max_bytes=MAX_MEMO_BYTES)
    if data is None and why is None:
        return {}
    entries = data.get("entries") if isinstance(data, dict) and data.get("schema") == SCHEMA else None
    if not isinstance(entries, dict):
        logger.info("flashinfer-sm120: ignoring the nvcc memo %s (%s); it will be rewritten", path,
                    why or f"not schema {SCHEMA}")
        return {}
    good = {k: v for k, v in entries.items() if isinstance(k, str) and _valid(v)}
    dropped = len(entries) - len(good)
    if dropped:
        logger.info("flashinfer-sm120: dropped %d malformed entr%s from the nvcc memo %s", dropped,
                    "y" if dropped == 1 else "ies", path)
    return good


def lookup(nvcc: str, *, now: float | None = None) -> tuple[str | None, str | None] | None:
    """The remembered ``(full, problem)`` for ``nvcc``, unless absent, changed, unusable or expired."""
    try:
        entry = _load(memo_path()).get(nvcc)
    except StateFileError:
        return None
    if entry is None or entry["stat"] != fingerprint(nvcc):
        return None
    age = (time.time() if now is None else now) - entry["at"]
    if entry["problem"] is not None and not -_FUTURE_SLACK_S <= age <= FAILURE_MEMORY_S:
        return None
    return entry["full"], entry["problem"]


def store(nvcc: str, full: str | None, problem: str | None) -> None:
    """Remember an answer (atomic rewrite, at most :data:`MAX_ENTRIES`); failing only costs time later."""
    if full is not None:  # only the canonical form of a version is ever written
        full = str(parse_version(full, "nvcc --version"))
    try:
        path = memo_path()
        entries = _load(path)
        entries[nvcc] = {"stat": fingerprint(nvcc) or [0] * 5, "full": full, "problem": problem, "at": time.time()}
        keep = sorted(entries, key=lambda k: entries[k]["at"], reverse=True)[:MAX_ENTRIES]
        write_json_atomic(path, {"schema": SCHEMA, "entries": {k: entries[k] for k in keep}})
    except StateFileError as exc:
        logger.info("flashinfer-sm120: nvcc memo not saved: %s", exc)


def probe_once(nvcc: str, probe: Callable[[], tuple[str | None, str | None, bool]],
               lock_timeout: float) -> tuple[str | None, str | None, bool]:
    """``(full, problem, local)``: the memo's answer, else ``probe()``'s ``(full, problem, remember)`` run by
    one process at a time; ``local`` when it failed for this process's own reasons (not stored)."""

    def remembered() -> tuple[str | None, str | None, bool] | None:
        hit = lookup(nvcc)
        return None if hit is None else (*hit, False)

    def compute() -> tuple[str | None, str | None, bool]:
        full, problem, remember = probe()
        if remember and not lists_only():  # P4: a command that only lists writes no memo and no lock file
            store(nvcc, full, problem)
        return full, problem, not remember

    if lists_only():
        return remembered() or compute()
    try:
        lock_path = memo_path() + ".lock"
    except StateFileError:
        return compute()
    return compute_once(lock_path, remembered, compute, timeout=lock_timeout, what=f"probing {nvcc}")
