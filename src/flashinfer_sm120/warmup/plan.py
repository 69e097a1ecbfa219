"""``build``'s plan: compiles at once (``-j``, else ``MAX_JOBS`` as FlashInfer reads it, else the CPUs)
and nvcc threads (the user's, never chosen here) within a memory budget (``--mem-limit``, else what
this process may use less a margin), and the per-family estimates compiles are admitted by.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time

from flashinfer_sm120.errors import StateFileError
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.core.jitenv.memory import (FAMILIES, RECORDED_KEEP, Estimate, Family, MemoryView, budget,
                                                 cpus, estimates_path, family_estimate, fmt_bytes, max_jobs,
                                                 recorded, user_threads)

logger = logging.getLogger("flashinfer_sm120")


def default_jobs(env=None) -> tuple[int, str]:
    """``(compiles at once, why)`` without ``-j``: the user's ``MAX_JOBS`` as FlashInfer reads it, else the CPUs."""
    raw_jobs, value, _problem = max_jobs(env)
    if value:
        return value, f"MAX_JOBS={raw_jobs}, yours"
    why = "the CPUs this process may use"
    if raw_jobs is not None:
        why += f"; MAX_JOBS={shown(raw_jobs, 20)} is not a positive number"
    return cpus(), why


def family_of(module: str) -> Family:
    return next((fam for fam in FAMILIES if re.search(fam.pattern, module)), FAMILIES[-1])


def estimate(module: str, known: dict[str, list[int]] | None = None) -> Estimate:
    """Peak memory of one compile of ``module`` (``--threads 1``): its family's estimate."""
    return family_estimate(family_of(module), recorded() if known is None else known)


def record_peak(module: str, peak_bytes: int, threads_factor: int = 1) -> None:
    """Remember one compile's peak (``peak_bytes`` / ``threads_factor``); a write that fails is logged only."""
    if peak_bytes <= 0:
        return
    fam = family_of(module).name
    per = int(peak_bytes / max(1, threads_factor))
    try:
        from flashinfer_sm120.safety.fs.statefiles import write_json_atomic

        data = recorded()
        data[fam] = (data.get(fam, []) + [per])[-RECORDED_KEEP:]
        write_json_atomic(estimates_path(), {"schema": 1, "at": time.time(),
                                             "families": {k: {"peaks": v} for k, v in sorted(data.items())}})
    except StateFileError as exc:
        logger.info("flashinfer-sm120: compile memory not recorded: %s", exc)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The plan with where each number came from; ``budget`` and ``fits`` are ``None`` when memory is unknown."""

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
        return self.jobs if self.fits is None else max(1, min(self.jobs, self.fits))

    def lines(self) -> list[str]:
        mem = (f"{fmt_bytes(self.budget)} for compiles ({self.budget_from}), "
               f"{fmt_bytes(self.per_compile)} each ({self.estimate_from})") if self.budget is not None \
            else f"unknown ({self.budget_from})"
        return [f"memory: {mem}",
                f"jobs: {self.jobs} ({self.jobs_from})"
                + (f"; at most {self.at_once} of these at once by memory" if self.at_once < self.jobs else ""),
                f"nvcc threads: {self.threads} ({self.threads_from})"]

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), at_once=self.at_once)


def plan(est: Estimate, *, targets: int = 1, jobs: int | None = None, mem_limit: int | None = None,
         env=None, view: MemoryView | None = None) -> Plan:
    """The plan for compiles of estimate ``est`` (``targets`` per compile; ``env``: default ``os.environ``)."""
    n_jobs, jobs_from = (jobs, "-j") if jobs is not None and jobs > 0 else default_jobs(env)
    raw_threads, threads = user_threads(env)
    if raw_threads is None:
        threads, threads_from = 1, ("FlashInfer's default; not changed here: --threads is part of the "
                                    "compile line ninja records, so the server would rebuild")
    elif threads > 1 or raw_threads.strip() == "1":
        threads_from = f"FLASHINFER_NVCC_THREADS={shown(raw_threads, 20)}, yours (FlashInfer reads {threads})"
    else:
        threads_from = f"FLASHINFER_NVCC_THREADS={shown(raw_threads, 20)} is not >= 1: FlashInfer uses 1"
    b = budget(est, targets, env, view, mem_limit)
    return Plan(n_jobs, jobs_from, threads, threads_from, b.per, b.per_from, b.budget, b.budget_from, b.fits)
