"""The memo of ``--version`` answers (nvcc, ninja) in ``<cache root>/nvcc-version.json``: one bounded run per binary
(P6), kept while its :func:`fingerprint` holds (a failure: :data:`FAILURE_MEMORY_S`); listing writes none (P4)."""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable

from packaging.version import Version

from flashinfer_sm120.errors import FormatError, StateFileError
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.formats.grammar import parse_version
from flashinfer_sm120.safety.fs.statedir import cache_root
from flashinfer_sm120.safety.fs.atomic import compute_once, read_json, write_json_atomic
from flashinfer_sm120.safety.ownership import fingerprint

logger = logging.getLogger("flashinfer_sm120")

#: ``{"schema": 2, "entries": {path: {"stat": fingerprint, "full": "12.8.93" | null, "problem": null | "why",
#: "at": time}}}``; anything else is dropped and rewritten.
SCHEMA = 2
#: Seconds a failed probe (hung, garbage) is remembered, so each worker does not wait the timeout again.
FAILURE_MEMORY_S = 600.0
MAX_ENTRIES = 64
#: Largest memo file read, bytes (64 entries take ~20 KiB).
MAX_MEMO_BYTES = 256 << 10
#: Bytes of ``--version`` output kept; a real nvcc prints ~250, more is not an nvcc (P6).
MAX_OUTPUT = 16 << 10
_FUTURE_SLACK_S = 60.0  # clock skew tolerated before an entry counts as "from the future"
_LATER = f"(not retried for {FAILURE_MEMORY_S / 60:g} min)"


class LocalProblem(str):
    """A probe that failed for this process's own resources (``proc.LOCAL_ERRNOS``), not the program's: its
    ``fix`` (raise the limit) is the fix of any choice among the candidates (threat-model: P8)."""

    def __new__(cls, text: str, fix: str) -> LocalProblem:
        self = super().__new__(cls, f"{text}; {fix}")
        self.fix = fix
        return self


def local_fix(problems: Iterable[str | None]) -> str | None:
    """The fix of the first :class:`LocalProblem` among ``problems``, else ``None``."""
    return next((p.fix for p in problems if isinstance(p, LocalProblem)), None)


def memo_path() -> str:
    return os.path.join(cache_root(), "nvcc-version.json")


def _valid(e: object) -> bool:
    """An entry of our shape: a canonical version xor a bounded reason, an int stat, a finite time (P6)."""
    if not isinstance(e, dict):
        return False
    full, problem, at, fp = e.get("full"), e.get("problem"), e.get("at"), e.get("stat")
    try:
        if full is not None and not (isinstance(full, str) and str(parse_version(full, "memo")) == full):
            return False
        if type(at) not in (int, float) or not math.isfinite(at):
            return False
    except (FormatError, OverflowError):
        return False
    return (isinstance(fp, list) and len(fp) == 5 and all(type(x) is int for x in fp)
            and (full is None) != (problem is None)
            and (problem is None or (isinstance(problem, str) and len(problem) <= 4096)))


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
    if len(good) < len(entries):
        logger.info("flashinfer-sm120: dropped %d malformed entries from the nvcc memo %s",
                    len(entries) - len(good), path)
    return good


def lookup(path: str) -> tuple[str | None, str | None] | None:
    """The remembered ``(full, problem)`` for ``path``, unless absent, changed, unusable or expired."""
    try:
        entry = _load(memo_path()).get(path)
    except StateFileError:
        return None
    if entry is None or entry["stat"] != fingerprint(path):
        return None
    age = time.time() - entry["at"]
    if entry["problem"] is not None and not -_FUTURE_SLACK_S <= age <= FAILURE_MEMORY_S:
        return None
    return entry["full"], entry["problem"]


def store(path: str, full: str | None, problem: str | None) -> None:
    """Remember an answer (atomic rewrite, at most :data:`MAX_ENTRIES`); failing only costs time later."""
    if full is not None:  # only the canonical form of a version is ever written
        full = str(parse_version(full, "--version"))
    try:
        memo = memo_path()
        entries = _load(memo)
        entries[path] = {"stat": fingerprint(path) or [0] * 5, "full": full, "problem": problem, "at": time.time()}
        keep = sorted(entries, key=lambda k: entries[k]["at"], reverse=True)[:MAX_ENTRIES]
        write_json_atomic(memo, {"schema": SCHEMA, "entries": {k: entries[k] for k in keep}})
    except StateFileError as exc:
        logger.info("flashinfer-sm120: nvcc memo not saved: %s", exc)


def version_of(path: str, parse: Callable[[str], str], *, name: str, fix: str,
               timeout: float) -> tuple[str | None, str | None]:
    """``(full, problem)`` of ``path --version`` (``parse(output)`` gives the version), run by one process
    at a time while others wait on the memo; a failure for this process's own reasons is not remembered."""

    def remembered() -> tuple[str | None, str | None, bool] | None:
        hit = lookup(path)
        return None if hit is None else (*hit, True)

    def compute() -> tuple[str | None, str | None, bool]:
        full, problem, remember = _run_version(path, parse, name, fix, timeout)
        if remember:
            store(path, full, problem)
        return full, problem, remember

    try:
        lock_path = memo_path() + ".lock"
    except StateFileError:
        return compute()[:2]
    return compute_once(lock_path, remembered, compute, timeout=timeout + 5.0, what=f"probing {path}")[:2]


def _run_version(path: str, parse: Callable[[str], str], name: str, fix: str,
                 timeout: float) -> tuple[str | None, str | None, bool]:
    """``(full, problem, remember)`` of one bounded run (a memo miss only: safety.proc loads only then)."""
    from flashinfer_sm120.safety import oserrors, proc

    res = proc.run([path, "--version"], timeout=timeout, max_output=MAX_OUTPUT)
    if res.local:
        why = oserrors.describe(OSError(res.errno, res.error), path, "retry")
        return None, LocalProblem(f"{res.error}: {why.message}, not a fault of {path} (not remembered)", why.fix), False
    if res.error:
        return None, f"{res.error}; fix it {fix}", True
    if res.timed_out:
        return None, (f"{path} did not answer '{name} --version' within {timeout:g} s; it is hung or broken: "
                      f"fix or remove it, {fix} {_LATER}"), True
    if res.truncated:
        return None, (f"{path} --version printed more than {MAX_OUTPUT} bytes and was stopped; it is not a "
                      f"working {name}: fix or remove it, {fix} {_LATER}"), True
    out = res.text()
    try:
        return parse(out), None, True
    except (AttributeError, FormatError) as exc:  # no version line, or not a version
        lines = out.strip().splitlines()
        first = f"first line: {shown(lines[0], 120)}" if lines else "no output"
        what = "no 'release X.Y, VX.Y.Z' line" if name == "nvcc" else f"no version ({exc})"
        return None, (f"{path} --version printed {what} (exit {res.returncode}, {first}); it is not a "
                      f"working {name}: fix it {fix}"), True


def tool_release(path: str) -> Version | None:
    """The ``release X.Y`` that ``path --version`` prints (:func:`version_of`), or ``None``; run only when it passes
    the trust rule (P2)."""
    from flashinfer_sm120.safety.trust import trace

    if trace(path).problem is not None or not os.access(path, os.X_OK):
        return None

    def parse(out: str) -> str:
        return str(parse_version(re.search(r"release (\d+\.\d+)", out, re.M).group(1), f"{path} --version"))

    full, _ = version_of(path, parse, name=os.path.basename(path), fix="", timeout=20.0)
    return Version(full) if full else None
