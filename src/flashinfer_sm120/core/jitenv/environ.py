"""One toolkit for every JIT in the process: what is exported once FlashInfer is patched (its own
builds use the chosen toolkit through the patch, :mod:`flashinfer_sm120.core.patch`).

``CUDA_HOME`` (and ``CUDA_PATH`` when set)
    read by children (ninja, workers, FlashInfer there) and by ``torch.utils.cpp_extension`` at its
    import (``_find_cuda_home``: ``CUDA_HOME`` or ``CUDA_PATH``, then ``which nvcc``, then ``/usr/local/cuda``).
``PATH`` (nvcc and ninja)
    the nvcc vLLM 0.33's ``has_flashinfer`` (``vllm/utils/flashinfer.py``) and SGLang 0.5.23's JIT
    (``cuda_home()``, ``_jit_cuda_version()``) find without ``CUDA_HOME``/``CUDA_PATH``
    (:mod:`flashinfer_sm120.core.facts.servers`): its directory goes first, unless it already resolves
    first or the directory is shared (``/usr/bin``, a conda ``bin`` holding ``python``), which it would
    shadow.  FlashInfer runs ``ninja`` from ``PATH`` and ``has_flashinfer`` needs ``shutil.which("ninja")``:
    the chosen ninja goes first too, through a directory holding only a link to it where its own would
    shadow (:mod:`flashinfer_sm120.core.toolkit.ninja`).
``torch.utils.cpp_extension.CUDA_HOME``
    computed once at import (torch 2.13 ``cpp_extension.py``) and read by every later use
    (``include_paths``, ``library_paths``, Inductor's libdevice lookup in
    ``torch/_inductor/runtime/compile_tasks.py``): updated in place when already imported by a CUDA torch.
Triton's ``ptxas``
    only where the bundled one cannot build the GPU's target (:mod:`.ptxas`).

The callable :func:`export` returns undoes all of it (the patch layer's undo log, run by ``revert()``).
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import sys
import threading
from typing import Callable, Iterable

from flashinfer_sm120.core.facts import arch as _arch
from flashinfer_sm120.core.jitenv import ptxas

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["export", "export_builds", "exported", "describe", "reset", "SHARED_BIN_DIRS"]

#: Directories never put first on ``PATH``: they hold the system's programs, which
#: would then shadow the user's (``/usr/local/bin`` over ``/usr/bin`` and so on).
SHARED_BIN_DIRS = ("/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin")

_lock = threading.RLock()
_current: dict | None = None  # {"key", "undo", "info"}
_pending: dict = {}  # what prepare_builds finishes: the export's steps, the compiler verdicts, (home, nvcc, targets)


class _Steps:
    """Applied changes and how to undo each, env first (module globals read the env)."""

    def __init__(self) -> None:
        self.env_undo: list[Callable[[], None]] = []
        self.late_undo: list[Callable[[], None]] = []
        self.info: dict = {}

    def set_env(self, name: str, value: str) -> None:
        old = os.environ.get(name)
        os.environ[name] = value

        def undo() -> None:
            if os.environ.get(name) != value:
                return  # changed by someone since: theirs now, leave it
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old

        self.env_undo.append(undo)

    def pop_env(self, name: str) -> None:
        old = os.environ.pop(name, None)
        if old is not None:
            self.env_undo.append(lambda: os.environ.setdefault(name, old))

    def undo(self) -> None:
        with _lock:
            if _pending.get("steps") is self:  # undone before its first build: nothing left to prepare
                _pending.clear()
        for fn in reversed(self.env_undo):
            _guarded(fn)
        for fn in reversed(self.late_undo):
            _guarded(fn)


def _guarded(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:  # pragma: no cover - restoring a value
        logger.error("flashinfer-sm120: undoing an export step failed: %r", exc)


def _shared_dir(bin_dir: str) -> str | None:
    real = os.path.realpath(bin_dir)
    if real in SHARED_BIN_DIRS or bin_dir in SHARED_BIN_DIRS:
        return f"{bin_dir} is a system directory"
    if glob.glob(os.path.join(glob.escape(bin_dir), "python*")):
        return f"{bin_dir} also holds a Python interpreter"
    return None


def _bin_dir(home: str, nvcc: str) -> str:
    """``<home>/bin`` when its nvcc is the chosen one (a view's ``bin``), else nvcc's directory."""
    in_home = os.path.join(home, "bin", "nvcc")
    if os.path.realpath(in_home) == os.path.realpath(nvcc) and os.path.exists(in_home):
        return os.path.join(home, "bin")
    return os.path.dirname(nvcc)


def _export_path(steps: _Steps, bin_dir: str) -> None:
    nvcc = os.path.join(bin_dir, "nvcc")
    current = os.environ.get("PATH")
    found = shutil.which("nvcc", path=current if current is not None else os.defpath)
    if found and os.path.realpath(found) == os.path.realpath(nvcc):
        steps.info["PATH"] = f"unchanged: nvcc on PATH is already the chosen one ({found})"
        return
    shared = _shared_dir(bin_dir)
    if shared:
        steps.info["PATH"] = (f"unchanged: {shared}, which putting first on PATH would let shadow "
                              f"other programs; 'which nvcc' gives {found}")
        logger.info("flashinfer-sm120: not putting %s first on PATH: %s", bin_dir, shared)
        return
    steps.set_env("PATH", bin_dir + os.pathsep + (current if current is not None else os.defpath))
    steps.info["PATH"] = f"{bin_dir} first (was: 'which nvcc' -> {found})"


def _export_ninja(steps: _Steps) -> None:
    """The ninja FlashInfer's ``run_ninja`` runs from ``PATH`` (and vLLM's ``has_flashinfer``
    looks for): the chosen one first (:mod:`flashinfer_sm120.core.toolkit.ninja`)."""
    from flashinfer_sm120.core.toolkit import ninja

    try:
        d, note = ninja.export_dir(ninja.choose(), os.environ.get("PATH"), _shared_dir)
    except ninja.NinjaError as exc:
        steps.info["ninja"] = f"not exported: {exc}"
        logger.warning("flashinfer-sm120: %s", exc)
        return
    if d is not None:
        current = os.environ.get("PATH")
        steps.set_env("PATH", d + os.pathsep + (current if current is not None else os.defpath))
    steps.info["ninja"] = note


def _export_cpp_extension(steps: _Steps, home: str) -> None:
    mod = sys.modules.get("torch.utils.cpp_extension")
    torch = sys.modules.get("torch")
    if mod is None:
        steps.info["torch.utils.cpp_extension.CUDA_HOME"] = "not imported yet: it will read CUDA_HOME"

        def undo_later_import() -> None:  # imported meanwhile: it read our CUDA_HOME; ask it again
            m, t = sys.modules.get("torch.utils.cpp_extension"), sys.modules.get("torch")
            if m is not None and getattr(m, "CUDA_HOME", None) == home:
                cuda = getattr(getattr(t, "version", None), "cuda", None)
                m.CUDA_HOME = m._find_cuda_home() if cuda and hasattr(m, "_find_cuda_home") else None

        steps.late_undo.append(undo_later_import)
        return
    if not getattr(getattr(torch, "version", None), "cuda", None):
        steps.info["torch.utils.cpp_extension.CUDA_HOME"] = "unchanged: torch is not a CUDA build"
        return
    old = getattr(mod, "CUDA_HOME", None)
    if old == home:
        steps.info["torch.utils.cpp_extension.CUDA_HOME"] = "unchanged: already the chosen home"
        return
    mod.CUDA_HOME = home

    def undo() -> None:
        if getattr(mod, "CUDA_HOME", None) == home:
            mod.CUDA_HOME = old

    steps.late_undo.append(undo)
    steps.info["torch.utils.cpp_extension.CUDA_HOME"] = f"{home} (was {old})"


def _check_compilers(steps: _Steps, home: str, nvcc: str, targets) -> None:
    """FlashInfer's compiler variables checked now, the refused ones removed (P2: FlashInfer 0.7.4 runs
    ``CC`` while it generates a spec, ``jit/fused_moe.py`` ``host_compiler_is_gcc()`` on aarch64);
    ``MAX_JOBS`` and the compiler cache wait for the first JIT build (:func:`prepare_builds`)."""
    from flashinfer_sm120.safety import compilers

    try:
        verdicts = compilers.check(os.environ, nvcc, home)
    except Exception as exc:  # said in the notes (toolchain.from_verdicts)
        verdicts = exc
    for v in [] if isinstance(verdicts, Exception) else verdicts:
        if not v.keep:
            steps.pop_env(v.var)
            logger.warning("flashinfer-sm120: %s", v.note)
    steps.info["builds"] = "compiler variables checked; MAX_JOBS and the compiler cache at the first JIT build"
    with _lock:
        _pending.update(steps=steps, verdicts=verdicts, args=(home, nvcc, targets))


def prepare_builds() -> None:
    """Right before FlashInfer's first JIT build of the process (the patch's build gate): ``MAX_JOBS`` from
    the memory and the compiler cache (:func:`.toolchain.plan_builds`), joined to the export's undo.  Later
    calls do nothing; never raises."""
    with _lock:  # held while planning: a second builder waits for MAX_JOBS
        steps, verdicts, args = (_pending.pop(k, None) for k in ("steps", "verdicts", "args"))
        if steps is None:
            return
        try:
            from flashinfer_sm120.core.jitenv import toolchain

            setup = toolchain.from_verdicts(verdicts)
            said = set(setup.warnings)  # at import
            toolchain.plan_builds(setup, *args)
            for name in setup.pop:  # those refused at import are gone already: nothing to undo twice
                steps.pop_env(name)
            for name, value in setup.set.items():
                steps.set_env(name, value)
            if setup.max_jobs_value is not None:  # ours to refresh before each build, and to remove on undo
                os.environ["MAX_JOBS"] = setup.max_jobs_value
                toolchain.own_max_jobs(setup.max_jobs_value)
                steps.env_undo.append(toolchain.release_max_jobs)
            for line in setup.warnings:
                if line not in said:
                    logger.warning("flashinfer-sm120: %s", line)
            steps.info["builds"] = setup.to_dict()
        except Exception as exc:
            steps.info["builds"] = f"failed: {exc!r}"
            logger.warning("flashinfer-sm120: setting up JIT builds failed: %r", exc)


def export(home: str, nvcc: str, targets: Iterable[tuple[int, str]]) -> Callable[[], None]:
    """Export the chosen toolkit (``home``: the ``CUDA_HOME`` FlashInfer builds with; ``nvcc``: the chosen
    nvcc; ``targets``: FlashInfer's ``(major, minor_str)`` targets) to the rest of the process and its
    children; returns the undo (idempotent; a value someone else changed since is left alone).

    Called by the patch layer once FlashInfer is patched, and by the autoload after ``import
    vllm``/``sglang``.  The same arguments again change nothing; others undo the previous export
    first.  A step that fails is logged and skipped, never raised.
    """
    targets = tuple(sorted({(int(a), str(b)) for a, b in targets}))
    key = (home, nvcc, targets)
    global _current
    with _lock:
        if _current is not None and _current["key"] == key:
            return _current["undo"]
        if _current is not None:
            _current["undo"]()
        steps = _Steps()
        steps.info.update(cuda_home=home, nvcc=nvcc, targets=[_arch.format_target(t) for t in targets])
        steps.set_env("CUDA_HOME", home)
        if os.environ.get("CUDA_PATH") not in (None, home):
            steps.set_env("CUDA_PATH", home)
            steps.info["CUDA_PATH"] = home
        sms = [a * 10 + int(b[0]) for a, b in targets]
        bin_dir = _bin_dir(home, nvcc)
        for name, step, args in (("ninja", _export_ninja, ()), ("path", _export_path, (bin_dir,)),
                                 ("cpp_extension", _export_cpp_extension, (home,)),
                                 ("triton", ptxas.export, (bin_dir, sms)),
                                 ("builds", _check_compilers, (home, nvcc, targets))):
            try:
                step(steps, *args)
            except Exception as exc:
                steps.info[name] = f"failed: {exc!r}"
                logger.warning("flashinfer-sm120: exporting the toolkit: %s failed: %r", name, exc)
        record: dict = {"key": key, "info": steps.info}

        def undo() -> None:
            global _current
            with _lock:
                if _current is not record:
                    return
                steps.undo()
                _current = None

        record["undo"] = undo
        _current = record
        return undo


def export_builds(home: str, nvcc: str, targets: Iterable[tuple[int, str]]) -> Callable[[], None]:
    """Only what FlashInfer's JIT builds get (compiler variables checked now, ``MAX_JOBS`` and the compiler
    cache at the first build), for a FlashInfer that needs no patching (``noop``).  Returns the undo."""
    steps = _Steps()
    try:
        _check_compilers(steps, home, nvcc, tuple(targets))
    except Exception as exc:
        logger.warning("flashinfer-sm120: setting up JIT builds failed: %r", exc)
    return steps.undo


def reset() -> None:
    """Undo the current export, whoever made it (``revert()`` calls this, so an early
    export by the autoload or ``worker_setup`` goes too).  Never raises."""
    with _lock:
        current = _current
    if current is not None:
        current["undo"]()


def exported() -> dict:
    """What is exported now (``{}`` when nothing is), for ``doctor``: ``cuda_home``, ``nvcc``, ``targets``,
    a sentence per step (``PATH``, ``ninja``, ``CUDA_PATH``, ``torch.utils.cpp_extension.CUDA_HOME``,
    ``triton``, ``builds``), and ``which_nvcc``/``which_ninja`` now."""
    with _lock:
        if _current is None:
            return {}
        out = dict(_current["info"])
    out["which_nvcc"] = shutil.which("nvcc")
    out["which_ninja"] = shutil.which("ninja")
    return out


def describe(info: dict | None = None) -> list[str]:
    """:func:`exported` as ``doctor`` prints it, one line per item."""
    info = exported() if info is None else info
    if not info:
        return ["nothing exported (FlashInfer not patched in this process)"]
    lines = [f"CUDA_HOME={info['cuda_home']}"]
    for k in ("CUDA_PATH", "PATH", "ninja", "torch.utils.cpp_extension.CUDA_HOME", "triton"):
        if k in info:
            lines.append(f"{k}: {info[k]}")
    lines.append(f"which nvcc: {info.get('which_nvcc')}")
    if "which_ninja" in info:
        lines.append(f"which ninja: {info['which_ninja']}")
    return lines
