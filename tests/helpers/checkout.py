"""What a test run left in the checkout (the session guard in tests/conftest.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

#: What a test run may leave in the checkout: the environment and the tools' own caches.
CHECKOUT_ALLOWED = (".venv", "venv", ".pytest_cache", ".hypothesis", "__pycache__", "*.egg-info")


def _allowed(path: str) -> bool:
    return any(part == a or (a.startswith("*") and part.endswith(a[1:]))
               for part in path.rstrip("/").split("/") for a in CHECKOUT_ALLOWED)


def checkout_entries(root: Path) -> set[str] | None:
    """``git status --porcelain --ignored`` of ``root`` (untracked and ignored entries, changed
    files), less :data:`CHECKOUT_ALLOWED`; ``None`` when ``root`` is not a git checkout."""
    try:
        proc = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=root, capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return {line for line in proc.stdout.splitlines() if not _allowed(line[3:])}
