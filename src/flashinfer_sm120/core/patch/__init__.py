"""Patch FlashInfer through wrapt post-import hooks so its JIT builds use the chosen toolkit and targets, undone as
a whole if a required step fails; with no toolkit that fits (guard), its first JIT build raises the one message."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import types

import wrapt

from flashinfer_sm120.core.facts import arch as _arch
from flashinfer_sm120.core.facts.workspace import code_dirs_refused, normalize_base
from flashinfer_sm120.core.jitenv import environ
from flashinfer_sm120.safety.formats.reads import env_flag
from flashinfer_sm120.core.patch import laststatus
from flashinfer_sm120.core.patch.state import STATE, Mode, Resolution, render
from flashinfer_sm120.core.patch import steps
from flashinfer_sm120.core.patch.steps import HOOKED_MODULES, STEPS, refresh_derived

logger = logging.getLogger("flashinfer_sm120")


def _ensure_resolution() -> None:
    """Compute the resolution outside the lock; the first one stored wins."""
    with STATE.lock:
        if STATE.mode is not Mode.IDLE or STATE.resolution is not None:
            return
    inputs = laststatus.inputs()  # before FlashInfer or our export changes the environment (stat calls only)
    with STATE.lock:
        first, STATE.resolved = not STATE.resolved, True
    replayed = first and laststatus.replay(inputs)  # a later process with the same inputs
    res: Resolution | str
    try:
        if replayed:
            res = replayed[0]
        else:
            from flashinfer_sm120.core.patch.decide import resolve  # a first process

            res = resolve(guard=True)
    except Exception as exc:  # a view that cannot be built, a broken NVML ...
        res = str(exc) or repr(exc)
        if isinstance(exc, ImportError) and (exc.name or "").partition(".")[0] not in ("flashinfer", "torch"):
            from flashinfer_sm120.core.facts.reinstall import fix_for  # one of our dependencies is missing (P8)

            res = f"{res}; Fix: {fix_for(exc)}"
    with STATE.lock:
        if STATE.mode is not Mode.IDLE or STATE.resolution is not None:
            return
        STATE.inputs = inputs
        STATE.recorded_export = replayed[1] if replayed else None
        STATE.resolution = None if isinstance(res, str) else res
        error = res if isinstance(res, str) else None if res.release.supported else res.release.reason
        if error:
            STATE.mode, STATE.error = Mode.FAILED, error
            logger.warning("flashinfer-sm120: not patching FlashInfer: %s", error)
            return
        if res.arch_list_error:
            STATE.log_once(logging.ERROR, f"flashinfer-sm120: {res.arch_list_error}")
        # a malformed CUDA_HOME/CUDA_PATH is said once, in the summary (describe())


def _already_correct(res: Resolution) -> bool:
    """FlashInfer alone would use the same toolkit and the same targets."""
    cc_mod = sys.modules.get("flashinfer.compilation_context")
    if cc_mod is None or res.arch_list_error or res.naive_root is None \
            or os.path.realpath(res.naive_root) != os.path.realpath(res.home.path):
        return False
    from flashinfer_sm120.core.patch.alone import flashinfer_would_target

    alone = flashinfer_would_target(cc_mod.CompilationContext, res.choice.version, res.home.path)
    return alone is not None and alone == set(res.choice.targets)


def _import_failed() -> str | None:
    """A patched module Python dropped since (FlashInfer raised later in its own import), else ``None``."""
    for name, mod in STATE.patched_modules.items():
        prefixes = [name.rsplit(".", n)[0] for n in range(name.count("."), -1, -1)]
        dropped = next((p for p in prefixes if sys.modules.get(p) is None), None)
        if dropped or sys.modules.get(name) is not mod:
            return dropped or name
    return None


def _unpatch(mode: Mode, error: str | None = None) -> None:
    """Undo every change (reverting: an early export too), then let FlashInfer recompute what it derived."""
    STATE.undo.rollback()
    if mode is Mode.REVERTED:
        environ.reset()  # an export made before patching (autoload of vllm/sglang, worker_setup) goes too
        STATE.reset(mode)
    STATE.mode, STATE.error = mode, error
    STATE.steps, STATE.patched_modules, STATE.exported = {}, {}, False
    try:
        refresh_derived()
    except Exception as exc:  # pragma: no cover
        logger.error("flashinfer-sm120: refreshing FlashInfer after the rollback failed: %r", exc)


def _fail(error: str, *, report: bool = True) -> None:
    _unpatch(Mode.FAILED, error)
    logger.error("flashinfer-sm120: %s; every change was undone and FlashInfer is unpatched.%s", error,
                 " Please report this with 'flashinfer-sm120 doctor --json'." if report else "")


def _check_import_health() -> None:
    broken = _import_failed() if STATE.mode.active and STATE.patched_modules else None
    if broken is not None:
        from flashinfer_sm120.core.patch.gate import import_failed  # a failed import only

        error, report = import_failed(broken)
        _fail(error, report=report)


def _run_steps(pending: list[str], mode: Mode) -> None:
    for name in pending:
        mod = sys.modules[name]
        for step in STEPS.get(name, ()):
            if mode not in step.modes:
                continue
            try:
                not_needed = step.apply(mod)
            except Exception as exc:
                if step.required:
                    raise RuntimeError(f"step {step.name} on {name}: {exc!r}") from exc
                STATE.steps[step.name] = f"skipped: {exc!r}"
                continue
            STATE.steps[step.name] = f"not needed: {not_needed}" if not_needed else "applied"
        STATE.patched_modules[name] = mod


def _loaded(name: str, just_imported: str | None) -> bool:
    """Module ``name`` finished importing (``flashinfer.jit.core`` importing ``jit.env`` has not)."""
    mod = sys.modules.get(name)
    return mod is not None and (name == just_imported
                                or not getattr(getattr(mod, "__spec__", None), "_initializing", False))


def _apply_locked(just_imported: str | None = None) -> None:
    _check_import_health()
    if STATE.mode is Mode.FAILED and _loaded("flashinfer.jit.cpp_ext", just_imported):
        # unpatched, but FlashInfer's own nvcc --version (at its import) still gets a deadline (threat-model: P6)
        with contextlib.suppress(Exception):
            steps.bound_cuda_version(sys.modules["flashinfer.jit.cpp_ext"])
    res = STATE.resolution
    if not (STATE.mode is Mode.IDLE or STATE.mode.active) or res is None:
        return
    pending = [m for m in HOOKED_MODULES if m not in STATE.patched_modules and _loaded(m, just_imported)]
    if not pending:
        return
    first = STATE.mode is Mode.IDLE
    if first:
        STATE.mode = Mode.GUARD if res.guard else Mode.NOOP if _already_correct(res) else Mode.PATCHED
    mode = STATE.mode
    try:
        _run_steps(pending, mode)
        if mode is not Mode.GUARD:
            refresh_derived()
        if mode is not Mode.GUARD and not STATE.exported and all(m in STATE.patched_modules for m in HOOKED_MODULES):
            # noop: FlashInfer's toolkit is right, but its builds still get the memory policy and the checks
            export = environ.export if mode is Mode.PATCHED else environ.export_builds
            STATE.undo.add(f"environ.{export.__name__}", export(res.home.path, res.choice.toolkit.nvcc,
                                                                res.choice.targets, STATE.recorded_export))
            STATE.exported = True
            _warn_jit_dir()
    except Exception as exc:
        _fail(f"patching {pending} failed: {exc}")
        return
    if first:
        _announce(mode, res)


def _warn_jit_dir() -> None:
    """Say once, and in :func:`status`'s ``error``, when FlashInfer's JIT directory cannot stand unquoted in its
    build.ninja files, or a directory it reads code from fails the trust rule (CuTe DSL's as it takes it at import)."""
    jit_dir = getattr(sys.modules.get("flashinfer.jit.env"), "FLASHINFER_JIT_DIR", None)
    problem = jit_dir is not None and code_dirs_refused(str(jit_dir))
    if problem:
        STATE.error = str(problem)
        STATE.log_once(logging.WARNING, f"flashinfer-sm120: {problem}")


def _announce(mode: Mode, res: Resolution) -> None:
    STATE.summary = render(mode, res)
    if mode is Mode.GUARD:  # a listing command (status, doctor, build until its checks pass) says it once itself
        STATE.error = res.error
        logger.log(logging.INFO if STATE.listing else logging.ERROR, "flashinfer-sm120: %s", STATE.summary)
        return
    # Changing the toolkit FlashInfer would have used, or a CUDA_HOME it could not link with (its own nvcc kept in
    # a view), or a toolkit setting not used as given, is worth one visible line.
    changed = bool(res.settings) or (mode is Mode.PATCHED and res.naive_root != res.home.path
                                    and (not res.own or not res.naive_root or bool(res.naive_lacks)))
    level = logging.WARNING if changed and not env_flag("FLASHINFER_SM120_QUIET") else logging.INFO
    logger.log(level, "flashinfer-sm120: %s", STATE.summary)


def record_status(st: dict | None = None) -> None:
    """Keep ``st`` (default :func:`status`) for ``flashinfer-sm120 status`` (:mod:`.laststatus`); never raises."""
    try:
        with STATE.lock:
            inputs, res = STATE.inputs, STATE.resolution
        if inputs is not None:
            laststatus.save(laststatus.from_status(st or status()), inputs, res, environ.decisions())
    except Exception as exc:  # pragma: no cover - save never raises
        logger.debug("flashinfer-sm120: status not recorded: %r", exc)


def _on_import(module: types.ModuleType) -> None:
    """Post-import hook body: never raises into the importer."""
    try:
        _ensure_resolution()
        with STATE.lock:
            _apply_locked(module.__name__)
    except Exception as exc:  # pragma: no cover - _apply_locked already guards
        logger.error("flashinfer-sm120: internal error, FlashInfer left unpatched: %r", exc)


def install() -> dict:
    """Register the post-import hooks and patch whatever FlashInfer is loaded; returns :func:`status`.  Idempotent,
    never raises; after a failure, revert or guard it resolves again (a toolkit installed since is used)."""
    with STATE.lock:
        _check_import_health()
        if env_flag("FLASHINFER_SM120_DISABLE"):
            if STATE.mode is Mode.IDLE:
                STATE.mode = Mode.DISABLED
            return status()
        if STATE.mode in (Mode.GUARD, Mode.REVERTED, Mode.DISABLED, Mode.FAILED):  # a toolkit may be installed now
            STATE.undo.rollback()  # the guard's wrappers; empty in the other modes
            STATE.reset(Mode.IDLE)
        partial = [m for m in HOOKED_MODULES if m in sys.modules and not _loaded(m, None)]
        if partial and not STATE.hooks_registered:  # wrapt would hand us the half-made module as imported
            from flashinfer_sm120.core.patch.gate import imported_midway

            STATE.mode, STATE.error = Mode.FAILED, imported_midway(partial[0])
            logger.error("flashinfer-sm120: %s", STATE.error)
            return status()
        if not STATE.hooks_registered:
            relative = normalize_base()  # before FlashInfer's jit/env.py reads it
            if relative:
                logger.warning("flashinfer-sm120: %s", relative)
            for name in HOOKED_MODULES:
                wrapt.register_post_import_hook(_on_import, name)
            wrapt.register_post_import_hook(lambda _: record_status(), "flashinfer")  # its import completed
            STATE.hooks_registered = True
        loaded = any(m in sys.modules for m in HOOKED_MODULES)
    if loaded:
        _ensure_resolution()
        with STATE.lock:
            _apply_locked()
        if _loaded("flashinfer", None):  # its hook ran before this resolution
            record_status()
    return status()


def revert() -> dict:
    """Undo every patch and export and recompute FlashInfer's derived state its own way; returns :func:`status`.
    Later imports stay unpatched until :func:`install`."""
    with STATE.lock:
        _unpatch(Mode.REVERTED)
        STATE.summary = "reverted: FlashInfer runs with its own toolkit and arch logic"
        return status()


def status() -> dict:
    """Where patching stands: ``mode`` (docs/reference/status.md), ``error``, the ``summary`` line, the ``steps``,
    ``patched_modules``, the ``resolution``, FlashInfer's ``target_cuda_archs`` and what is ``exported``."""
    with STATE.lock:
        _check_import_health()
        core = sys.modules.get("flashinfer.jit.core")
        ctx = getattr(core, "current_compilation_context", None)
        archs = getattr(ctx, "TARGET_CUDA_ARCHS", None)
        return {
            "mode": STATE.mode.value,
            "error": STATE.error,
            "summary": STATE.summary,
            "patched_modules": list(STATE.patched_modules),
            "steps": dict(STATE.steps),
            "resolution": STATE.resolution.to_dict() if STATE.resolution else None,
            "target_cuda_archs": [_arch.format_target(t) for t in sorted(archs)] if archs is not None else None,
            "exported": environ.exported(),
        }
