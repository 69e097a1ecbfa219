"""The chosen toolkit exported before FlashInfer's import: after ``import vllm``/``sglang`` (they look for nvcc and
ninja first: vLLM 0.33 ``has_flashinfer()``, SGLang 0.5.23 ``cuda_home()``), and by :func:`worker_setup`."""

from __future__ import annotations

import logging
import os
import sys

from flashinfer_sm120.core.autoload import state
from flashinfer_sm120.safety.formats.reads import env_flag

logger = logging.getLogger("flashinfer_sm120")


def export_now(why: str) -> None:
    """Export the chosen toolkit without importing FlashInfer; never raises (``doctor`` shows ``why`` or the reason)."""
    try:
        from flashinfer_sm120.core.jitenv import environ
        from flashinfer_sm120.core.patch.decide import resolve

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
    """Per-worker set-up hook for process managers (Ray ``worker_process_setup_hook``): in a worker, what the ``.pth``
    does for ``import vllm``: patch hooks installed, the chosen toolkit exported now; never raises.  Public as
    ``flashinfer_sm120.worker_setup`` (see ``examples/ray_workers.py``)."""
    from flashinfer_sm120 import install

    state.triggered_by = state.triggered_by or "worker_setup"
    try:
        install()
    except Exception as exc:  # pragma: no cover - install() guards itself; a worker must start regardless
        logger.error("flashinfer-sm120: install failed: %r", exc)
    if "flashinfer" not in sys.modules:  # once patched, the patch layer has exported already
        export_now("by worker_setup")
