"""Every test in this folder runs the package against the real FlashInfer in child processes (a
patched import, a CLI command, a server stand-in), a few CPU-seconds each, so the whole folder
belongs to the full run: it is marked ``slow`` here, and the quick run (``-m "not slow"``) is the
unit and project tests (docs/contributing.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.slow)
