"""flashinfer-sm120: make FlashInfer JIT-build for the right GPUs with the right nvcc.

Commands: doctor (what was found and chosen), build (JIT-build kernels now),
enable/disable (import flashinfer_sm120 in every Python process)."""

from __future__ import annotations

import argparse

import importlib

from .. import __version__
from . import enable

try:
    from .build import MODULES
except Exception:  # a broken install: 'disable' must still work
    MODULES = {}

__all__ = ["main", "MODULES"]


def _broken_parser(sub, name: str, exc: BaseException) -> None:
    def fail(_args) -> int:
        from .common import err

        return err(f"'{name}' is unavailable: this install is broken ({exc!r}); "
                   f"pip install --force-reinstall flashinfer-sm120")

    p = sub.add_parser(name, help=f"unavailable: {exc!r}", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=fail)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``flashinfer-sm120`` command; returns the exit status."""
    parser = argparse.ArgumentParser(prog="flashinfer-sm120", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("doctor", "build"):
        try:  # imported here so that enable/disable work with the rest of the package broken
            importlib.import_module(f".{name}", __name__).add_parser(sub)
        except Exception as exc:
            _broken_parser(sub, name, exc)
    enable.add_parsers(sub)
    args = parser.parse_args(argv)
    return args.func(args)
