"""argparse types for CLI numbers: finite, bounded, naming the flag when refused."""
# threat-model: P6, P8 (command-line values parsed once, bounded, named with their fix)

from __future__ import annotations

import argparse
import math
import re


from flashinfer_sm120.safety.formats.base import shown


def _number(flag: str, text: str, convert, lo, hi, what: str):
    try:
        value = convert(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"{flag} {shown(text, 40)} is not {what}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{flag} {shown(text, 40)} is not a finite number")
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(f"{flag} {shown(text, 40)} is out of range: give {what} "
                                         f"from {lo:g} to {hi:g}")
    return value


def cli_int(flag: str, lo: int = 1, hi: int = 1024):
    """An argparse ``type=`` for an integer in ``[lo, hi]``, naming ``flag`` when refused."""
    def convert(text: str) -> int:
        return _number(flag, text, int, lo, hi, "a whole number")
    convert.__name__ = flag  # argparse names the type in some messages
    return convert


def cli_float(flag: str, lo: float, hi: float):
    """An argparse ``type=`` for a finite number in ``[lo, hi]`` (``nan``, ``inf``,
    ``1e999`` and negatives refused), naming ``flag``."""
    def convert(text: str) -> float:
        return _number(flag, text, float, lo, hi, "a number")
    convert.__name__ = flag
    return convert


_SIZE_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B?|B)?", re.I)
_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def cli_size(flag: str, lo: int = 1, hi: int = 1 << 50):
    """An argparse ``type=`` for a byte size (``512M``, ``4GiB``, ``1000``), naming ``flag``."""
    def convert(text: str) -> int:
        m = _SIZE_RE.fullmatch(text.strip()) if isinstance(text, str) and len(text) < 40 else None
        if not m:
            raise argparse.ArgumentTypeError(f"{flag} {shown(text, 40)} is not a size such as 512M or 4G")
        value = int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "")[:1].upper()])
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{flag} {shown(text, 40)} is out of range ({lo} to {hi} bytes)")
        return value
    convert.__name__ = flag
    return convert
