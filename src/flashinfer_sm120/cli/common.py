"""Helpers shared by the ``flashinfer-sm120`` subcommands."""

from __future__ import annotations

import sys

__all__ = ["err", "bounded"]


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
