"""The import-linter contract in pyproject.toml holds: core and safety never import warmup, diagnose or
cli; safety imports nothing above it; function-level imports count."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_imports_follow_the_layers():
    exe = shutil.which("lint-imports") or os.path.join(os.path.dirname(sys.executable), "lint-imports")
    if not os.path.exists(exe):
        pytest.fail("lint-imports is missing: pip install -e '.[test]' (import-linter)")
    proc = subprocess.run([exe, str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout, proc.stdout[-2000:]


def test_no_test_file_is_named_after_an_event():
    words = ('attack', 'item', 'walkthrough', 'user_report', 'boundary', 'round', 'issue')
    names = [p.relative_to(ROOT) for p in (ROOT / "tests").rglob("test_*.py")
             if any(w in p.stem for w in words)]
    assert not names, f"name these by subject: {names}"
