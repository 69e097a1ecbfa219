"""``doctor`` on deep trees stays bounded (P6): ``os.walk`` (Python < 3.12) recurses once per directory level,
so a tree 1,500 levels deep must not end in a ``RecursionError``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flashinfer_sm120.diagnose.tree import walk_tree

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
    """:func:`_deep`, and every tree it made removed at the end (by ``rm -r``), pass or fail: pytest's own clean-up
    of old tmp dirs uses ``shutil.rmtree``, which this depth breaks before Python 3.13, so a tree left
    behind would end a later test run in a RecursionError."""
    made = []

    def make(top) -> None:
        made.append(os.path.join(str(top), "a"))
        _deep(str(top))

    yield make
    for path in made:
        subprocess.run(["rm", "-rf", "--one-file-system", path], check=True)


def test_walk_tree_enters_no_link(tmp_path, deep):
    target = tmp_path / "target"
    target.mkdir()
    top = tmp_path / "top"
    top.mkdir()
    (top / "d").mkdir()
    os.symlink(target, top / "d" / "to-target")
    os.symlink(target, top / "to-target")
    _deep(str(top / "d"), 50)
    seen = [d for d, _dirs, _files in walk_tree(str(top))]
    assert not any("to-target" in d for d in seen) and len(seen) == 52
    (tmp_path / "deep").mkdir()
    deep(tmp_path / "deep")
    assert sum(1 for _ in walk_tree(str(tmp_path / "deep"))) == DEPTH + 1
    assert sys.getrecursionlimit() <= 10_000  # nothing raised it to get there


def test_doctor_counts_cubins_beside_a_tree_deeper_than_the_recursion_limit(tmp_path, deep):
    """``cubin_summary`` walked ``FLASHINFER_CUBIN_DIR`` with ``os.walk``: a RecursionError on Python < 3.12."""
    from flashinfer_sm120.diagnose.verify import inventory

    (tmp_path / "x.cubin").write_bytes(b"not an ELF file")
    deep(tmp_path)
    summary = inventory.cubin_summary(str(tmp_path), [("GPU 0 (12.0)", (12, 0))])
    assert summary["cubins"] == 1 and summary["unreadable"] == 1
