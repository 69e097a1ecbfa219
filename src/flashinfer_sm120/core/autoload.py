"""The ``.pth`` autoload: load flashinfer_sm120 only when a module that needs it is imported.

``enable`` writes :data:`HOOK_FILE` (a copy of :mod:`.autoload_hook`, standard library only) and
:data:`PTH_NAME`, whose one line (:data:`PTH_LINE`) arms the hook at every interpreter start; the first
import of a :data:`TRIGGERS` module loads the package and calls :func:`triggered`.  ``disable`` removes
both files.  Failure rules and triggers: :mod:`.autoload_hook` and docs/servers.md.

``vllm`` and ``sglang`` look for nvcc and ninja *before* they import FlashInfer (vLLM 0.33
``vllm/utils/flashinfer.py`` ``has_flashinfer()``; SGLang 0.5.23 ``cuda_home()``,
``_jit_cuda_version()``): once the server package is imported, the chosen toolkit is exported
(:mod:`flashinfer_sm120.core.jitenv.environ`) without importing FlashInfer, which would initialise
CUDA in the server's parent process.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from flashinfer_sm120.safety.formats.reads import env_flag

# The hook (autoload_hook.py) is a standalone program that ``enable`` copies into site-packages; it
# is never imported from here (it imports this module when it fires), so it keeps its own copy of
# these three values and tests/integration/test_autoload.py checks that the two agree.
#: The ``.pth`` file ``enable`` writes.
PTH_NAME = "flashinfer_sm120_autoload.pth"
#: The hook module's name in site-packages (the ``.pth`` imports it).
MODULE_NAME = "flashinfer_sm120_autoload"
#: Top-level modules whose first import loads flashinfer_sm120.
TRIGGERS = ("flashinfer", "vllm", "sglang")

__all__ = ["PTH_NAME", "PTH_LINE", "HOOK_FILE", "MODULE_NAME", "TRIGGERS", "EXPORT_EARLY", "hook_source",
           "pth_files", "triggered", "worker_setup", "state", "enabled_in", "doctor_report"]

logger = logging.getLogger("flashinfer_sm120")


#: Triggers after whose import the chosen toolkit is exported at once (see module docstring).
EXPORT_EARLY = ("vllm", "sglang")

#: The one line of the ``.pth``: import the hook module written next to it, and arm it.
PTH_LINE = f"import {MODULE_NAME}; {MODULE_NAME}.install()\n"
#: File name of the hook module ``enable`` writes next to the ``.pth``.
HOOK_FILE = MODULE_NAME + ".py"


def hook_source() -> str:
    """The source of :mod:`flashinfer_sm120.core.autoload_hook`, which ``enable`` copies as :data:`HOOK_FILE`."""
    return Path(__file__).with_name("autoload_hook.py").read_text(encoding="utf-8")


def pth_files() -> dict[str, str]:
    """What ``enable`` writes into a site directory: ``{file name: text}``, the module before the
    ``.pth`` (so an interpreter starting meanwhile never finds a ``.pth`` without its module)."""
    return {HOOK_FILE: hook_source(), PTH_NAME: PTH_LINE}


class _State:
    triggered_by: str | None = None
    pth: str | None = None
    early_export: str | None = None  # what happened to the early export, for doctor


state = _State()


def triggered(name: str, pth: str | None = None) -> None:
    """Called by the hook once ``flashinfer_sm120`` is imported; never raises.

    Records which import loaded the package (for ``doctor``) and, for the server
    triggers in :data:`EXPORT_EARLY`, registers a post-import hook that exports
    the chosen toolkit as soon as the server package has finished importing.

    Args:
        name: the module whose import fired the hook, e.g. ``"vllm.entrypoints"``.
        pth: path of the ``.pth`` file that installed the hook, if known.
    """
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
    """Post-import hook of a server package: resolve and export, without FlashInfer."""
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

    Does in a worker what the ``.pth`` does for ``import vllm``: the FlashInfer
    patch hooks are installed (FlashInfer imported before or after is patched)
    and the chosen toolkit is exported now (``CUDA_HOME``, ``PATH``...), without
    importing FlashInfer.  Never raises; ``doctor``/``status()`` report problems.

    Use as ``runtime_env={"worker_process_setup_hook":
    "flashinfer_sm120.core.autoload.worker_setup"}`` (see ``examples/ray_workers.py``).
    """
    from flashinfer_sm120 import install

    state.triggered_by = state.triggered_by or "worker_setup"
    try:
        install()
    except Exception as exc:  # install() already guards
        logger.error("flashinfer-sm120: install failed: %r", exc)
    if "flashinfer" not in sys.modules:  # once patched, the patch layer has exported already
        _export_now("by worker_setup")


def enabled_in() -> list[str]:
    """The ``.pth`` files of this interpreter's site directories (what ``site`` reads at
    start-up: ``site.getsitepackages()``, and the user site when enabled)."""
    import site

    dirs = list(getattr(site, "getsitepackages", lambda: [])())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    seen, out = set(), []
    for d in dirs:
        path = os.path.join(d, PTH_NAME)
        if os.path.realpath(path) not in seen and os.path.isfile(path) and _has_our_line(path):
            seen.add(os.path.realpath(path))
            out.append(path)
    return out


def _has_our_line(path: str) -> bool:
    """Whether the ``.pth`` at ``path`` holds a line of ours (``disable`` leaves lines you added)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return "flashinfer_sm120" in fh.read(64 << 10)  # ours, or an older release's line
    except OSError:
        return False


def doctor_report() -> dict:
    """The autoload part of ``doctor --json``: ``pth`` (files found), ``outdated`` (those not
    written by this release's ``enable``, or missing their module), ``triggers``,
    ``disabled``, ``triggered_by`` and ``early_export`` (this process)."""
    found = enabled_in()
    return {"pth": found, "outdated": [p for p in found if not _current(os.path.dirname(p))],
            "triggers": list(TRIGGERS),
            "disabled": env_flag("FLASHINFER_SM120_DISABLE"),
            "triggered_by": state.triggered_by, "early_export": state.early_export}


def _current(site_dir: str) -> bool:
    """Whether ``site_dir`` holds exactly what this release's ``enable`` writes."""
    try:
        for name, text in pth_files().items():
            with open(os.path.join(site_dir, name), encoding="utf-8") as fh:
                got = fh.read(len(text) + 1)
                if got != text and not (name == PTH_NAME and got.startswith(text)):  # lines you added follow ours
                    return False
    except OSError:
        return False
    return True
