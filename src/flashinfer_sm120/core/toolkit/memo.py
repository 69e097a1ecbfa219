"""Keyed JSON memos in the cache root (``--version`` answers, launcher probes, compile peaks): bounded, rewritten
atomically, kept while the ``stat`` holds (a failure: :data:`FAILURE_MEMORY_S`); one process computes (P6)."""

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

#: Seconds a failed probe (hung, garbage) is remembered, so each worker does not wait the timeout again.
FAILURE_MEMORY_S = 600.0
#: Largest memo file read, bytes (64 entries take ~20 KiB).
MAX_MEMO_BYTES = 256 << 10
#: Bytes of ``--version`` output kept; a real nvcc prints ~250, more is not an nvcc (P6).
MAX_OUTPUT = 16 << 10
_FUTURE_SLACK_S = 60.0  # clock skew tolerated before an entry counts as "from the future"
_LATER = f"(not retried for {FAILURE_MEMORY_S / 60:g} min)"


class LocalProblem(str):
    """A probe that failed for this process's own resources (``proc.LOCAL_ERRNOS``), not the program's: never
    remembered; its ``fix`` (raise the limit) is the fix of any choice among the candidates (threat-model: P8)."""

    def __new__(cls, text: str, fix: str) -> LocalProblem:
        self = super().__new__(cls, f"{text}; {fix}")
        self.fix = fix
        return self


def local_fix(problems: Iterable[str | None]) -> str | None:
    """The fix of the first :class:`LocalProblem` among ``problems``, else ``None``."""
    return next((p.fix for p in problems if isinstance(p, LocalProblem)), None)


def short_text(v: object) -> bool:
    """``None`` or a string of at most 4096 characters: what a memo keeps of a message (P6)."""
    return v is None or isinstance(v, str) and len(v) <= 4096


class Memo:
    """``<cache root>/<name>``: ``{"schema": 2, "entries": {key: {"stat": ..., "problem": null | "why", "at": time,
    ...}}}``, the newest ``cap`` entries; one that fails ``valid`` (or the file) is dropped and rewritten (P6)."""

    SCHEMA = 2

    def __init__(self, name: str, cap: int, valid: Callable[[dict], bool]):
        self.name, self.cap, self.valid = name, cap, valid

    def path(self) -> str:
        return os.path.join(cache_root(), self.name)

    def _ok(self, e: object) -> bool:
        try:
            return (isinstance(e, dict) and type(e.get("at")) in (int, float) and math.isfinite(e["at"])
                    and short_text(e.get("problem")) and self.valid(e))
        except (FormatError, OverflowError):
            return False

    def entries(self) -> dict[str, dict]:
        """Every usable entry (none without a cache root); a malformed one, or file, is logged and dropped."""
        try:
            path = self.path()
            data, why = read_json(path, max_bytes=MAX_MEMO_BYTES)
        except StateFileError:
            return {}
        if data is None and why is None:
            return {}
        entries = data.get("entries") if isinstance(data, dict) and data.get("schema") == self.SCHEMA else None
        if not isinstance(entries, dict):
            logger.info("flashinfer-sm120: ignoring the memo %s (%s); it will be rewritten", path,
                        why or f"not schema {self.SCHEMA}")
            return {}
        good = {k: v for k, v in entries.items() if isinstance(k, str) and self._ok(v)}
        if len(good) < len(entries):
            logger.info("flashinfer-sm120: dropped %d malformed entries from the memo %s",
                        len(entries) - len(good), path)
        return good

    def lookup(self, key: str, stat: object) -> dict | None:
        """The entry remembered for ``key``, unless absent, of another ``stat``, unusable or an expired failure."""
        entry = self.entries().get(key)
        if entry is None or entry.get("stat") != stat:
            return None
        if entry.get("problem") is not None and not -_FUTURE_SLACK_S <= time.time() - entry["at"] <= FAILURE_MEMORY_S:
            return None
        return entry

    def store(self, key: str, stat: object, entry: dict) -> None:
        """Remember ``entry`` (atomic rewrite, the newest :attr:`cap`); failing only costs time later."""
        try:
            entries = self.entries()
            entries[key] = dict(entry, stat=stat, at=time.time())
            keep = sorted(entries, key=lambda k: entries[k]["at"], reverse=True)[:self.cap]
            write_json_atomic(self.path(), {"schema": self.SCHEMA, "entries": {k: entries[k] for k in keep}})
        except StateFileError as exc:
            logger.info("flashinfer-sm120: %s not saved: %s", self.name, exc)

    def once(self, key: str, stat: object, compute: Callable[[], dict], *, timeout: float,
             what: str) -> tuple[dict, bool]:
        """``(entry, remembered)``: the remembered entry, else ``compute()``'s, run by one process at a time while
        others wait on the memo, and remembered unless its problem is a :class:`LocalProblem`."""

        def fresh() -> tuple[dict, bool]:
            entry = compute()
            if not isinstance(entry.get("problem"), LocalProblem):
                self.store(key, stat, entry)
            return entry, False

        try:
            lock_path = self.path() + ".lock"
        except StateFileError:
            return fresh()

        def remembered() -> tuple[dict, bool] | None:
            entry = self.lookup(key, stat)
            return None if entry is None else (entry, True)

        return compute_once(lock_path, remembered, fresh, timeout=timeout, what=what)


def _valid_version(e: dict) -> bool:
    """A canonical version xor a reason."""
    full = e.get("full")
    return ((full is None) != (e.get("problem") is None)
            and (full is None or isinstance(full, str) and str(parse_version(full, "memo")) == full))


#: The ``--version`` answers (nvcc, ninja), keyed by the binary's path, ``stat`` its :func:`fingerprint`.
VERSIONS = Memo("nvcc-version.json", 64, _valid_version)


def version_of(path: str, parse: Callable[[str], str], *, name: str, fix: str,
               timeout: float) -> tuple[str | None, str | None]:
    """``(full, problem)`` of ``path --version`` (``parse(output)`` gives the canonical version), remembered in
    :data:`VERSIONS`; a failure for this process's own reasons is not remembered."""
    def compute() -> dict:
        return dict(zip(("full", "problem"), _run_version(path, parse, name, fix, timeout)))

    entry, _ = VERSIONS.once(path, fingerprint(path), compute, timeout=timeout + 5.0, what=f"probing {path}")
    return entry["full"], entry["problem"]


def _run_version(path: str, parse: Callable[[str], str], name: str, fix: str,
                 timeout: float) -> tuple[str | None, str | None]:
    """``(full, problem)`` of one bounded run (a memo miss only: safety.proc loads only then)."""
    from flashinfer_sm120.safety import oserrors, proc

    res = proc.run([path, "--version"], timeout=timeout, max_output=MAX_OUTPUT)
    if res.local:
        why = oserrors.describe(OSError(res.errno, res.error), path, "retry")
        return None, LocalProblem(f"{res.error}: {why.message}, not a fault of {path} (not remembered)", why.fix)
    if res.error:
        return None, f"{res.error}; fix it {fix}"
    if res.timed_out:
        return None, (f"{path} did not answer '{name} --version' within {timeout:g} s; it is hung or broken: "
                      f"fix or remove it, {fix} {_LATER}")
    if res.truncated:
        return None, (f"{path} --version printed more than {MAX_OUTPUT} bytes and was stopped; it is not a "
                      f"working {name}: fix or remove it, {fix} {_LATER}")
    out = res.text()
    try:
        return parse(out), None
    except (AttributeError, FormatError) as exc:  # no version line, or not a version
        lines = out.strip().splitlines()
        first = f"first line: {shown(lines[0], 120)}" if lines else "no output"
        what = "no 'release X.Y, VX.Y.Z' line" if name == "nvcc" else f"no version ({exc})"
        return None, (f"{path} --version printed {what} (exit {res.returncode}, {first}); it is not a "
                      f"working {name}: fix it {fix}")


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
