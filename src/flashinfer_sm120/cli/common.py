"""Helpers shared by the ``flashinfer-sm120`` subcommands."""

from __future__ import annotations

import sys

__all__ = ["err", "bounded", "apply_arch", "ARCH_HELP"]


def bounded(msg: str) -> str:
    """``msg`` with long runs of input cut (:func:`flashinfer_sm120.formats.bounded`).  ``enable`` and
    ``disable`` must work with the rest of the package broken, so a failed import cuts plainly."""
    try:
        from ..formats.base import bounded as cut
    except Exception:  # a broken install: 'disable' still reports
        return msg if len(msg) <= 4096 else msg[:4096] + "..."
    return cut(msg)


def err(msg: str) -> int:
    """Print ``flashinfer-sm120: error: <msg>`` on stderr (long runs of input cut); returns exit status 2."""
    print(f"flashinfer-sm120: error: {bounded(msg)}", file=sys.stderr)
    return 2


ARCH_HELP = ("compute capabilities to check for, e.g. '12.0' or '12.0 12.1' (the grammar of build --arch; "
             "default: FLASHINFER_CUDA_ARCH_LIST, else the GPUs present); sets FLASHINFER_CUDA_ARCH_LIST")


def apply_arch(value: str | None) -> str | None:
    """``--arch`` of ``doctor`` and ``status``, read as ``build --arch`` is (:func:`flashinfer_sm120.arch.parse_arch_list`)
    and exported as ``FLASHINFER_CUDA_ARCH_LIST`` before anything resolves; returns the error message
    (naming the value and the accepted form) or ``None``."""
    if value is None:
        return None
    import os

    from ..arch import ArchListError, parse_arch_list

    try:
        specs = parse_arch_list(value, source="--arch")
    except ArchListError as exc:
        return str(exc)
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = " ".join(f"{s.major}.{s.minor}{s.suffix or ''}" for s in specs)
    return None
