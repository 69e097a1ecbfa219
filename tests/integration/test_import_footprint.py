"""What ``import flashinfer`` loads from this package (benchmarks/loaded_lines.py): the script's
output parses, modules only commands use stay off the import path, whether the package is
imported directly or by the ``.pth`` hook, and what only a first process needs (running nvcc and
ninja, building the view) stays off every later one.  The figure itself is for the README, not asserted."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest

from helpers import ROOT
from helpers.child import run_py
from helpers.host import needs_flashinfer

SCRIPT = ROOT / "benchmarks" / "loaded_lines.py"

#: Modules (or packages: every module under them) that import-time work does not run: tool
#: output parsers, manifest grammars and compiler-option forms, argparse number types, the command layers (build,
#: doctor), and what runs only when asked for: the recorder (FLASHINFER_SM120_RECORD)
#: and the compiler cache (FLASHINFER_SM120_COMPILER_CACHE or FLASHINFER_NVCC_LAUNCHER); the memory policy
#: behind MAX_JOBS runs at the first JIT build (jitenv.toolchain.prepare_builds).
COMMAND_ONLY = (
    "flashinfer_sm120.core.jitenv.memory",
    "flashinfer_sm120.safety.formats.params",
    "flashinfer_sm120.core.jitenv.record",
    "flashinfer_sm120.core.jitenv.launcher",
    "flashinfer_sm120.warmup", "flashinfer_sm120.diagnose", "flashinfer_sm120.cli",
    "flashinfer_sm120.__main__",
)
#: Loaded by a first process only (an empty cache: nvcc and ninja are run, the view is built), or when
#: something failed: a later process with the same settings replays the recorded decision (laststatus.replay).
FIRST_ONLY = ("flashinfer_sm120.safety.proc", "flashinfer_sm120.core.view.stub", "flashinfer_sm120.core.facts.refusals",
              "flashinfer_sm120.core.view.build", "flashinfer_sm120.core.toolkit.sources",
              "flashinfer_sm120.core.toolkit.policy", "flashinfer_sm120.core.toolkit.probe",
              "flashinfer_sm120.safety.compilers")  # the build-variable and compiler-cache checks: again only when set


def load_script():
    spec = importlib.util.spec_from_file_location("loaded_lines", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def patch_env(clean_env, real_nvcc13):
    """A target without a GPU, so that FlashInfer is patched (not guarded)."""
    return dict(clean_env, FLASHINFER_CUDA_ARCH_LIST="12.0")


@needs_flashinfer
@pytest.mark.parametrize("how", ["import", "autoload"])
def test_command_only_modules_are_not_loaded_by_import_flashinfer(patch_env, how):
    out, proc = run_py(load_script().MEASURES[how], patch_env)
    assert out["mode"] == "patched", proc.stderr
    loaded = sorted(out["modules"])
    assert "flashinfer_sm120.core.patch" in loaded
    if how == "autoload":
        assert "flashinfer_sm120_autoload" in loaded and "flashinfer_sm120.core.autoload" in loaded
    wrong = [m for m in loaded if any(m == c or m.startswith(c + ".") for c in COMMAND_ONLY)]
    assert wrong == [], f"on the import path again: {wrong} (import them from the commands that use them)"


@needs_flashinfer
def test_a_later_process_runs_nothing_and_builds_no_view(patch_env):
    code = load_script().MEASURES["import"]
    first, proc = run_py(code, patch_env)
    assert first["mode"] == "patched", proc.stderr
    assert "flashinfer_sm120.safety.proc" in first["modules"]  # the measure sees what a first process runs
    later, proc = run_py(code, patch_env)
    assert later["mode"] == "patched", proc.stderr
    wrong = [m for m in later["modules"] if m in FIRST_ONLY]
    assert wrong == [], f"loaded by a later process: {wrong} (import them where they are used)"


@needs_flashinfer
@pytest.mark.slow
def test_loaded_lines_output_parses(patch_env, tmp_path):
    out_json = tmp_path / "loaded.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--arch", "12.0", "--list", "--json", str(out_json)],
                          env=patch_env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    data = json.loads(out_json.read_text())
    assert set(data) == {"import", "autoload"}
    heads = [i for i, line in enumerate(lines) if not line.startswith("  ")]
    assert len(heads) == 4, proc.stdout
    for i, end in zip(heads, heads[1:] + [len(lines)]):
        head = re.fullmatch(r"(import|autoload), (later processes|first process \(empty cache\)): (\d+) lines in "
                            r"(\d+) modules \(patch mode: patched\)", lines[i])
        assert head, lines[i]
        listed = [(name, int(n)) for n, name in (line.split() for line in lines[i + 1:end])]
        when = "later" if head[2] == "later processes" else "first"
        assert sorted(listed) == sorted(data[head[1]][when]["modules"].items())
        assert (int(head[3]), int(head[4])) == (sum(n for _, n in listed), len(listed))
