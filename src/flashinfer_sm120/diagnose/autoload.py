"""The ``.pth`` autoload on disk: what ``enable`` writes (:func:`pth_files`) and what ``doctor`` finds
(:func:`doctor_report`).  Standard library and the hook's own names only: ``disable`` works with the rest broken."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from flashinfer_sm120.core import autoload_hook
from flashinfer_sm120.core.autoload_hook import HOOK_FILE, PTH_LINE, PTH_NAME, triggers
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats import reads

#: Bytes of a ``.pth`` or hook file read to tell whether it is ours; a larger one is not.
OURS_MAX = 256 << 10


def hook_source() -> str:
    """The source of :mod:`flashinfer_sm120.core.autoload_hook`, which ``enable`` copies as ``HOOK_FILE``."""
    return Path(autoload_hook.__file__).read_text(encoding="utf-8")


def pth_files() -> dict[str, str]:
    """``{file name: text}`` ``enable`` writes into a site directory, the module before the ``.pth`` (an
    interpreter starting meanwhile never finds a ``.pth`` without its module)."""
    return {HOOK_FILE: hook_source(), PTH_NAME: PTH_LINE}


def site_dirs() -> list[str]:
    """This interpreter's site directories (``site.getsitepackages()`` and the user site)."""
    import site

    dirs = []
    for get in (site.getsitepackages, lambda: [site.getusersitepackages()]):
        with contextlib.suppress(Exception):  # some embedded/virtualenv builds lack them
            dirs += get()
    return [d for d in dirs if isinstance(d, str) and d]


def read_text(path: str) -> str | None:
    """The UTF-8 text of the regular file ``path`` (no link followed, at most :data:`OURS_MAX` bytes), else ``None``."""
    try:
        return reads.read_text(path, OURS_MAX, follow=False)
    except FormatError:
        return None


def other_lines(pth: str) -> tuple[list[str], bool]:
    """``(lines of the .pth not ours, whether one of ours is there)``; ours name ``flashinfer_sm120``."""
    text = read_text(pth)
    if text is None:
        return [], False
    lines = [ln if ln.endswith("\n") else ln + "\n" for ln in text.splitlines(keepends=True)]
    ours = [ln for ln in lines if "flashinfer_sm120" in ln]  # this release's line, or an older release's
    return [ln for ln in lines if ln.strip() and ln not in ours], bool(ours)


def doctor_report() -> dict:
    """The autoload part of ``doctor --json``: ``pth`` found, those ``outdated`` (not this release's or missing their
    module), ``triggers``, ``disabled``, and this process's ``triggered_by`` and ``early_export``."""
    import site

    from flashinfer_sm120.core.autoload import state
    from flashinfer_sm120.safety.formats.reads import env_flag

    paths: dict[str, str] = {}  # the site directories Python reads here
    for d in site_dirs():
        if site.ENABLE_USER_SITE or d != site.getusersitepackages():
            paths.setdefault(os.path.realpath(os.path.join(d, PTH_NAME)), os.path.join(d, PTH_NAME))
    found = [p for p in paths.values() if other_lines(p)[1]]  # ours: this release's line or an older one's
    return {"pth": found, "outdated": [p for p in found if not current(os.path.dirname(p))],
            "triggers": list(triggers(os.environ)), "disabled": env_flag("FLASHINFER_SM120_DISABLE"),
            "triggered_by": state.triggered_by, "early_export": state.early_export}


def current(site_dir: str) -> bool:
    """Whether ``site_dir`` holds exactly what this release's ``enable`` writes (lines you added follow ours)."""
    for name, text in pth_files().items():
        got = read_text(os.path.join(site_dir, name))
        if got is None or not (got == text or (name == PTH_NAME and got.startswith(text))):
            return False
    return True
