"""Helpers for the probe/trust/state tests: hostile nvcc scripts, another uid,
private mount namespaces, and a /proc scan for processes left behind."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: An uid/gid with (normally) no passwd entry, used as "another user".
OTHER_UID = 54321


def hostile_toolkit(root: Path, body: str, *, header: str = "13.0") -> Path:
    """A toolkit without version files, so its nvcc is reached through the
    ``nvcc --version`` fallback; ``body`` is the shell script after ``#!/bin/sh``."""
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    nvcc.chmod(0o755)
    (root / "include").mkdir()
    hmaj, hmin = header.split(".")
    (root / "include" / "cuda_runtime_api.h").write_text(
        f"#define CUDART_VERSION {int(hmaj) * 1000 + int(hmin) * 10}\n")
    return root


def alive_with(token: str) -> list[int]:
    """Pids (not zombies) whose command line contains ``token``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
            with open(f"/proc/{name}/stat", "rb") as fh:
                st = fh.read()
        except OSError:
            continue
        state = st[st.rfind(b")") + 2: st.rfind(b")") + 3]
        if token in cmd and state not in (b"Z", b"X"):
            out.append(int(name))
    return out


def kill_all_with(token: str) -> None:
    for pid in alive_with(token):
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def need_root() -> None:
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to act as another uid (setpriv --reuid)")


def as_uid(uid: int, argv: list[str], env: dict, timeout: float = 120, cwd: str | None = None):
    """Run ``argv`` as ``uid`` (gid = uid, no supplementary groups)."""
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv],
                          env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def unshare_ok() -> bool:
    if not shutil.which("unshare"):
        return False
    try:
        r = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True,
                           timeout=30)
    except Exception:
        return False
    return r.returncode == 0


def in_namespace(script: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a bash ``script`` in a private mount namespace (mounts vanish with it)."""
    return subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-ec", script],
                          env=env, capture_output=True, text=True, timeout=timeout)


PY = sys.executable
