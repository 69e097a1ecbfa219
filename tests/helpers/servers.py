"""Helpers for the server tests: the stand-in packages, fake ninjas, a system bin without some tools."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from helpers import TESTS
from helpers.toolkits import script

STANDINS = TESTS / "standins"
DIST_INFO = {"vllm": "vllm-0.34.0.dist-info", "sglang": "sglang-0.5.23.dist-info"}


def install_standins(site_dir: Path, *names: str) -> Path:
    """Copy the stand-in packages ``names`` (and their dist-info) into ``site_dir``."""
    site_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copytree(STANDINS / name, site_dir / name, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(STANDINS / DIST_INFO[name], site_dir / DIST_INFO[name])
    return site_dir


def system_bin_without(dst: Path, *names: str) -> Path:
    """``dst`` holding a link to every program of ``/usr/bin`` except ``names``: this machine's
    system PATH as it is on a machine without them (e.g. without Debian's ninja-build)."""
    dst.mkdir(parents=True, exist_ok=True)
    for entry in os.scandir("/usr/bin"):
        if entry.name not in names and not (dst / entry.name).exists():
            os.symlink(entry.path, dst / entry.name)
    return dst


def fake_ninja(path: Path, version: str, real: str | None = None) -> Path:
    """A ``ninja`` script printing ``version`` for ``--version``; anything else runs ``real``
    (or fails)."""
    rest = f'exec {real} "$@"' if real else "exit 3"
    return script(path, f'#!/bin/sh\nif [ "$1" = --version ]; then echo {version}; exit 0; fi\n{rest}\n')


def wheel_ninja() -> str | None:
    """The ``ninja`` wheel's binary in this test environment, if installed."""
    from flashinfer_sm120.core.toolkit import ninja

    found = ninja._wheel(None)
    return found[0][0] if found else None
