"""``build``'s plan (compiles at once, nvcc threads, a memory budget, per-family estimates), the build of
named or replayed specs through it in one pool, and doctor's "Builds" section of the same plan."""

from __future__ import annotations

import os
import re
import time

from flashinfer_sm120.core.facts import buildline
from flashinfer_sm120.core.jitenv import toolchain
from flashinfer_sm120.core.jitenv.memory import (ESTIMATES, FAMILIES, RECORDED_KEEP, Estimate, MemoryView, budget,
                                                 cpus, family_estimate, fmt_bytes, heaviest_estimate, max_jobs,
                                                 read_memory, recorded, server_max_jobs, user_threads)
from flashinfer_sm120.core.patch.state import flashinfer_version
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.warmup import moddir, pool


def estimate(module: str, known: dict[str, list[int]] | None = None) -> Estimate:
    """Peak memory of one compile of ``module`` (``--threads 1``): its family's estimate."""
    family = next((fam for fam in FAMILIES if re.search(fam.pattern, module)), FAMILIES[-1])
    return family_estimate(family, recorded() if known is None else known)


def record_peak(module: str, peak_bytes: int, threads_factor: int = 1) -> None:
    """Remember one compile's peak (``peak_bytes`` / ``threads_factor``); a write that fails is logged only."""
    if peak_bytes <= 0:
        return
    data = recorded()
    fam = estimate(module, data).family
    peaks = data.get(fam, []) + [int(peak_bytes / max(1, threads_factor))]
    ESTIMATES.store(fam, None, {"peaks": peaks[-RECORDED_KEEP:]})


def plan(est: Estimate, *, targets: int = 1, jobs: int | None = None, mem_limit: int | None = None,
         env=None, view: MemoryView | None = None) -> dict:
    """The plan (``plan`` of ``build --json``) for compiles of estimate ``est`` (``targets`` per compile; ``env``:
    default ``os.environ``), where each number came from; without ``-j``, ``MAX_JOBS`` as FlashInfer reads it."""
    raw_jobs, user_jobs, _problem = max_jobs(env)
    if jobs is not None and jobs > 0:
        n_jobs, jobs_from = jobs, "-j"
    elif user_jobs:
        n_jobs, jobs_from = user_jobs, f"MAX_JOBS={raw_jobs}, yours"
    else:
        n_jobs, jobs_from = cpus(), "the CPUs this process may use" + (
            f"; MAX_JOBS={shown(raw_jobs, 20)} is not a positive number" if raw_jobs is not None else "")
    raw_threads, threads = user_threads(env)
    if raw_threads is None:
        threads, threads_from = 1, ("FlashInfer's default; not changed here: --threads is part of the "
                                    "compile line ninja records, so the server would rebuild")
    elif threads > 1 or raw_threads.strip() == "1":
        threads_from = f"FLASHINFER_NVCC_THREADS={shown(raw_threads, 20)}, yours (FlashInfer reads {threads})"
    else:
        threads_from = f"FLASHINFER_NVCC_THREADS={shown(raw_threads, 20)} is not >= 1: FlashInfer uses 1"
    b = budget(est, targets, env, view, mem_limit)  # budget and fits None: memory unknown
    return {"jobs": n_jobs, "jobs_from": jobs_from, "threads": threads, "threads_from": threads_from,
            "per_compile": b.per, "estimate_from": b.per_from, "budget": b.budget, "budget_from": b.budget_from,
            "fits": b.fits, "at_once": n_jobs if b.fits is None else max(1, min(n_jobs, b.fits))}


def plan_lines(p: dict) -> list[str]:
    """The plan as ``build`` says it before it starts."""
    mem = (f"{fmt_bytes(p['budget'])} for compiles ({p['budget_from']}), "
           f"{fmt_bytes(p['per_compile'])} each ({p['estimate_from']})") if p["budget"] is not None \
        else f"unknown ({p['budget_from']})"
    return [f"memory: {mem}",
            f"jobs: {p['jobs']} ({p['jobs_from']})"
            + (f"; at most {p['at_once']} of these at once by memory" if p["at_once"] < p["jobs"] else ""),
            f"nvcc threads: {p['threads']} ({p['threads_from']})"]


def gencode_summary(ninja_text: str) -> list[str]:
    """``SASS sm_120f`` per ``-gencode ...code=sm_*``, ``PTX compute_120f`` per ``code=compute_*`` (nvcc's --generate-code)."""
    out = set()
    for _arch, codes in re.findall(r"-gencode=arch=(compute_\w+),code=\[?([\w,]+)\]?", ninja_text):
        out.update(f"{'SASS' if code.startswith('sm_') else 'PTX'} {code}" for code in codes.split(","))
    return sorted(out)


def write_ninjas(specs: list) -> None:
    """FlashInfer's own ``write_ninja`` for each spec, under its per-module lock (as ``build_jit_specs``)."""
    for spec in specs:
        with moddir.held(spec.lock_path, spec.name):
            spec.write_ninja()


def build_specs(labelled: list[tuple[str, object]], jobs: int | None, stream=None,
                stats: dict | None = None, *, targets: int = 1, mem_limit: int | None = None,
                mem_per_compile: int | None = None, env=None,
                step_timeout: float = pool.STEP_TIMEOUT_S) -> list[dict]:
    """Write ninja files and build ``(label, spec)`` pairs in one pool, each admitted by its family's memory
    estimate; the ``modules`` of ``build --json``.  ``env``: the user's, before we exported ``MAX_JOBS``."""
    write_ninjas([s for _, s in labelled])
    now_vars = buildline.snapshot(dict(os.environ), flashinfer_version())
    before = {label: buildline.changes(rec, now_vars) for label, spec in labelled
              if (rec := buildline.recorded(spec.build_dir)) is not None}
    known = recorded()
    ests = {label: (Estimate(mem_per_compile, estimate(spec.name, known).family, "--mem-per-compile")
                    if mem_per_compile else estimate(spec.name, known)) for label, spec in labelled}
    heaviest = max(ests.values(), key=lambda e: e.bytes) if ests else estimate("other", known)
    the_plan = plan(heaviest, targets=targets, jobs=jobs, mem_limit=mem_limit, env=env)
    factor = max(1, min(the_plan["threads"], targets))
    job_list = [pool.Job(label, spec.build_dir, spec.ninja_path, spec.lock_path, ests[label].bytes * factor)
                for label, spec in labelled]
    t0 = time.monotonic()
    results = pool.run_pool(job_list, the_plan["jobs"], stream, mem_budget=the_plan["budget"],
                            intro=tuple(plan_lines(the_plan)), step_timeout=step_timeout)
    if stats is not None:  # build --json's plan and pool_wall_s
        stats.update(plan=the_plan, wall_s=round(time.monotonic() - t0, 2))
    via_launcher = os.environ.get("FLASHINFER_NVCC_LAUNCHER")
    out = []
    for (label, spec), res in zip(labelled, results):
        unrecorded = buildline.record(spec.build_dir, now_vars) if res.status != "failed" else None
        if res.status == "built" and res.peak_rss and not via_launcher:  # a launcher compiles out of ninja's sight
            record_peak(spec.name, res.peak_rss, factor)
        so = spec.jit_library_path
        out.append({
            "module": label, "name": spec.name, "status": res.status, "library": str(so),
            "bytes": so.stat().st_size if so.exists() and res.status != "failed" else None,
            "seconds": res.seconds, "error": res.error, "peak_rss": res.peak_rss,
            "binary": gencode_summary(spec.ninja_path.read_text()),
            "build_vars": now_vars, "build_vars_before": [c.__dict__ for c in before.get(label) or ()],
            "build_vars_unrecorded": unrecorded,
        })
    return out


def doctor_section(report: dict) -> dict:
    """JSON-able facts (``report`` is the rest of doctor's report, for the targets)."""
    view = read_memory()
    targets = len(((report.get("resolution") or {}).get("choice") or {}).get("targets") or []) or 1
    toolchain.prepare_builds(listing=True)  # what the patch leaves to the first JIT build, short of running it
    setup = toolchain.last()
    known = recorded()
    the_plan = plan(heaviest_estimate(), targets=targets, view=view,
                     env={k: v for k, v in os.environ.items()  # the user's, not what we exported
                          if not (setup and (k in setup.set or (k == "MAX_JOBS" and v == setup.max_jobs_value)))})
    out = {
        "memory": view.to_dict(),
        "estimates": {f.name: family_estimate(f, known)._asdict() for f in FAMILIES[:-1]},
        "plan": the_plan,
        "max_jobs": setup.max_jobs if setup else server_max_jobs(targets, view=view)[1],
        "compilers": list(setup.notes) if setup else [],
        "cache": dict(setup.cache) if setup else {},
    }
    return out
