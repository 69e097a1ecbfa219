"""Helpers for the probe/trust/state tests: hostile nvcc scripts, another uid (and a home of theirs),
private mount namespaces, and a /proc scan for processes left behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.toolkits import script

#: An uid/gid with (normally) no passwd entry, used as "another user".
OTHER_UID = 54321
#: The ``nobody`` uid: another user who owns a home (``sudo -E`` with their ``HOME``).
NOBODY = 65534

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to own files as another uid)")


def hostile_toolkit(root: Path, body: str, *, header: str = "13.0") -> Path:
    """A toolkit without version files, so its nvcc is reached through the
    ``nvcc --version`` fallback; ``body`` is the shell script after ``#!/bin/sh``."""
    (root / "bin").mkdir(parents=True)
    script(root / "bin" / "nvcc", "#!/bin/sh\n" + textwrap.dedent(body))
    (root / "include").mkdir()
    hmaj, hmin = header.split(".")
    (root / "include" / "cuda_runtime_api.h").write_text(
        f"#define CUDART_VERSION {int(hmaj) * 1000 + int(hmin) * 10}\n")
    return root


def waits_for_lock(pid: int, path) -> bool:
    """Whether process ``pid`` is blocked on a file lock of ``path``: a waiter line of ``/proc/locks``
    (``1: -> FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF``), the lock's own record."""
    st = os.stat(path)
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with open("/proc/locks") as fh:
        return any(w[1:2] == ["->"] and str(pid) in w and want in w for w in map(str.split, fh))


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


@contextlib.contextmanager
def reachable_dir() -> Iterator[Path]:
    """A new directory every uid can enter (``/tmp/fi-sm120-test-*``, 0755; pytest's ``tmp_path`` lies
    under a 0700 level), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="fi-sm120-test-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def lock_held_as(uid: int, path: Path) -> Iterator[subprocess.Popen]:
    """``flock -x path`` held by a process of ``uid`` (the file opened read-only, as any reader can)
    until the block ends; yields once ``/proc/locks`` shows it."""
    need_root()
    from flashinfer_sm120.safety.fs.proclocks import holders

    proc = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                             "flock", "-x", "--close", str(path), "sleep", "300"], start_new_session=True)
    try:
        for _ in range(400):
            if any(h.uid == uid for h in holders(path)) or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"flock as uid {uid} could not take {path} (exit {proc.returncode})"
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # flock and its sleep
        proc.wait()
        for _ in range(400):  # the sleep, not waited for here, may still be exiting
            if not holders(path):
                break
            time.sleep(0.05)


def user_home(base: Path, uid: int = NOBODY) -> Path:
    """``base/home``, owned by ``uid`` (mode 755)."""
    home = base / "home"
    home.mkdir()
    os.chown(home, uid, uid)
    home.chmod(0o755)
    return home


def home_env(home: Path, tmpdir: Path, **extra) -> dict:
    """This environment with ``HOME=home``, ``TMPDIR=tmpdir`` (made, mode 1777) and no cache or
    toolkit variables: a command run as root with another user's ``HOME``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLASHINFER_SM120_CACHE_DIR", "XDG_CACHE_HOME", "CUDA_HOME", "CUDA_PATH")}
    tmpdir.mkdir(exist_ok=True)
    tmpdir.chmod(0o1777)
    env.update(HOME=str(home), TMPDIR=str(tmpdir), FLASHINFER_SM120_QUIET="1", **extra)
    return env


def created(*roots: Path) -> list[str]:
    """Everything under ``roots``, sorted."""
    return sorted(str(p) for r in roots for p in r.rglob("*"))
