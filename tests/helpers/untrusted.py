"""Helpers for the attack tests: an untrusted nvcc and wrappers that reach it, and files or
directories another user controls."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

RELEASE_LINE = "Cuda compilation tools, release 13.0, V13.0.88"


def untrusted_nvcc(tmp: Path) -> tuple[Path, Path]:
    """``tmp/evil/nvcc`` (and a copy ``nvcc.sh``) in a world-writable directory
    (anyone could have put it there); running it creates ``tmp/RAN``.
    Returns (nvcc, marker)."""
    evil = tmp / "evil"
    evil.mkdir()
    evil.chmod(0o777)
    marker = tmp / "RAN"
    nvcc = evil / "nvcc"
    nvcc.write_text(f'#!/bin/sh\necho "{RELEASE_LINE}"\n/usr/bin/touch {marker}\n')
    nvcc.chmod(0o755)
    script = evil / "nvcc.sh"  # the same, under a name that does not end in /nvcc
    script.write_text(nvcc.read_text())
    script.chmod(0o755)
    return nvcc, marker


def wrapper(bin_dir: Path, name: str, text: str) -> Path:
    """An executable file ``bin_dir/name`` (a trusted place: the test's own tmp dir)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    p = bin_dir / name
    p.write_text(text)
    p.chmod(0o755)
    return p


def toolkit_with_nvcc(root: Path, nvcc_text: str, header: str = "13.0") -> Path:
    """A toolkit prefix without version files whose ``bin/nvcc`` is ``nvcc_text``,
    so ``inspect`` falls back to running ``nvcc --version``."""
    wrapper(root / "bin", "nvcc", nvcc_text)
    (root / "include").mkdir()
    hmaj, hmin = header.split(".")
    (root / "include" / "cuda_runtime_api.h").write_text(
        f"#define CUDART_VERSION {int(hmaj) * 1000 + int(hmin) * 10}\n")
    return root


def tmp_is_trusted(tmp: Path) -> bool:
    """pytest's tmp dirs pass the trust rule (owned by us, not writable by others)."""
    from flashinfer_sm120.safety.ownership import check_path

    return check_path(str(tmp)) is None and os.geteuid() == tmp.stat().st_uid


def give_away(path: Path, uid: int = 4321) -> None:
    """Make ``path`` another user's (``uid``, gid the same); skips the test without root."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file or directory to another uid")
    os.chown(path, uid, uid)


def make_unsafe(directory: Path, how: str) -> None:
    """``how``: ``"world-writable"`` (mode 0777) or ``"another user's"`` (owned by uid 4321, 0755)."""
    if how == "world-writable":
        directory.chmod(0o777)
    else:
        give_away(directory)
        directory.chmod(0o755)
