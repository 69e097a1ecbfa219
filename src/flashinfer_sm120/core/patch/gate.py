"""What runs only when FlashInfer builds or fails (loaded then, not at import): the gate before nvcc, the arch
check's message, and why FlashInfer's own import failed."""

from __future__ import annotations

import os

from flashinfer_sm120.core.facts.refusals import builds_refused, workspace_problem
from flashinfer_sm120.core.patch.state import NO_TARGETS_FIX, STATE, Mode
from flashinfer_sm120.errors import Sm120Error, ToolkitError


def guard_message() -> str:
    """The one message a guarded JIT build raises."""
    res = STATE.resolution
    text = ("flashinfer-sm120 stopped this FlashInfer JIT build before nvcc ran, because no CUDA "
            f"toolkit fits: {res.error if res is not None else STATE.error}")
    try:  # after the real fix: the installed server's own ways around (serverprobe.py)
        from flashinfer_sm120.core.facts.serverprobe import fallback_text

        more = fallback_text()
    except Exception:  # pragma: no cover - never let the message itself fail
        more = ""
    return f"{text}\n{more}" if more else text


def nvcc_gate(wrapped, args, kwargs, current_targets):
    """FlashInfer's ``build``: refused in guard mode, when a build would be unsafe (P2) or its targets
    (``current_targets()``) unbuildable (P1), else run with the build's variables and a private TMPDIR (P5)."""
    if STATE.mode is Mode.GUARD:
        raise ToolkitError(guard_message())
    if STATE.mode in (Mode.PATCHED, Mode.NOOP):
        from flashinfer_sm120.core.jitenv.toolchain import prepare_builds, refresh_max_jobs

        prepare_builds()  # the first build: MAX_JOBS and the compiler cache, before FlashInfer reads them
        refresh_max_jobs()  # the memory left now, not at import: the model may have loaded since
        from flashinfer.jit import env as jit_env

        # the one list build and status refuse by: a JIT directory another uid can change (whose .so
        # FlashInfer would load after this "build" found it up to date), a program run by name, TMPDIR
        problem = builds_refused(str(jit_env.FLASHINFER_JIT_DIR))
        from flashinfer_sm120.core.toolkit.fixes import unbuildable

        bad = None if problem else unbuildable(current_targets(), STATE.resolution.choice.version)
        if bad:
            tk = STATE.resolution.choice.toolkit
            problem = (f"FLASHINFER_CUDA_ARCH_LIST={os.environ.get('FLASHINFER_CUDA_ARCH_LIST')!r} asks for targets "
                       f"the chosen nvcc {tk.nvcc_full} at {tk.root} cannot build: " + " ".join(bad))
        if problem:
            raise ToolkitError(f"flashinfer-sm120 stopped this FlashInfer JIT build before nvcc ran: {problem}")
        from flashinfer_sm120.safety.fs.atomic import exported_build_tmp

        with exported_build_tmp():  # run_ninja passes no env: its nvcc's predictable temp names in a dir of ours
            return wrapped(*args, **kwargs)
    return wrapped(*args, **kwargs)


def arch_check(wrapped, args, kwargs):
    """FlashInfer's arch check: its RuntimeError becomes our message with the fix (P8)."""
    if not STATE.mode.active:
        return wrapped(*args, **kwargs)
    try:
        return wrapped(*args, **kwargs)
    except RuntimeError as exc:
        if STATE.mode is Mode.GUARD:
            raise ToolkitError(guard_message()) from exc
        res = STATE.resolution
        raise Sm120Error(
            "flashinfer-sm120: no target architecture to build for: "
            + (f"no GPU visible ({res.gpu_query.describe() if res and res.gpu_query else 'unknown'})"
               if res is not None and not res.gpus else "no usable target")
            + f" and FLASHINFER_CUDA_ARCH_LIST names none. Fix: {NO_TARGETS_FIX}") from exc


def import_failed(broken: str) -> tuple[str, bool]:
    """``(error, worth reporting)`` when FlashInfer's import raised after it was patched (``broken``: the module
    Python dropped)."""
    if STATE.mode is Mode.GUARD:  # FlashInfer kept its own toolkit: it fails alone too
        fix = getattr(STATE.resolution, "fix", "") or ""
        return (f"importing FlashInfer failed ({broken} raised during its own import). No CUDA toolkit "
                "fits, so FlashInfer kept its own toolkit lookup, which fails the same way without "
                "flashinfer-sm120 (with a CPU build of torch FlashInfer needs an nvcc at import)"
                + (f". Fix: {fix}" if fix else "")), False
    if problem := workspace_problem():
        return f"importing FlashInfer failed ({broken} raised during its own import): {problem}", False
    return (f"importing FlashInfer failed after flashinfer-sm120 patched it ({broken} is no "
            "longer loaded: FlashInfer raised during its own import)"), True


def imported_midway(module: str) -> str:
    """Why nothing is patched when flashinfer_sm120 is installed while FlashInfer's own import is under way
    (``module`` partially initialised: an autoload trigger FlashInfer itself imports, such as torch), and the fix."""
    return (f"not patching FlashInfer: flashinfer_sm120 was loaded while FlashInfer was still importing ({module} "
            "partially initialised: a module FlashInfer imports, e.g. torch named in "
            "FLASHINFER_SM120_AUTOLOAD_TRIGGERS, loaded it); FlashInfer is unpatched in this process. Fix: leave "
            "FLASHINFER_SM120_AUTOLOAD_TRIGGERS unset (or include flashinfer in it), or import flashinfer_sm120 "
            "before flashinfer")
