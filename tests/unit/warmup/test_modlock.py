"""FlashInfer's per-module lock: a wait for a process of ours is told, a holder of another uid is not
waited for (its pid, its uid and the fix), and FlashInfer's own writers still take turns with us."""

from __future__ import annotations

import pytest
from filelock import FileLock

from flashinfer_sm120.errors import PlaceError
from flashinfer_sm120.warmup import moddir
from helpers.probing import lock_held_as, reachable_dir


def test_a_wait_for_our_own_holder_is_told_and_ends_when_it_lets_go(tmp_path):
    path = tmp_path / "tmp" / "sampling.lock"  # FlashInfer's JitSpec.lock_path in its JIT dir
    path.parent.mkdir()
    theirs = FileLock(str(path), thread_local=False)  # what a server building it holds
    theirs.acquire()
    said: list[str] = []

    def say(line):
        said.append(line)
        if len(said) == 2:  # told at once, and again after `every`
            theirs.release()

    with moddir.held(path, "sampling", say, every=0.0, poll=0.01):
        assert len(said) == 2 and str(path) in said[0] and "waiting for another process" in said[0]
        assert moddir.try_take(path) is None  # ours now
    assert (again := moddir.try_take(path)) is not None
    again.release()


def test_a_lock_held_by_another_uid_is_refused_at_once():
    """A module lock another uid holds is refused at once, with a word, instead of waited on without
    end (P8)."""
    said: list[str] = []
    with reachable_dir() as d:
        path = d / "tmp" / "sampling.lock"
        path.parent.mkdir(mode=0o755)
        path.write_text("")
        path.chmod(0o644)
        with lock_held_as(4321, path) as proc, pytest.raises(PlaceError) as err:
            with moddir.held(path, "sampling", said.append, poll=0.01):
                pass
    text = str(err.value)
    assert f"pid {proc.pid}" in text and "uid 4321" in text and "FLASHINFER_WORKSPACE_BASE" in text, text
    assert said == []
