"""Helpers for the untrusted-input tests: an untrusted nvcc, toolkits whose nvcc is any script
(wrappers are ``helpers.toolkits.script``), and files or directories another user controls."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.toolkits import script

RELEASE_LINE = "Cuda compilation tools, release 13.0, V13.0.88"


def untrusted_nvcc(tmp: Path) -> tuple[Path, Path]:
    """``tmp/evil/nvcc`` (and a copy ``nvcc.sh``) in a world-writable directory
    (anyone could have put it there); running it creates ``tmp/RAN``.
    Returns (nvcc, marker)."""
    evil = tmp / "evil"
    evil.mkdir()
    evil.chmod(0o777)
    marker = tmp / "RAN"
    nvcc = script(evil / "nvcc", f'#!/bin/sh\necho "{RELEASE_LINE}"\n/usr/bin/touch {marker}\n')
    script(evil / "nvcc.sh", nvcc.read_text())  # the same, under a name that does not end in /nvcc
    return nvcc, marker


def toolkit_with_nvcc(root: Path, nvcc_text: str, header: str = "13.0") -> Path:
    """A toolkit prefix without version files whose ``bin/nvcc`` is ``nvcc_text``,
    so ``inspect`` falls back to running ``nvcc --version``."""
    script(root / "bin" / "nvcc", nvcc_text)
    (root / "include").mkdir()
    hmaj, hmin = header.split(".")
    (root / "include" / "cuda_runtime_api.h").write_text(
        f"#define CUDART_VERSION {int(hmaj) * 1000 + int(hmin) * 10}\n")
    return root


def tmp_is_trusted(tmp: Path) -> bool:
    """pytest's tmp dirs pass the trust rule (owned by us, not writable by others)."""
    from flashinfer_sm120.safety.ownership import trust_reason

    return trust_reason(str(tmp), absent_ok=False) is None and os.geteuid() == tmp.stat().st_uid


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
