"""Helpers for the deployment tests (autoload, environ, examples)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import SRC

PTH_NAME = "flashinfer_sm120_autoload.pth"


def base_python() -> str:
    """The interpreter this venv was made from (a venv of it sees no torch/flashinfer)."""
    for cand in (os.path.join(sys.base_prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}"),
                 os.path.join(sys.base_prefix, "bin", "python3")):
        if os.access(cand, os.X_OK):
            return cand
    return sys.executable


def make_venv(path: Path) -> Path:
    """A bare venv (no pip, no packages): its python, whose purelib is empty."""
    subprocess.run([base_python(), "-m", "venv", "--without-pip", str(path)], check=True,
                   capture_output=True, timeout=120)
    return path / "bin" / "python"


def purelib(python: Path | str) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


def fake_package(root: Path, name: str, body: str = "") -> Path:
    """``root/name/__init__.py`` with ``body``."""
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "__init__.py").write_text(textwrap.dedent(body))
    return root


def copy_package(dst: Path) -> Path:
    """A copy of this checkout's flashinfer_sm120 under ``dst`` (to break on purpose)."""
    shutil.copytree(SRC / "flashinfer_sm120", dst / "flashinfer_sm120",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def env_without(*names: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update(extra)
    return env
