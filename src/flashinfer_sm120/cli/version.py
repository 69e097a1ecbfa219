"""``flashinfer-sm120 --version``: this package, Python, FlashInfer, torch and its CUDA, and the nvcc
that would be chosen, as ``collect_env`` tools print them.  Every part is read on its own, so a
missing or broken one is named and the rest still prints."""

from __future__ import annotations

import argparse
import os
import re
import sys

__all__ = ["version_lines", "VersionAction"]


def _dist(name: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(name)
    except Exception:
        return None


def _torch_cuda() -> str:
    """torch's CUDA, read from ``torch/version.py`` (importing torch takes seconds)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
        where = list(spec.submodule_search_locations or ()) if spec else []
        text = open(os.path.join(where[0], "version.py"), encoding="utf-8").read() if where else ""
    except (OSError, ImportError, ValueError, IndexError):
        return "CUDA unknown"
    m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return f"CUDA {m.group(1)}" if m else "CPU build"


def _nvcc() -> str:
    """The nvcc flashinfer-sm120 chooses: from the last recorded status when it still holds, else resolved."""
    try:
        from flashinfer_sm120.core.patch.lastcheck import load

        got = load()
        tk = (got.status or {}).get("toolkit") if got.status else None
        if tk:
            return f"nvcc {tk['nvcc_full']} at {tk['root']} (chosen)"
        from flashinfer_sm120.core.patch import resolve

        res = resolve(guard=True)
        if res.choice is None:
            return f"nvcc: none fits ({res.fix or 'flashinfer-sm120 doctor'})"
        return f"nvcc {res.choice.toolkit.nvcc_full} at {res.choice.toolkit.root} (chosen)"
    except Exception as exc:
        return f"nvcc: unknown ({type(exc).__name__}: {exc})"[:300]


def version_lines() -> list[str]:
    """One line per component; never raises."""
    from flashinfer_sm120 import __version__

    lines = [f"flashinfer-sm120 {__version__} ({os.path.dirname(os.path.dirname(os.path.abspath(__file__)))})",
             f"Python {sys.version.split()[0]} ({sys.executable})"]
    fi = _dist("flashinfer-python")
    lines.append(f"FlashInfer {fi}" if fi else "FlashInfer: not installed (pip install flashinfer-python)")
    torch = _dist("torch")
    lines.append(f"torch {torch} ({_torch_cuda()})" if torch else "torch: not installed")
    lines.append(_nvcc())
    return lines


class VersionAction(argparse.Action):
    """``--version``: print :func:`version_lines` and exit 0."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print("\n".join(version_lines()))
        parser.exit(0)
