"""Helpers shared by the ``flashinfer-sm120`` subcommands."""

from __future__ import annotations

import sys

from flashinfer_sm120.safety.formats.base import bounded

__all__ = ["err", "apply_arch", "ARCH_HELP"]


def err(msg: str) -> int:
    """Print ``flashinfer-sm120: error: <msg>`` on stderr (long runs of input cut); returns exit status 2."""
    print(f"flashinfer-sm120: error: {bounded(msg)}", file=sys.stderr)
    return 2


ARCH_HELP = ("compute capabilities to check for, e.g. '12.0' or '12.0 12.1' (the grammar of build --arch; "
             "default: FLASHINFER_CUDA_ARCH_LIST, else the GPUs present); sets FLASHINFER_CUDA_ARCH_LIST")


def apply_arch(value: str | None) -> None:
    """``--arch`` of ``doctor`` and ``status``, exported before anything resolves; ``UsageError`` when it is bad."""
    from flashinfer_sm120.core.facts.arch import ArchListError
    from flashinfer_sm120.core.facts.archopt import export_arch_list
    from flashinfer_sm120.errors import UsageError

    try:
        export_arch_list(value)
    except ArchListError as exc:
        raise UsageError(str(exc), fix="e.g. --arch 12.0") from None
