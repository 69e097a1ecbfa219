"""What the tests share: child processes (``child``), fake toolkits and scripts (``toolkits``), what this
host has (``host``), fake GPUs and servers, other users, cgroups, the fork server; ``tests/conftest.py``
holds the fixtures.  Test files import from here, never from each other or from conftest."""

from pathlib import Path

#: The tests folder (on ``sys.path`` in the tests, so ``helpers`` imports), the checkout, its sources.
TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
SRC = ROOT / "src"


def abandoned(*paths) -> None:
    """Make ``paths`` older than the grace a temporary entry's maker has to hold it
    (:data:`flashinfer_sm120.safety.fs.atomic.GRACE_S`), so a sweep may take them."""
    import os

    from flashinfer_sm120.safety.fs.atomic import GRACE_S

    for p in paths:
        st = os.lstat(p)
        os.utime(p, (st.st_atime - GRACE_S - 60, st.st_mtime - GRACE_S - 60), follow_symlinks=False)
