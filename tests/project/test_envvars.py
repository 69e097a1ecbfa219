"""Every FLASHINFER_SM120_* name used in the source is in envvars.VARIABLES, and every listed name is used."""

import re
from pathlib import Path

from flashinfer_sm120 import envvars

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "flashinfer_sm120"


def _used() -> set[str]:
    names: set[str] = set()
    for f in SRC.rglob("*.py"):
        if f.name == "envvars.py":
            continue
        names |= set(re.findall(r"FLASHINFER_SM120_[A-Z0-9_]*[A-Z0-9]", f.read_text()))
    return names


def test_every_variable_used_is_listed_and_every_listed_one_is_used():
    listed = {v.name for v in envvars.VARIABLES if v.audience != "tests"}
    used = _used()
    assert used - listed == set(), f"add these to envvars.VARIABLES: {sorted(used - listed)}"
    assert listed - used == set(), f"listed but never read: {sorted(listed - used)}"


def test_test_only_variables_are_read_by_the_tests():
    tests_text = "".join(f.read_text() for f in (ROOT / "tests").rglob("*.py"))
    for v in envvars.VARIABLES:
        if v.audience == "tests":
            assert v.name in tests_text
