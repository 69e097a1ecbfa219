"""The verdicts do not depend on how long the paths are (a checkout, a venv, a toolkit in a deep
directory): ``doctor``'s verdict is its whole first line, with its words and its fix, and a later
line is wider than the screen only to hold one long value whole; ``status`` stays one line ending in
its targets.  Rendered in-process from a report built by hand, so it costs milliseconds."""

import pytest

from helpers.reports import doctor_report
from flashinfer_sm120.cli import doctor
from flashinfer_sm120.cli.doctor import WIDTH
from flashinfer_sm120.cli.status import status_line

DEPTHS = [1, 8, 40]  # path components of 9 characters: a short, a usual and a very deep checkout


def _deep(n: int) -> str:
    return "".join(f"/dir{i:05d}" for i in range(n))


def _fits(lines: list[str]) -> bool:
    """No line after the verdict is wider than the screen unless it holds one long value whole."""
    return not [ln for ln in lines[1:] if len(ln) > WIDTH and len(ln.split()) > 1]


@pytest.mark.parametrize("depth", DEPTHS)
def test_doctor_problem_verdict_keeps_its_fix_and_width_at_any_path_length(depth):
    python = _deep(depth) + "/.venv/bin/python"
    lines = doctor.render(doctor_report(python=python, flashinfer_installed=False, flashinfer=None))
    verdict = lines[0]
    assert verdict.startswith("PROBLEM: FlashInfer is not installed for /dir00000"), lines
    assert verdict.endswith("Fix: pip install flashinfer-python"), lines
    assert _fits(lines), lines


@pytest.mark.parametrize("depth", DEPTHS)
def test_doctor_ok_verdict_keeps_its_start_and_width_at_any_path_length(depth):
    root = _deep(depth) + "/cu13"
    tk = {"root": root, "nvcc": root + "/bin/nvcc", "sources": ["pip"], "nvcc_full": "13.0.88"}
    report = doctor_report()
    report["candidates"] = [dict(report["candidates"][0], **tk)]
    report["resolution"]["choice"]["toolkit"] = tk
    lines = doctor.render(report)
    assert lines[0].startswith("OK: FlashInfer will build sm_120f with nvcc 13.0.88 at /dir00000"), lines
    assert lines[0].endswith("/cu13"), lines
    assert _fits(lines), lines


@pytest.mark.parametrize("depth", DEPTHS)
def test_status_is_one_line_ending_in_its_targets_at_any_path_length(depth):
    line = status_line({"mode": "patched", "toolkit": {"nvcc_full": "13.0.88", "root": _deep(depth) + "/cu13"},
                        "targets": ["sm_120f"]})
    assert "\n" not in line and line.startswith("patched: nvcc 13.0.88 at /dir00000")
    assert line.endswith("/cu13; targets sm_120f")
