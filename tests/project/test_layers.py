"""The import-linter contract in pyproject.toml holds: core and safety never import warmup, diagnose or
cli; safety imports nothing above it; function-level imports count."""

from __future__ import annotations

import os
import re
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
    """Nor a test function: tests are named by what they check; a docstring can say which round,
    issue item or report found it."""
    words = ('attack', 'item', 'walkthrough', 'user_report', 'boundary', 'round', 'issue')
    files = list((ROOT / "tests").rglob("test_*.py"))
    names = [p.relative_to(ROOT) for p in files if any(w in p.stem for w in words)]
    assert not names, f"name these by subject: {names}"
    event = re.compile(r"(?:^|_)(?:attack|items?|walkthrough|boundary|rounds?|issues?|user_report)\d*(?:_|$)")
    tests = [f"{p.relative_to(ROOT)}::{name}" for p in files
             for name in re.findall(r"^\s*(?:async )?def (test_\w+)", p.read_text(), re.M) if event.search(name[5:])]
    assert not tests, f"name these by what they check: {tests}"
