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

from flashinfer_sm120.safety import formats
from flashinfer_sm120.core.jitenv.estimates import Estimate, heaviest_estimate
from flashinfer_sm120.core.jitenv.memory import MemoryView, fmt_bytes, read_memory

__all__ = ["MARGIN", "Plan", "plan", "cpus", "default_jobs", "user_max_jobs", "user_threads", "server_max_jobs"]

#: Share of the memory read that compiles leave free (other processes, page cache, estimate error).
MARGIN = 0.15


def cpus() -> int:
    """CPUs this process may run on (``sched_getaffinity``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


#: The largest ``-j`` every ninja takes: 1.11 parses it into an ``int`` and stops with
#: "invalid -j parameter" above (1.13 takes any value).
_NINJA_J_MAX = 2**31 - 1
_MAX_DIGITS = 64  # int() of a longer string of digits is refused here, not computed


def _raw(name: str, env) -> str | None:
    value = (os.environ if env is None else env).get(name)
    return value if value is None or isinstance(value, str) else str(value)


def flashinfer_max_jobs(raw: str | None) -> tuple[int | None, str | None]:
    """``(-j FlashInfer passes to ninja, problem)`` for ``MAX_JOBS=raw``, read exactly as FlashInfer
    0.7.x reads it (``flashinfer/jit/cpp_ext.py`` ``_get_num_workers``: ``raw.isdigit()``, then
    ``int(raw)``; ``0`` is ninja's "no limit").  ``problem`` is set when FlashInfer cannot use the
    value as set: it ignores it (not all digits: ninja's default of CPUs + 2 jobs, whatever the
    memory), crashes on it (``'²'.isdigit()`` is true, ``int('²')`` raises), or ninja 1.11 stops
    on it (above 2147483647)."""
    if raw is None:
        return None, None
    fix = ("Fix: set MAX_JOBS to a whole number such as 4 (ASCII digits only), or unset it to let "
           "flashinfer-sm120 choose from the memory")
    if not raw.isdigit():
        return None, (f"MAX_JOBS={formats.shown(raw, 20)} is ignored by FlashInfer (not all digits), so its JIT "
                      f"builds would run ninja's default of CPUs + 2 jobs whatever the memory. {fix}")
    try:
        value = int(raw) if len(raw) <= _MAX_DIGITS else None
    except ValueError:
        value = None
    if value is None:
        return None, (f"MAX_JOBS={formats.shown(raw, 20)} makes every FlashInfer JIT build raise ValueError "
                      f"(FlashInfer's isdigit() accepts it, int() does not). {fix}")
    if value > _NINJA_J_MAX:
        return None, (f"MAX_JOBS={formats.shown(raw, 20)} is above {_NINJA_J_MAX}: ninja 1.11 stops with "
                      f"'invalid -j parameter'. {fix}")
    return value, None


def user_max_jobs(env=None) -> tuple[str | None, int | None]:
    """``(raw MAX_JOBS, value FlashInfer uses)`` (:func:`flashinfer_max_jobs`; ``0`` means no limit
    to ninja; ``None`` when FlashInfer cannot use it); ``(None, None)`` when unset."""
    raw = _raw("MAX_JOBS", env)
    return raw, flashinfer_max_jobs(raw)[0]


def default_jobs(env=None) -> tuple[int, str]:
    """``(compiles at once, why)`` when ``build -j`` is not given: the user's ``MAX_JOBS`` as
    FlashInfer reads it (:func:`user_max_jobs`), else the CPUs (:func:`cpus`).  The one reader of
    ``MAX_JOBS`` for ``build`` and the pool."""
    raw_jobs, max_jobs = user_max_jobs(env)
    if max_jobs:
        return max_jobs, f"MAX_JOBS={raw_jobs}, yours"
    why = "the CPUs this process may use"
    if raw_jobs is not None:
        why += f"; MAX_JOBS={formats.shown(raw_jobs, 20)} is not a positive number"
    return cpus(), why


def user_threads(env=None) -> tuple[str | None, int | None]:
    """``(raw FLASHINFER_NVCC_THREADS, value FlashInfer uses)``, read as FlashInfer 0.7.x reads it
    (``get_nvcc_parallelism_flags``: ``int(value)``, which takes `` 2 ``, ``+4``, ``1_0`` and other
    scripts' digits; unparsable or below 1: it warns and uses 1); ``(None, None)`` when unset."""
    raw = _raw("FLASHINFER_NVCC_THREADS", env)
    if raw is None:
        return None, None
    try:
        value = int(raw) if len(raw) <= _MAX_DIGITS else 1
    except ValueError:
        value = 1
    return raw, value if value >= 1 else 1


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
    n_jobs, jobs_from = (jobs, "-j") if jobs is not None and jobs > 0 else default_jobs(env)
    raw_threads, threads = user_threads(env)
    if raw_threads is None:
        threads, threads_from = 1, ("FlashInfer's default; not changed here: --threads is part of the "
                                    "compile line ninja records, so the server would rebuild")
    elif threads > 1 or raw_threads.strip() == "1":
        threads_from = f"FLASHINFER_NVCC_THREADS={formats.shown(raw_threads, 20)}, yours (FlashInfer reads {threads})"
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
    raw = _raw("MAX_JOBS", env)
    _value, problem = flashinfer_max_jobs(raw)
    if raw is not None and problem is None:
        return None, f"MAX_JOBS={formats.shown(raw, 20)} set by you: kept"
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != "MAX_JOBS"}
    p = plan(heaviest_estimate(), targets=targets, env=env, view=view)
    refused = f"{problem} Instead: " if problem else ""
    if p.fits is None:
        return None, refused + f"MAX_JOBS not exported: memory unknown ({p.budget_from}), ninja's default applies"
    value = p.at_once
    return value, refused + (f"MAX_JOBS={value} exported: {fmt_bytes(p.budget)} for compiles ({p.budget_from}), "
                   f"{fmt_bytes(p.per_compile)} per compile of the heaviest family ({p.estimate_from}), "
                   f"at most {p.jobs} CPUs")
