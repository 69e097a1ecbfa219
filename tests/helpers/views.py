"""Helpers for the CUDA_HOME view tests (tests/test_view*.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from helpers.toolkits import make_toolkit


def pip_like(base: Path, version: str = "13.0.88") -> Path:
    """A toolkit laid out like ``site-packages/nvidia/cu13``: ``lib/`` with only
    ``libcudart.so.13`` (no lib64, no stubs), ``curand.h`` present."""
    root = make_toolkit(base / "site" / "nvidia" / "cu13", version, lib64=False, curand=True)
    (root / "lib").mkdir()
    (root / "lib" / "libcudart.so.13").write_text("")
    return root


def dynamic_section(path: str) -> str:
    """``readelf -d`` of ``path`` ('' when readelf is absent)."""
    if not shutil.which("readelf"):
        return ""
    return subprocess.run(["readelf", "-d", path], capture_output=True, text=True, timeout=60).stdout


def tmp_dirs(parent: str | os.PathLike) -> list[str]:
    """Leftover ``.tmp-*`` build directories under ``parent``."""
    try:
        return sorted(n for n in os.listdir(parent) if n.startswith(".tmp-"))
    except FileNotFoundError:
        return []


def can_unshare() -> str | None:
    """``None`` when ``unshare -m`` with a tmpfs mount works here, else why not."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return "needs root and unshare(1) for a private mount namespace"
    try:
        rc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                             "mount -t tmpfs none /mnt"], capture_output=True, timeout=30).returncode
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    return None if rc == 0 else "private mount namespaces are not available here"
