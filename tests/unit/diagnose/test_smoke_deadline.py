"""``doctor --smoke``'s one deadline: a step it stops names ``--timeout`` and its default as the fix (P8)."""

from __future__ import annotations

import time

from flashinfer_sm120.cli import main
from flashinfer_sm120.diagnose.verify import smoke


def test_a_step_past_the_deadline_names_timeout_and_its_default_as_the_fix(monkeypatch, capsys):
    """``doctor --smoke --timeout 2`` said "the smoke check's 2 s were used up before this step. Fix: see the
    step's output below", where the fix is a longer --timeout."""
    monkeypatch.setattr(smoke, "STEPS", {"toolkit": lambda st: time.sleep(0.3) or "slow", "compile": smoke._left})
    monkeypatch.setattr(smoke, "_gpu_visible", lambda: False)
    assert main(["doctor", "--smoke", "--timeout", "0.2"]) == 1
    fix = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("Fix:"))
    assert "--timeout" in fix and f"{smoke.SMOKE_TIMEOUT_S:g}" in fix and "0.2" in fix, fix
    result = smoke.run_smoke(0.2)
    assert result["failed"] == "compile" and "--timeout" in result["fix"], result
