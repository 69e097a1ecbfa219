"""``doctor``'s "Builds" section: memory, estimates, jobs and threads, compiler variables and cache."""

from __future__ import annotations

import os

from flashinfer_sm120.core.jitenv import launcher, memory, toolchain
from flashinfer_sm120.warmup.plan import plan as build_plan


def doctor_section(report: dict) -> dict:
    """JSON-able facts (``report`` is the rest of doctor's report, for the targets)."""
    view = memory.read_memory()
    targets = len(((report.get("resolution") or {}).get("choice") or {}).get("targets") or []) or 1
    toolchain.prepare_builds()  # what the patch leaves to the first JIT build: shown as a build gets it
    setup = toolchain.last()
    known = memory.recorded()
    plan = build_plan(memory.heaviest_estimate(), targets=targets, view=view,
                     env={k: v for k, v in os.environ.items()  # the user's, not what we exported
                          if not (setup and (k in setup.set or (k == "MAX_JOBS" and v == setup.max_jobs_value)))})
    out = {
        "memory": view.to_dict(),
        "estimates": {f.name: memory.family_estimate(f, known)._asdict() for f in memory.FAMILIES[:-1]},
        "plan": plan.to_dict(),
        "max_jobs": setup.max_jobs if setup else memory.server_max_jobs(targets, view=view)[1],
        "compilers": list(setup.notes) if setup else [],
        "cache": dict(setup.cache) if setup else {},
    }
    path = os.environ.get("FLASHINFER_NVCC_LAUNCHER", "").split()
    if path and os.path.basename(path[0]).startswith("sccache"):
        data = launcher.stats(path[0])
        hm = launcher.hits_misses(data)
        out["cache"]["stats"] = None if hm is None else {
            "hits": hm[0], "misses": hm[1], "location": (data or {}).get("cache_location"),
            "basedirs": (data or {}).get("basedirs"), "version": (data or {}).get("version")}
    return out


def doctor_lines(section: dict) -> list[str]:
    mem = section.get("memory") or {}
    lines = ["\nBuilds (memory policy, compilers, compiler cache):"]
    bounds = mem.get("bounds") or []
    low = min(bounds, key=lambda b: b["available"]) if bounds else None
    lines.append(f"  memory this process may use: {memory.fmt_bytes(mem.get('available'))}"
                 + (f" (lowest: {low['source']})" if low else ""))
    for b in bounds:
        lines.append(f"    {b['source']}: {memory.fmt_bytes(b['available'])} ({b['detail']})")
    for n in mem.get("notes") or []:
        lines.append(f"    note: {n}")
    for fam, est in (section.get("estimates") or {}).items():
        lines.append(f"  per compile, {fam}: {memory.fmt_bytes(est['bytes'])} ({est['source']})")
    plan = section.get("plan") or {}
    if plan:
        lines.append(f"  build (heaviest family): -j {plan['jobs']} ({plan['jobs_from']}), at most "
                     f"{plan['at_once']} at once by memory; nvcc --threads {plan['threads']} ({plan['threads_from']})")
    lines.append(f"  server JIT: {section.get('max_jobs')}")
    for n in section.get("compilers") or []:
        lines.append(f"  {n}")
    cache = section.get("cache") or {}
    if cache.get("requested") or cache.get("launcher"):
        v = cache.get("verdict") or {}
        verdict = ("works" if v.get("ok") else "REFUSED" if v.get("ok") is False else "not probed")
        lines.append(f"  compiler cache: {cache.get('launcher') or cache.get('requested')}: {verdict}"
                     + (f" ({_launcher_name(v)} with nvcc {v.get('nvcc_version')}, "
                        f"{'remembered' if v.get('remembered') else 'probed now'})" if v.get("ok") else ""))
        if cache.get("refused"):
            lines.append(f"    {cache['refused']}")
        if cache.get("basedirs"):
            lines.append(f"    SCCACHE_BASEDIRS={cache['basedirs']}")
        st = cache.get("stats")
        if st:
            lines.append(f"    sccache --show-stats: {st['hits']} hits, {st['misses']} misses; "
                         f"{st.get('location')}; server basedirs {st.get('basedirs')}")
    else:
        lines.append(f"  compiler cache: off (set {toolchain.CACHE_ENV}=sccache to share compiles between nodes)")
    return lines


def _launcher_name(verdict: dict) -> str:
    """``sccache 0.16.0`` when the launcher said its release, else ``a launcher`` (e.g. ``env``)."""
    version = verdict.get("launcher_version")
    return f"sccache {version}" if version else "a launcher of unknown release"
