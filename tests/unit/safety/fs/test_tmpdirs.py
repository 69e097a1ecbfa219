"""``kill -9``: temporary directories of a killed process are swept by the next one (P5, P6).

A build makes its scratch directory in one; ``kill -9`` or the OOM killer skip the clean-up, so without
the sweep each killed run would leave its directory in ``$TMPDIR`` for good.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest

from helpers import abandoned
from helpers.untrusted import give_away, make_unsafe
from flashinfer_sm120.errors import PlaceError
from flashinfer_sm120.safety.fs import atomic

KILLED = """
import os, signal, sys
from flashinfer_sm120.safety.fs import atomic
print(atomic.make_private("flashinfer-sm120-killed-").path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    return tmp_path


def test_what_a_killed_build_left_is_swept_by_the_next(tmpdir_env):
    proc = subprocess.run([sys.executable, "-c", KILLED], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TMPDIR=str(tmpdir_env)))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    left = proc.stdout.strip()
    assert os.path.isdir(left) and left.startswith(str(tmpdir_env))
    abandoned(left)  # older than the grace a maker has to lock its directory
    atomic.make_private("flashinfer-sm120-killed-").close()
    assert not os.path.exists(left)
    assert not os.listdir(tmpdir_env)


def test_a_live_makers_directory_and_a_fresh_one_are_kept(tmpdir_env):
    live = atomic.make_private("x-")
    abandoned(live.path)
    fresh = tempfile.mkdtemp(prefix="x-")  # not locked yet, but younger than the grace
    other = tmpdir_env / "x-link"
    os.symlink("/etc", other)  # never followed, never removed
    atomic.sweep("x-")
    assert os.path.isdir(live.path) and os.path.isdir(fresh) and os.path.islink(other)
    live.close()
    assert not os.path.exists(live.path)
    abandoned(fresh)
    atomic.sweep("x-")
    assert not os.path.exists(fresh) and os.path.isdir("/etc")


def test_temporary_files_follow_the_same_rule(tmpdir_env):
    """The atomic writer's temporary files: a killed writer's is swept, a live writer's (held), a
    fresh one, another uid's, a link and a FIFO are kept, and a FIFO never blocks the sweep."""
    target = tmpdir_env / "state.json"
    prefix = atomic.temp_prefix(str(target))
    dead, live, fresh = (tmpdir_env / (prefix + n) for n in ("dead", "live", "fresh"))
    for p in (dead, live, fresh):
        p.write_text("{")
    fd = os.open(live, os.O_RDONLY)
    atomic.hold(fd)
    fifo = tmpdir_env / (prefix + "fifo")
    os.mkfifo(fifo)
    link = tmpdir_env / (prefix + "link")
    link.symlink_to(dead)
    abandoned(dead, live, fifo, link)
    try:
        atomic.write_atomic(str(target), b"{}")  # sweeps its own leftovers first
        assert not dead.exists() and live.exists() and fresh.exists() and fifo.exists() and link.is_symlink()
    finally:
        os.close(fd)
    atomic.sweep(prefix, str(tmpdir_env))
    assert not live.exists() and target.read_bytes() == b"{}"
    theirs = tmpdir_env / (prefix + "theirs")
    theirs.write_text("{")
    give_away(theirs, 65534)
    abandoned(theirs)
    atomic.sweep(prefix, str(tmpdir_env))
    assert theirs.exists()


@pytest.mark.parametrize("how", ["world-writable", "another user's"])
def test_nothing_is_made_in_a_temporary_directory_another_uid_may_change(tmpdir_env, how):
    """A build makes no scratch files in a TMPDIR another uid can change (not sticky) (P4, P5)."""
    theirs = tmpdir_env / "theirs"
    theirs.mkdir()
    os.environ["TMPDIR"] = str(theirs)
    make_unsafe(theirs, how)
    with pytest.raises(PlaceError) as err:
        atomic.make_private("x-")
    assert str(theirs) in str(err.value) and "Fix: set TMPDIR" in str(err.value)
    assert os.listdir(theirs) == []
