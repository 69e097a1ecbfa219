"""``cache prune`` and ``doctor`` on deep trees stay bounded and tell what they did (P6, P8).

``os.walk`` (Python < 3.12) and ``shutil.rmtree`` (< 3.13) recurse once per directory level, so a
JIT directory holding a tree 1,500 levels deep must not end ``cache prune`` in a ``RecursionError``
traceback (nor make ``doctor`` say "caches: could not be checked").
"""

from __future__ import annotations

import os
import sys

import pytest

from helpers.prune import listing, prune

from flashinfer_sm120.diagnose.tree import remove_tree, walk_tree

DEPTH = 1500  # past Python's default recursion limit of 1000


def _deep(top, depth=DEPTH) -> None:
    """``top/a/a/.../a`` ``depth`` levels deep (made level by level: the path is longer than PATH_MAX
    at the bottom) with a file and a symlink at the bottom."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("a", dir_fd=fd)
            new = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = new
        with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "w") as fh:
            fh.write("x" * 5000)
        os.symlink("/etc", "link", dir_fd=fd)
    finally:
        os.close(fd)


@pytest.fixture
def deep():
    """:func:`_deep`, and every tree it made removed at the end, pass or fail: pytest's own clean-up of
    old tmp dirs uses ``shutil.rmtree``, which this depth breaks before Python 3.13, so a tree left
    behind would end a later test run in a RecursionError."""
    made = []

    def make(top) -> None:
        made.append(os.path.join(str(top), "a"))
        _deep(str(top))

    yield make
    for path in made:
        if os.path.lexists(path):
            remove_tree(path)


def test_prune_sizes_and_removes_a_tree_deeper_than_the_recursion_limit(caches, deep):
    c = caches
    stale, current = c["ws"]["release gone"], c["ws"]["current"]
    deep(stale / "cached_ops" / "sampling")
    deep(current / "cached_ops" / "sampling")
    got = listing(c)
    assert got[str(stale)]["reason"] and got[str(current)]["reason"] is None
    proc = prune(c, "--yes")
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and proc.returncode == 0, out[-3000:]
    assert not stale.exists()
    assert (current / "cached_ops" / "sampling" / "a").is_dir()  # kept whole
    assert os.path.isdir("/etc")  # the link at the bottom was unlinked, not followed


def test_remove_tree_follows_no_link_and_walk_tree_enters_none(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("keep")
    top = tmp_path / "top"
    top.mkdir()
    (top / "d").mkdir()
    os.symlink(target, top / "d" / "to-target")
    os.symlink(target, top / "to-target")
    _deep(str(top / "d"), 50)
    seen = [d for d, _dirs, _files in walk_tree(str(top))]
    assert not any("to-target" in d for d in seen) and len(seen) == 52
    remove_tree(str(top))
    assert not top.exists() and (target / "keep").read_text() == "keep"
    assert sys.getrecursionlimit() <= 10_000  # nothing raised it to get there


def test_an_entry_another_prune_removed_first_is_not_a_failure(caches):
    """Two ``cache prune --yes`` at once: each reported FAILED ("changed since the scan") for what the
    other removed, and both exited 1, though everything stale was gone."""
    import shutil

    from flashinfer_sm120.diagnose import prune as prune_mod

    report = prune_mod.scan()
    stale = [e for e in report["entries"] if e.reason and not e.kept]
    assert stale
    for e in stale:  # the other prune got there first
        for p in e.remove:
            shutil.rmtree(p)
    prune_mod.remove(report)
    assert not [e.error for e in stale if e.error], [e.error for e in stale]
    for e in stale:
        assert e.removed and "another process" in e.reason, (e.kind, e.removed, e.kept, e.remove)
