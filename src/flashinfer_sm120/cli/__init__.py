"""flashinfer-sm120: make FlashInfer JIT-build for the right GPUs with the right nvcc.

Commands: doctor (what was found and chosen), build (JIT-build kernels now),
enable/disable (import flashinfer_sm120 in every Python process)."""

from __future__ import annotations

import argparse

from .. import __version__
from . import build, doctor, enable
from .build import MODULES

__all__ = ["main", "MODULES"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``flashinfer-sm120`` command; returns the exit status."""
    parser = argparse.ArgumentParser(prog="flashinfer-sm120", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    doctor.add_parser(sub)
    build.add_parser(sub)
    enable.add_parsers(sub)
    args = parser.parse_args(argv)
    return args.func(args)
