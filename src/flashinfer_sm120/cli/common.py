"""Helpers shared by the ``flashinfer-sm120`` subcommands."""

from __future__ import annotations

import sys

__all__ = ["err", "bounded", "apply_arch", "ARCH_HELP"]


def bounded(msg: str) -> str:
    """``msg`` with long runs of input cut (:func:`flashinfer_sm120.safety.formats.base.bounded`).  ``enable`` and
    ``disable`` must work with the rest of the package broken, so a failed import cuts plainly."""
    try:
        from flashinfer_sm120.safety.formats.base import bounded as cut
    except Exception:  # a broken install: 'disable' still reports
        return msg if len(msg) <= 4096 else msg[:4096] + "..."
    return cut(msg)


def err(msg: str) -> int:
    """Print ``flashinfer-sm120: error: <msg>`` on stderr (long runs of input cut); returns exit status 2."""
    print(f"flashinfer-sm120: error: {bounded(msg)}", file=sys.stderr)
    return 2


ARCH_HELP = ("compute capabilities to check for, e.g. '12.0' or '12.0 12.1' (the grammar of build --arch; "
             "default: FLASHINFER_CUDA_ARCH_LIST, else the GPUs present); sets FLASHINFER_CUDA_ARCH_LIST")


def apply_arch(value: str | None) -> None:
    """``--arch`` of ``doctor`` and ``status``: :func:`flashinfer_sm120.core.facts.arch.export_arch_list` (the one
    reading, build's grammar, exported as ``FLASHINFER_CUDA_ARCH_LIST`` before anything resolves).

    :raises UsageError: the value is not an arch list (the message names it and the accepted form)."""
    from flashinfer_sm120.core.facts.arch import ArchListError, export_arch_list
    from flashinfer_sm120.errors import UsageError

    try:
        export_arch_list(value)
    except ArchListError as exc:
        raise UsageError(str(exc), fix="e.g. --arch 12.0") from None
