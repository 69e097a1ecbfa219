"""Set up FlashInfer for a warm-up build and build a list of specs in one pool."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path

from .. import arch as _arch
from ..errors import Sm120Error
from . import pool

__all__ = ["BuildError", "Session", "prepare", "write_ninjas", "build_specs"]


class BuildError(Sm120Error):
    """The warm-up build cannot start; the message names the fix."""


@dataclasses.dataclass
class Session:
    """What this process builds with: FlashInfer's version, toolkit and targets."""

    flashinfer: str
    cuda_home: str
    cuda_version: str
    targets: list[str]
    jit_dir: Path
    summary: str

    def fingerprint(self) -> dict:
        """What a JIT cache entry depends on besides its sources: FlashInfer release,
        targets, nvcc release, and the CUDA_HOME and JIT dir paths written into build.ninja."""
        return {"flashinfer": self.flashinfer, "targets": self.targets,
                "cuda_version": self.cuda_version, "cuda_home": self.cuda_home, "jit_dir": str(self.jit_dir)}


def set_arch(value: str | None) -> None:
    """Validate ``--arch`` and export it as ``FLASHINFER_CUDA_ARCH_LIST`` (before FlashInfer loads).

    :raises BuildError: the value is not an arch list (message from :mod:`flashinfer_sm120.arch`)."""
    if value is None:
        return
    try:
        specs = _arch.parse_arch_list(value, source="--arch")
    except _arch.ArchListError as exc:
        raise BuildError(str(exc)) from None
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = " ".join(f"{s.major}.{s.minor}{s.suffix or ''}" for s in specs)


def prepare(arch: str | None) -> Session:
    """Patch and import FlashInfer for ``arch`` (``--arch``; default: the GPUs present).

    :raises BuildError: bad ``--arch``, shim disabled, FlashInfer unusable, or no targets.
    """
    set_arch(arch)
    os.environ.setdefault("FLASHINFER_SM120_QUIET", "1")  # the summary is printed by the caller
    import flashinfer_sm120 as shim

    shim.install()
    try:
        import flashinfer.jit.core  # noqa: F401
        import flashinfer.jit.cpp_ext as cx
        from flashinfer import __version__ as fi_version
        from flashinfer.jit import env as jit_env
    except Exception as exc:
        raise BuildError(f"importing FlashInfer failed: {exc!r}") from None
    st = shim.status()
    if st["mode"] == "disabled":
        raise BuildError("FLASHINFER_SM120_DISABLE is set, so FlashInfer would build with its own "
                         "toolkit choice; unset it (or set it to 0) to build with flashinfer-sm120")
    if st["mode"] == "guard":  # the message with the fix was just logged: do not print it twice
        raise BuildError("no toolkit can build the requested targets (FlashInfer is guarded): see the "
                         "message above for what was found and the fix (--arch sets "
                         "FLASHINFER_CUDA_ARCH_LIST, so the fix applies to --arch as well)")
    if st["mode"] not in ("patched", "noop"):
        raise BuildError(f"FlashInfer could not be set up ({st['mode']}): {st['error']}")
    if not st["target_cuda_archs"]:
        raise BuildError("no target architectures: no GPU is visible and no --arch was given; "
                         "pass e.g. --arch 12.0 (RTX 5090 / RTX PRO 6000) or --arch 12.1 (DGX Spark)")
    from flashinfer.jit import core

    targets = sorted(f"{a}.{b}" for a, b in core.current_compilation_context.TARGET_CUDA_ARCHS)
    return Session(str(fi_version), cx.get_cuda_path(), str(cx.get_cuda_version()), targets,
                   Path(jit_env.FLASHINFER_JIT_DIR), st["summary"])


def write_ninjas(specs: list) -> None:
    """FlashInfer's own ``write_ninja`` for each spec, under its per-module lock (as
    ``build_jit_specs`` does), so the file is byte for byte what the server writes."""
    from filelock import FileLock

    for spec in specs:
        with FileLock(str(spec.lock_path), thread_local=False):
            spec.write_ninja()


def build_specs(labelled: list[tuple[str, object]], jobs: int | None, stream=None,
                stats: dict | None = None, *, targets: int = 1, mem_limit: int | None = None,
                mem_per_compile: int | None = None, env=None) -> list[dict]:
    """Write ninja files and build ``labelled`` ``(label, spec)`` pairs in one pool
    (``stats`` as for :func:`pool.run_pool`, plus ``plan``: the jobs/memory plan).

    Each module is admitted by its memory estimate (:mod:`.memory`, per family; ``mem_per_compile``
    overrides it) within the budget of :func:`.jobs.plan`; a module built without a compiler
    launcher has its peak RSS recorded to refine its family's estimate (with a launcher the
    compiles run in the launcher's server, out of ninja's sight).

    :param env: the user's environment for the plan (``MAX_JOBS``, ``FLASHINFER_NVCC_THREADS``),
        read before this process exported its own ``MAX_JOBS``.
    :returns: one dict per module: label, name, status, library, bytes, seconds, error,
        gencode (raw ``compute_X,code`` pairs), binary (``SASS sm_X``/``PTX compute_X``) and
        peak_rss (bytes, when built without a launcher).
    """
    from . import jobs as _jobs
    from . import estimates

    stream = stream or sys.stderr
    write_ninjas([s for _, s in labelled])
    known = estimates.recorded()
    ests = {label: (estimates.Estimate(mem_per_compile, estimates.family_of(spec.name).name, "--mem-per-compile")
                    if mem_per_compile else estimates.estimate(spec.name, known)) for label, spec in labelled}
    heaviest = max(ests.values(), key=lambda e: e.bytes) if ests else estimates.estimate("other", known)
    plan = _jobs.plan(heaviest, targets=targets, jobs=jobs, mem_limit=mem_limit, env=env)
    factor = max(1, min(plan.threads, targets))
    job_list = [pool.Job(label, spec.build_dir, spec.ninja_path, spec.lock_path, ests[label].bytes * factor)
                for label, spec in labelled]
    if stats is not None:
        stats["plan"] = plan.to_dict()
    for line in plan.lines():
        stream.write(f"flashinfer-sm120: {line}\n")
    results = pool.run_pool(job_list, plan.jobs, stream, stats, mem_budget=plan.budget)
    launcher = os.environ.get("FLASHINFER_NVCC_LAUNCHER")
    out = []
    for (label, spec), res in zip(labelled, results):
        if res.status == "built" and res.peak_rss and not launcher:
            estimates.record_peak(spec.name, res.peak_rss, factor)
        text = spec.ninja_path.read_text()
        so = spec.jit_library_path
        out.append({
            "module": label, "name": spec.name, "status": res.status, "library": str(so),
            "bytes": so.stat().st_size if so.exists() and res.status != "failed" else None,
            "seconds": res.seconds, "error": res.error, "peak_rss": res.peak_rss,
            "gencode": sorted({f"{a},{c}" for a, c in re.findall(r"-gencode=arch=(compute_\w+),code=(\w+)", text)}),
            "binary": pool.gencode_summary(text),
        })
    return out
