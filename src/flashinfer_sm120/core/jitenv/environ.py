"""One toolkit for every JIT in the process: what is exported once FlashInfer is patched, each step with its undo
(run by ``revert()``); what only FlashInfer's builds need waits for the first one (``toolchain.prepare_builds``)."""

from __future__ import annotations

import glob
import logging
import os
import shutil
import sys
import threading
from typing import Any, Callable, Iterable

from flashinfer_sm120.core.facts import arch as _arch

logger = logging.getLogger("flashinfer_sm120")

#: Never put first on ``PATH``: the system's programs there would shadow the user's.
SHARED_BIN_DIRS = ("/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin")

_lock = threading.RLock()
_current: dict | None = None  # {"key", "undo", "info"}
_pending: list = []  # what the first JIT build finishes: [(steps, verdicts, (home, nvcc, targets))]
_builds: dict = {}  # export_builds' decisions (noop)


def _put(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


class UndoLog:
    """Changes in the order made, each with the callable (no arguments, never raising) that undoes it."""

    def __init__(self) -> None:
        self._undo: list[tuple[str, Callable[[], None]]] = []

    def add(self, what: str, undo: Callable[[], None]) -> None:
        self._undo.append((what, undo))

    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        """``setattr(obj, name, value)``, recording how to restore the exact previous binding."""
        had, old = name in vars(obj), vars(obj).get(name)
        setattr(obj, name, value)
        self.add(f"{getattr(obj, '__name__', obj)}.{name}",
                 lambda: setattr(obj, name, old) if had else delattr(obj, name) if name in vars(obj) else None)

    def rollback(self) -> None:
        """Undo everything, newest first (a failed undo is logged)."""
        while self._undo:
            what, undo = self._undo.pop()
            try:
                undo()
            except Exception as exc:  # pragma: no cover - restoring a value
                logger.error("flashinfer-sm120: undoing %s failed: %r", what, exc)


class _Steps(UndoLog):
    """Export steps with their undos, what each decided, and what a later process replays (laststatus)."""

    def __init__(self) -> None:
        super().__init__()
        self.info: dict = {}
        self.replay: dict = {}

    def set_env(self, name: str, value: str | None) -> None:
        """``name=value`` (``None``: removed); undone unless changed since (then it is someone else's)."""
        old = os.environ.get(name)
        _put(name, value)
        if old != value:
            self.add(name, lambda: _put(name, old) if os.environ.get(name) == value else None)

    def prepend_path(self, d: str) -> None:
        self.set_env("PATH", d + os.pathsep + os.environ.get("PATH", os.defpath))

    def rollback(self) -> None:
        with _lock:
            if _pending and _pending[0][0] is self:  # undone before its first build: nothing left to prepare
                _pending.clear()
        super().rollback()


def _shared_dir(bin_dir: str) -> str | None:
    if os.path.realpath(bin_dir) in SHARED_BIN_DIRS or bin_dir in SHARED_BIN_DIRS:
        return f"{bin_dir} is a system directory"
    if glob.glob(os.path.join(glob.escape(bin_dir), "python*")):  # a conda or venv bin
        return f"{bin_dir} also holds a Python interpreter"
    return None


def _export_home(steps: _Steps, home: str) -> None:
    """``CUDA_HOME`` for children and torch's cpp_extension at its import, and ``CUDA_PATH`` when set."""
    steps.set_env("CUDA_HOME", home)
    if os.environ.get("CUDA_PATH") not in (None, home):
        steps.set_env("CUDA_PATH", home)
        steps.info["CUDA_PATH"] = home


def _export_path(steps: _Steps, bin_dir: str) -> None:
    """nvcc's directory first on ``PATH`` unless it shadows others (vLLM 0.33 and SGLang 0.5.23 look there: facts.servers)."""
    found = shutil.which("nvcc", path=os.environ.get("PATH", os.defpath))
    if found and os.path.realpath(found) == os.path.realpath(os.path.join(bin_dir, "nvcc")):
        steps.info["PATH"] = f"unchanged: nvcc on PATH is already the chosen one ({found})"
        return
    shared = _shared_dir(bin_dir)
    if shared:
        steps.info["PATH"] = (f"unchanged: {shared}, which putting first on PATH would let shadow "
                              f"other programs; 'which nvcc' gives {found}")
        logger.info("flashinfer-sm120: not putting %s first on PATH: %s", bin_dir, shared)
        return
    steps.prepend_path(bin_dir)
    steps.info["PATH"] = f"{bin_dir} first (was: 'which nvcc' -> {found})"


def _export_ninja(steps: _Steps, recorded: dict | None) -> None:
    """The ninja FlashInfer's ``run_ninja`` runs from ``PATH`` (vLLM's ``has_flashinfer`` looks there too)."""
    if recorded is None:
        from flashinfer_sm120.core.toolkit import ninja
        from flashinfer_sm120.safety.ownership import fingerprint

        try:
            chosen = ninja.choose()
            d, note = ninja.export_dir(chosen, os.environ.get("PATH"), _shared_dir)
        except ninja.NinjaError as exc:
            steps.info["ninja"] = f"not exported: {exc}"
            logger.warning("flashinfer-sm120: %s", exc)
            return
        recorded = {"dir": d, "note": note, "real": chosen.real, "stat": fingerprint(chosen.real)}
    steps.replay["ninja"] = recorded
    steps.info["ninja"] = recorded["note"]
    if recorded["dir"] is not None:
        steps.prepend_path(recorded["dir"])


def _export_cpp_extension(steps: _Steps, home: str) -> None:
    """``torch.utils.cpp_extension.CUDA_HOME``, computed once at its import (torch 2.13), updated in place."""
    key = "torch.utils.cpp_extension.CUDA_HOME"
    mod, torch = sys.modules.get("torch.utils.cpp_extension"), sys.modules.get("torch")
    if mod is None:
        steps.info[key] = "not imported yet: it will read CUDA_HOME"

        def undo_later_import() -> None:  # imported meanwhile: it read our CUDA_HOME; ask it again
            m, t = sys.modules.get("torch.utils.cpp_extension"), sys.modules.get("torch")
            if m is not None and getattr(m, "CUDA_HOME", None) == home:
                cuda = getattr(getattr(t, "version", None), "cuda", None)
                m.CUDA_HOME = m._find_cuda_home() if cuda and hasattr(m, "_find_cuda_home") else None

        steps.add(key, undo_later_import)
        return
    old = getattr(mod, "CUDA_HOME", None)
    if not getattr(getattr(torch, "version", None), "cuda", None):
        steps.info[key] = "unchanged: torch is not a CUDA build"
    elif old == home:
        steps.info[key] = "unchanged: already the chosen home"
    else:
        mod.CUDA_HOME = home
        steps.add(key, lambda: setattr(mod, "CUDA_HOME", old) if mod.CUDA_HOME == home else None)
        steps.info[key] = f"{home} (was {old})"


def _export_triton(steps: _Steps, bin_dir: str, sms: list[int], recorded: dict | None) -> None:
    """The chosen ptxas as ``TRITON_PTXAS*_PATH`` where Triton's own cannot build a target (``.triton.plan``)."""
    if recorded is None:
        from flashinfer_sm120.core.jitenv.triton import plan

        recorded = plan(bin_dir, sms)
    steps.replay["triton"] = recorded
    steps.info["triton"] = recorded["note"]
    for var, value in recorded["env"].items():
        steps.set_env(var, value)
        logger.info("flashinfer-sm120: Triton's bundled ptxas cannot build a target; set %s=%s", var, value)


def _check_compilers(steps: _Steps, home: str, nvcc: str, targets, recorded: dict | None = None) -> None:
    """Refused compiler variables removed now (P2: 0.7.4 runs ``CC`` making a spec: ``host_compiler_is_gcc()``)."""
    verdicts: list | Exception = []
    if recorded is None or recorded["set"]:
        from flashinfer_sm120.safety import compilers

        try:
            verdicts = compilers.check(os.environ, nvcc, home)
        except Exception as exc:  # said in the notes (toolchain.configure)
            verdicts = exc
    for v in [] if isinstance(verdicts, Exception) else verdicts:
        if not v.keep:
            steps.set_env(v.var, None)
            logger.warning("flashinfer-sm120: %s", v.note)
    steps.replay["compilers"] = {"set": verdicts != []}
    steps.info["builds"] = "compiler variables checked; MAX_JOBS and the compiler cache at the first JIT build"
    with _lock:
        _pending[:] = [(steps, verdicts, (home, nvcc, targets))]


def take_pending() -> tuple | None:
    """``(steps, verdicts, (home, nvcc, targets))`` the export left to the first JIT build, once."""
    with _lock:
        return _pending.pop() if _pending else None


def export(home: str, nvcc: str, targets: Iterable[tuple[int, str]],
           recorded: dict | None = None) -> Callable[[], None]:
    """Export the chosen toolkit to the process and its children (``recorded``: :func:`decisions` replayed); returns
    the idempotent undo.  Other arguments undo the previous export first; a failed step is logged, never raised."""
    targets = tuple(sorted({(int(a), str(b)) for a, b in targets}))
    key = (home, nvcc, targets)
    recorded = recorded or {}
    global _current
    with _lock:
        if _current is not None and _current["key"] == key:
            return _current["undo"]
        if _current is not None:
            _current["undo"]()
        steps = _Steps()
        steps.info.update(cuda_home=home, nvcc=nvcc, targets=[_arch.format_target(t) for t in targets])
        in_home = os.path.join(home, "bin", "nvcc")  # a view's bin when its nvcc is the chosen one
        same = os.path.realpath(in_home) == os.path.realpath(nvcc) and os.path.exists(in_home)
        bin_dir = os.path.dirname(in_home if same else nvcc)
        sms = [a * 10 + int(b[0]) for a, b in targets]
        # in the order undone last to first: torch's cpp_extension asks the restored environment again
        for name, step, args in (("cpp_extension", _export_cpp_extension, (home,)),
                                 ("CUDA_HOME", _export_home, (home,)),
                                 ("ninja", _export_ninja, (recorded.get("ninja"),)),
                                 ("path", _export_path, (bin_dir,)),
                                 ("triton", _export_triton, (bin_dir, sms, recorded.get("triton"))),
                                 ("builds", _check_compilers, (home, nvcc, targets, recorded.get("compilers")))):
            try:
                step(steps, *args)
            except Exception as exc:
                steps.info[name] = f"failed: {exc!r}"
                logger.warning("flashinfer-sm120: exporting the toolkit: %s failed: %r", name, exc)
        record: dict = {"key": key, "info": steps.info, "replay": steps.replay}

        def undo() -> None:
            global _current
            with _lock:
                if _current is record:
                    steps.rollback()
                    _current = None

        record["undo"] = undo
        _current = record
        return undo


def export_builds(home: str, nvcc: str, targets: Iterable[tuple[int, str]], recorded: dict | None = None
                  ) -> Callable[[], None]:
    """Only what FlashInfer's JIT builds get, for a FlashInfer that needs no patching (``noop``).  Returns the undo."""
    global _builds
    steps = _Steps()
    try:
        _check_compilers(steps, home, nvcc, tuple(targets), (recorded or {}).get("compilers"))
    except Exception as exc:
        logger.warning("flashinfer-sm120: setting up JIT builds failed: %r", exc)
    _builds = steps.replay
    return steps.rollback


def decisions() -> dict:
    """What the current export decided that a later process with the same inputs replays (``laststatus``)."""
    with _lock:
        return dict(_current["replay"]) if _current else dict(_builds)


def reset() -> None:
    """Undo the current export, whoever made it (``revert()``: an early one by the autoload goes too)."""
    with _lock:
        if _current is not None:
            _current["undo"]()


def exported() -> dict:
    """What is exported now (``{}`` when nothing is), for ``doctor``: ``cuda_home``, ``nvcc``, ``targets``,
    a sentence per step (``PATH``, ``ninja``, ``CUDA_PATH``, ``torch.utils.cpp_extension.CUDA_HOME``,
    ``triton``, ``builds``), and ``which_nvcc``/``which_ninja`` now."""
    with _lock:
        info = dict(_current["info"]) if _current else {}
    return dict(info, which_nvcc=shutil.which("nvcc"), which_ninja=shutil.which("ninja")) if info else {}
