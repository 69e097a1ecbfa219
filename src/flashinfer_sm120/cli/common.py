"""Helpers shared by the ``flashinfer-sm120`` subcommands."""

from __future__ import annotations

import sys

__all__ = ["err"]


def err(msg: str) -> int:
    """Print ``flashinfer-sm120: error: <msg>`` on stderr; returns exit status 2."""
    print(f"flashinfer-sm120: error: {msg}", file=sys.stderr)
    return 2
