"""``cache prune`` where ``/proc`` cannot show who uses a cache entry removes nothing in use (P3).

With no ``/proc`` (a sandbox, a container without it) or a ``/proc`` of another PID namespace (prune
run from a sidecar container sharing the cache volume, not the server's processes), an in-use check
would find nobody; ``cache prune --yes`` must still keep views and JIT workspaces that running
servers use: an empty answer never counts as "nobody".
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from helpers.child import cli
from helpers.prune import listing

from flashinfer_sm120.diagnose import prune


def test_a_proc_without_this_process_means_blind_not_unused(monkeypatch):
    assert prune.held_paths() is not None  # this process is visible here
    monkeypatch.setattr(os, "getpid", lambda: 2**22 + 7)  # as from another PID namespace
    assert prune.held_paths() is None
    assert prune.holder(object(), None) == prune.BLIND  # type: ignore[arg-type]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for a private /proc")
def test_prune_without_proc_removes_nothing(caches):
    c = caches
    stale = c["ws"]["release gone"]
    assert listing(c)[str(stale)]["reason"]  # stale: prune would remove it
    script = 'mount -t tmpfs none /proc && exec "$@"'
    proc = cli(["cache", "prune", "--yes"], c["env"], 300, python=sys.executable,
               prefix=["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in out, out[-3000:]
    assert stale.exists(), out[-3000:]
    assert "/proc does not show this process" in out


def test_a_lock_that_cannot_be_opened_is_not_free(tmp_path, monkeypatch):
    """``lock_free`` answered "free" for any ``open`` error: with no descriptor left (``EMFILE``)
    prune saw every builder's lock as free."""
    import errno

    lock = tmp_path / "m.lock"
    lock.write_text("")
    assert prune.lock_free(str(lock)) and prune.lock_free(str(tmp_path / "absent.lock"))
    real = os.open

    def no_fds(path, *a, **k):
        if str(path) == str(lock):
            raise OSError(errno.EMFILE, "Too many open files")
        return real(path, *a, **k)

    monkeypatch.setattr(os, "open", no_fds)
    assert not prune.lock_free(str(lock))
