"""``cache prune`` removes nothing in use (P3): races with builds that start after the scan, a view a
kept workspace builds with, and directories it cannot read."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.prune import hold

OLD_DAYS = 100


def _age(*paths: Path) -> None:
    old = time.time() - OLD_DAYS * 86400
    for top in paths:
        for p in [top, *Path(top).rglob("*")]:
            os.utime(p, (old, old), follow_symlinks=False)


def _current_aged(c) -> Path:
    """The current workspace, and everything else, last used 100 days ago."""
    _age(c["fi_root"], Path(c["keep_view"]))
    return c["ws"]["current"]


def _scan_then(c, act):
    """``cache prune --older-than 30 --yes`` split at its seam: scan, ``act()`` (what another
    process does meanwhile), remove."""
    from flashinfer_sm120.diagnose import prune as pr
    from flashinfer_sm120.safety.fs import statedir

    statedir.forget_cache_root()
    report = pr.scan(30)
    stale = {e.path for e in report["entries"] if e.reason and not e.kept}
    held = act()
    try:
        pr.remove(report)
    finally:
        if held is not None:
            held.kill()
            held.wait()
    return stale


def test_a_build_that_takes_its_lock_after_the_scan_keeps_its_workspace(caches):
    """FlashInfer holds ``cached_ops/tmp/<module>.lock`` while it builds and loads a module; a module
    first built after the scan had a lock the scan never saw, and ``--yes`` removed the workspace
    under the build."""
    c = caches
    ws = _current_aged(c)
    stale = _scan_then(c, lambda: hold(str(ws / "cached_ops" / "tmp" / "new_module.lock")))
    assert str(ws) in stale  # it was stale at the scan
    assert ws.is_dir() and (ws / "cached_ops" / "sampling" / "sampling.so").is_file()


def test_a_process_that_starts_working_in_it_after_the_scan_keeps_it(caches):
    c = caches
    ws = _current_aged(c)
    d = ws / "cached_ops" / "sampling"

    def start():
        p = subprocess.Popen([sys.executable, "-c", "import time; print('ok', flush=True); time.sleep(120)"],
                             cwd=d, stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ok"
        return p

    stale = _scan_then(c, start)
    assert str(ws) in stale and d.is_dir()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_a_workspace_another_user_left_unreadable_is_listed_not_a_traceback():
    """A root server's workspace inside a user's cache (``cached_ops`` mode 0700, owned by root):
    ``cache prune`` and ``doctor``'s caches section ended in PermissionError."""
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="attack3-prune-"))  # reachable by uid 12345 (pytest's is not)
    try:
        _unreadable_workspace(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _unreadable_workspace(tmp_path: Path) -> None:
    home = tmp_path / "home"
    base = home / "base" / ".cache" / "flashinfer" / "0.7.4" / "120f"
    (base / "cached_ops").mkdir(parents=True)
    (tmp_path / "ours").mkdir()
    for d in [tmp_path / "ours", home, *[p for p in base.parents if str(p).startswith(str(home))], base]:
        os.chown(d, 12345, 12345)
    os.chmod(tmp_path, 0o755)
    os.chmod(base / "cached_ops", 0o700)  # root's
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHINFER", "CUDA_", "SGLANG"))}
    env.update(HOME=str(home), FLASHINFER_SM120_CACHE_DIR=str(tmp_path / "ours"),
               FLASHINFER_WORKSPACE_BASE=str(home / "base"), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(["setpriv", "--reuid=12345", "--regid=12345", "--clear-groups", sys.executable, "-m",
                           "flashinfer_sm120", "cache", "prune", "--yes"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert str(base) in proc.stdout and (base / "cached_ops").is_dir()
