"""What the tests share: child processes (``child``), fake toolkits and scripts (``toolkits``), what this
host has (``host``), fake GPUs and servers, other users, cgroups, the fork server; ``tests/conftest.py``
holds the fixtures.  Test files import from here, never from each other or from conftest."""

from pathlib import Path

#: The tests folder (on ``sys.path`` in the tests, so ``helpers`` imports), the checkout, its sources.
TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
SRC = ROOT / "src"
