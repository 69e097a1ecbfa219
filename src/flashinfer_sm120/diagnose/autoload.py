"""The ``.pth`` autoload on disk: what ``enable`` writes (:func:`pth_files`) and what ``doctor`` finds
(:func:`doctor_report`).  Standard library and the hook's own names only: ``disable`` works with the rest broken."""

from __future__ import annotations

import os
from pathlib import Path

from flashinfer_sm120.core import autoload_hook
from flashinfer_sm120.core.autoload_hook import HOOK_FILE, PTH_LINE, PTH_NAME, TRIGGERS

__all__ = ["hook_source", "pth_files", "enabled_in", "doctor_report"]


def hook_source() -> str:
    """The source of :mod:`flashinfer_sm120.core.autoload_hook`, which ``enable`` copies as ``HOOK_FILE``."""
    return Path(autoload_hook.__file__).read_text(encoding="utf-8")


def pth_files() -> dict[str, str]:
    """``{file name: text}`` ``enable`` writes into a site directory, the module before the ``.pth`` (an
    interpreter starting meanwhile never finds a ``.pth`` without its module)."""
    return {HOOK_FILE: hook_source(), PTH_NAME: PTH_LINE}


def enabled_in() -> list[str]:
    """The ``.pth`` files of ours in this interpreter's site directories (``site.getsitepackages()``, and the
    user site when enabled), read up to 64 KiB (``disable`` leaves lines you added)."""
    import site

    dirs = list(getattr(site, "getsitepackages", lambda: [])())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    seen, out = set(), []
    for d in dirs:
        path = os.path.join(d, PTH_NAME)
        if os.path.realpath(path) in seen or not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                ours = "flashinfer_sm120" in fh.read(64 << 10)  # ours, or an older release's line
        except OSError:
            ours = False
        if ours:
            seen.add(os.path.realpath(path))
            out.append(path)
    return out


def doctor_report() -> dict:
    """The autoload part of ``doctor --json``: ``pth`` (files found), ``outdated`` (not written by this
    release's ``enable``, or missing their module), ``triggers``, ``disabled``, and this process's
    ``triggered_by`` and ``early_export``."""
    from flashinfer_sm120.core.autoload import state
    from flashinfer_sm120.safety.formats.reads import env_flag

    found = enabled_in()
    return {"pth": found, "outdated": [p for p in found if not current(os.path.dirname(p))],
            "triggers": list(TRIGGERS), "disabled": env_flag("FLASHINFER_SM120_DISABLE"),
            "triggered_by": state.triggered_by, "early_export": state.early_export}


def current(site_dir: str) -> bool:
    """Whether ``site_dir`` holds exactly what this release's ``enable`` writes (lines you added follow ours)."""
    try:
        for name, text in pth_files().items():
            with open(os.path.join(site_dir, name), encoding="utf-8") as fh:
                got = fh.read(len(text) + 1)
                if got != text and not (name == PTH_NAME and got.startswith(text)):
                    return False
    except OSError:
        return False
    return True
