"""The arch list a command was given (``--arch``): exported as ``FLASHINFER_CUDA_ARCH_LIST`` before FlashInfer
loads, and named as typed in the messages of that command."""

from __future__ import annotations

import os

from flashinfer_sm120.core.facts.arch import parse_arch_list
from flashinfer_sm120.safety.formats.base import shown

#: ``(as typed, as exported)`` by :func:`export_arch_list`, so messages name the ``--arch`` the user typed.
_option: tuple[str, str] | None = None


def export_arch_list(value: str | None) -> None:
    """Export ``--arch`` as ``FLASHINFER_CUDA_ARCH_LIST`` before FlashInfer loads (``None``: leave it)."""
    global _option
    if value is None:
        return
    listed = " ".join(f"{s.major}.{s.minor}{s.suffix or ''}" for s in parse_arch_list(value, source="--arch"))
    os.environ["FLASHINFER_CUDA_ARCH_LIST"], _option = listed, (value, listed)


def named(listed: str | None = None) -> str:
    """How a message names the arch list: ``--arch '99', read as 9.9`` while the variable holds what this
    command's ``--arch`` exported, else ``FLASHINFER_CUDA_ARCH_LIST='9.9'``; the bare name without ``listed``."""
    if _option is not None and os.environ.get("FLASHINFER_CUDA_ARCH_LIST") == _option[1]:
        if listed is None:
            return "--arch"
        return f"--arch {shown(_option[0], 80)}" + (f", read as {listed}" if _option[0].strip() != listed else "")
    return "FLASHINFER_CUDA_ARCH_LIST" if listed is None else f"FLASHINFER_CUDA_ARCH_LIST='{listed}'"


def assigned(entries: str) -> str:
    """How a fix writes an arch list: ``--arch 9.9a`` for a command given ``--arch``, else the variable."""
    return f"--arch {entries}" if named() == "--arch" else f"FLASHINFER_CUDA_ARCH_LIST='{entries}'"
