"""What the process exports once FlashInfer is patched (minimal version: ``CUDA_HOME``).

Called by the patch layer only in the ``patched`` state, after every FlashInfer
patch step succeeded; the returned undo callable goes into the patch layer's
undo log (run by ``revert()`` and by a rollback).
"""

from __future__ import annotations

import os
from typing import Callable, Iterable

__all__ = ["export", "exported"]

_exported: dict = {}


def export(home: str, nvcc: str, targets: Iterable[tuple[int, str]]) -> Callable[[], None]:
    """Export the chosen toolkit to the rest of the process.

    Sets ``os.environ["CUDA_HOME"]`` so child processes (workers, ninja) agree
    with FlashInfer in this process.

    Args:
        home: the ``CUDA_HOME`` given to FlashInfer (absolute path).
        nvcc: the nvcc binary behind it.
        targets: the ``(major, minor_str)`` targets FlashInfer builds.

    Returns:
        A callable (no arguments, never raises) restoring the previous values.
    """
    old = os.environ.get("CUDA_HOME")
    os.environ["CUDA_HOME"] = home
    _exported.clear()
    _exported.update({"CUDA_HOME": home, "nvcc": nvcc, "targets": sorted(f"sm_{a}{b}" for a, b in targets)})

    def undo() -> None:
        if old is None:
            os.environ.pop("CUDA_HOME", None)
        else:
            os.environ["CUDA_HOME"] = old
        _exported.clear()

    return undo


def exported() -> dict:
    """What is currently exported (``{}`` when nothing is), for ``doctor``."""
    return dict(_exported)
