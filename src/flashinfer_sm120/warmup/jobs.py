"""How many compiles to run at once, and with how many nvcc threads: one policy for
``build`` and for the server's own JIT.

* **jobs**: ``-j`` given to ``build``, else the user's ``MAX_JOBS`` (FlashInfer's
  variable, ``flashinfer/jit/cpp_ext.py`` ``_get_num_workers``), else the CPUs this
  process may run on.  Whatever caps the jobs, compiles are *admitted* only while
  their estimates fit in the memory budget (:mod:`.memory`), never fewer than one.
* **threads**: the user's ``FLASHINFER_NVCC_THREADS``, else FlashInfer's default 1.
  Never chosen here: ``--threads=N`` is part of the compile line that ninja records
  in ``.ninja_log``, so a value that differs between ``build`` and the server would
  make FlashInfer's own ninja rebuild every module ``build`` compiled.  It enters the
  memory estimate: nvcc compiles up to ``min(threads, targets)`` targets at once.
* **budget**: ``--mem-limit``, else what this process may use less :data:`MARGIN`.
* **the server's JIT**: FlashInfer runs one ninja per module with ``-j MAX_JOBS``
  (or ninja's default, CPUs + 2).  When FlashInfer is patched and the user has not
  set ``MAX_JOBS``, :func:`server_max_jobs` gives the value exported for it:
  compiles of the heaviest known family that fit, at most the CPUs.  Which module
  the server builds next is not known, so the heaviest family decides.
"""

from __future__ import annotations

import dataclasses
import os
import re

from .. import formats
from ..errors import FormatError
from .estimates import Estimate, heaviest_estimate
from .memory import MemoryView, fmt_bytes, read_memory

__all__ = ["MARGIN", "Plan", "plan", "cpus", "user_max_jobs", "user_threads", "server_max_jobs"]

#: Share of the memory read that compiles leave free (other processes, page cache, estimate error).
MARGIN = 0.15


def cpus() -> int:
    """CPUs this process may run on (``sched_getaffinity``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _env_int(name: str, env) -> tuple[str | None, int | None]:
    try:
        raw = formats.env_text(name, env, max_len=32)
    except FormatError:
        return "(unreadable)", None
    if raw is None:
        return None, None
    t = raw.strip()
    return raw, int(t) if re.fullmatch(r"[0-9]{1,9}", t) else None  # not str.isdigit: '²' is a digit


def user_max_jobs(env=None) -> tuple[str | None, int | None]:
    """``(raw MAX_JOBS, value FlashInfer uses)``: FlashInfer takes it when it is all digits
    (``0`` means no limit to ninja); ``(None, None)`` when unset."""
    return _env_int("MAX_JOBS", env)


def user_threads(env=None) -> tuple[str | None, int | None]:
    """``(raw FLASHINFER_NVCC_THREADS, value FlashInfer uses)``: an integer >= 1, else
    FlashInfer warns and uses 1 (``get_nvcc_parallelism_flags``)."""
    raw, value = _env_int("FLASHINFER_NVCC_THREADS", env)
    return raw, (value if value and value >= 1 else (1 if raw is not None else None))


@dataclasses.dataclass(frozen=True)
class Plan:
    """The policy's answer, with where each number came from (for ``build`` and ``doctor``).

    Attributes:
        jobs: compiles at most at once (``-j``).
        jobs_from: why.
        threads: nvcc ``--threads``.
        threads_from: why.
        per_compile: bytes one compile takes (estimate x targets compiled at once).
        estimate_from: where the estimate came from.
        budget: bytes the compiles may use together, ``None`` when unknown.
        budget_from: why.
        fits: compiles of ``per_compile`` that fit in ``budget`` (at least 1), ``None`` when unknown.
    """

    jobs: int
    jobs_from: str
    threads: int
    threads_from: str
    per_compile: int
    estimate_from: str
    budget: int | None
    budget_from: str
    fits: int | None

    @property
    def at_once(self) -> int:
        """Compiles of this size run at once: the jobs, or fewer when memory says so."""
        return self.jobs if self.fits is None else max(1, min(self.jobs, self.fits))

    def lines(self) -> list[str]:
        mem = (f"{fmt_bytes(self.budget)} for compiles ({self.budget_from}), "
               f"{fmt_bytes(self.per_compile)} each ({self.estimate_from})") if self.budget is not None \
            else f"unknown ({self.budget_from})"
        out = [f"memory: {mem}",
               f"jobs: {self.jobs} ({self.jobs_from})"
               + (f"; at most {self.at_once} of these at once by memory" if self.at_once < self.jobs else ""),
               f"nvcc threads: {self.threads} ({self.threads_from})"]
        return out

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), at_once=self.at_once)


def plan(est: Estimate, *, targets: int = 1, jobs: int | None = None, mem_limit: int | None = None,
         env=None, view: MemoryView | None = None) -> Plan:
    """The jobs, threads and memory budget for compiles of estimate ``est``.

    Args:
        est: one compile process's estimate (:func:`.estimates.estimate`).
        targets: gencode targets per compile (nvcc compiles ``min(threads, targets)`` at once).
        jobs: ``build -j``; default ``MAX_JOBS``, else the CPUs.
        mem_limit: bytes the compiles may use together; default what :func:`.memory.read_memory`
            reads, less :data:`MARGIN`.
        env: environment (default ``os.environ``).
        view: memory already read (default: read now, unless ``mem_limit`` is given).
    """
    raw_jobs, max_jobs = user_max_jobs(env)
    if jobs is not None and jobs > 0:
        n_jobs, jobs_from = jobs, "-j"
    elif max_jobs:
        n_jobs, jobs_from = max_jobs, f"MAX_JOBS={raw_jobs}, yours"
    else:
        n_jobs, jobs_from = cpus(), "the CPUs this process may use"
        if raw_jobs is not None:
            jobs_from += f"; MAX_JOBS={formats.shown(raw_jobs, 20)} is not a positive number"
    raw_threads, threads = user_threads(env)
    if raw_threads is None:
        threads, threads_from = 1, ("FlashInfer's default; not changed here: --threads is part of the "
                                    "compile line ninja records, so the server would rebuild")
    elif str(threads) == raw_threads.strip():
        threads_from = f"FLASHINFER_NVCC_THREADS={raw_threads}, yours"
    else:
        threads_from = f"FLASHINFER_NVCC_THREADS={formats.shown(raw_threads, 20)} is not >= 1: FlashInfer uses 1"
    factor = max(1, min(threads, targets))
    per = est.bytes * factor
    est_from = est.source + (f", x{factor} targets compiled at once" if factor > 1 else "")
    if mem_limit is not None:
        budget, budget_from = mem_limit, "--mem-limit"
    else:
        view = view or read_memory()
        if view.available is None:
            budget, budget_from = None, view.describe()
        else:
            budget = int(view.available * (1 - MARGIN))
            budget_from = f"{fmt_bytes(view.available)} available less {MARGIN:.0%}: {view.source}"
    fits = None if budget is None else max(1, budget // max(1, per))
    return Plan(n_jobs, jobs_from, threads, threads_from, per, est_from, budget, budget_from, fits)


def server_max_jobs(targets: int = 1, env=None, view: MemoryView | None = None) -> tuple[int | None, str]:
    """``(MAX_JOBS to export, why)`` for the server's run-time JIT; ``(None, why)`` when the
    user set ``MAX_JOBS`` (theirs wins) or memory cannot be read."""
    raw, _value = user_max_jobs(env)
    if raw is not None:
        return None, f"MAX_JOBS={formats.shown(raw, 20)} set by you: kept"
    p = plan(heaviest_estimate(), targets=targets, env=env, view=view)
    if p.fits is None:
        return None, f"MAX_JOBS not exported: memory unknown ({p.budget_from})"
    value = p.at_once
    return value, (f"MAX_JOBS={value} exported: {fmt_bytes(p.budget)} for compiles ({p.budget_from}), "
                   f"{fmt_bytes(p.per_compile)} per compile of the heaviest family ({p.estimate_from}), "
                   f"at most {p.jobs} CPUs")
