"""What the ``.pth`` autoload (:mod:`.autoload_hook`) does once it loaded the package, and ``worker_setup``.

``vllm`` and ``sglang`` look for nvcc and ninja before they import FlashInfer (vLLM 0.33 ``has_flashinfer()``;
SGLang 0.5.23 ``cuda_home()``): after their import the chosen toolkit is exported without importing FlashInfer.
"""

from __future__ import annotations

import logging
import os
import sys

from flashinfer_sm120.safety.formats.reads import env_flag

__all__ = ["EXPORT_EARLY", "triggered", "worker_setup", "state"]

logger = logging.getLogger("flashinfer_sm120")

#: Triggers after whose import the chosen toolkit is exported at once.
EXPORT_EARLY = ("vllm", "sglang")


class _State:
    triggered_by: str | None = None
    pth: str | None = None
    early_export: str | None = None  # what happened to the early export, for doctor


state = _State()


def triggered(name: str, pth: str | None = None) -> None:
    """Called by the hook once the package is imported (``name``: the import that fired it, ``pth``: its
    ``.pth``); records both for ``doctor`` and, for :data:`EXPORT_EARLY`, exports after the server's import."""
    state.triggered_by, state.pth = name, pth
    top = name.partition(".")[0]
    if top not in EXPORT_EARLY:
        return
    try:
        import wrapt

        wrapt.register_post_import_hook(_export_early, top)
    except Exception as exc:  # wrapt missing or broken: FlashInfer's own hooks report it
        state.early_export = f"not done: {exc!r}"


def _export_early(module) -> None:
    _export_now(f"after importing {getattr(module, '__name__', module)}")


def _export_now(why: str) -> None:
    try:
        from flashinfer_sm120.core.jitenv import environ
        from flashinfer_sm120 import resolve

        if env_flag("FLASHINFER_SM120_DISABLE"):
            state.early_export = "not done: FLASHINFER_SM120_DISABLE is set"
            return
        res = resolve()
        home = res.home.path
        environ.export(home, os.path.join(home, "bin", "nvcc"), res.choice.targets)
        state.early_export = f"exported {home} {why}"
    except Exception as exc:  # FlashInfer's import reports the same problem with its fix
        state.early_export = f"not done: {exc}"
        logger.debug("flashinfer-sm120: early export (%s) skipped: %r", why, exc)


def worker_setup() -> None:
    """Per-worker set-up hook for process managers (Ray ``worker_process_setup_hook``).

    Does in a worker what the ``.pth`` does for ``import vllm``: the FlashInfer patch hooks are installed and
    the chosen toolkit is exported now (``CUDA_HOME``, ``PATH``...), without importing FlashInfer.  Never
    raises; ``doctor``/``status()`` report problems.  Use as ``runtime_env={"worker_process_setup_hook":
    "flashinfer_sm120.core.autoload.worker_setup"}`` (see ``examples/ray_workers.py``).
    """
    from flashinfer_sm120 import install

    state.triggered_by = state.triggered_by or "worker_setup"
    try:
        install()
    except Exception as exc:  # pragma: no cover - install() guards itself; a worker must start regardless
        logger.error("flashinfer-sm120: install failed: %r", exc)
    if "flashinfer" not in sys.modules:  # once patched, the patch layer has exported already
        _export_now("by worker_setup")
