"""Trigger modules of the autoload hook (``FLASHINFER_SM120_AUTOLOAD_TRIGGERS``): each module the
import of a trigger runs is executed once, also when flashinfer-sm120 imports the trigger itself.

Real interpreters; executions are counted with an audit hook (``exec`` events of the module's
own code object), not inferred."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "src"

_COUNT = """
import json, os, sys
runs = {}
def hook(event, args):
    if event == "exec" and hasattr(args[0], "co_filename"):
        f = args[0].co_filename
        if f.endswith("__init__.py") or f.endswith(".py"):
            runs[f] = runs.get(f, 0) + 1
sys.addaudithook(hook)
sys.path.insert(0, os.environ["HOOK_DIR"])
import flashinfer_sm120_autoload
flashinfer_sm120_autoload.install()
import %(trigger)s as mod
twice = {f: n for f, n in runs.items() if n > 1}
print("@@" + json.dumps({"twice": twice, "same": sys.modules[%(trigger)r] is mod,
                         "loaded": "flashinfer_sm120.core.autoload" in sys.modules,
                         "spec": getattr(mod.__spec__, "name", None), "file": getattr(mod, "__file__", None)}))
"""


def _run(tmp_path, trigger, extra_path=()):
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir(exist_ok=True)
    (hook_dir / "flashinfer_sm120_autoload.py").write_text((SRC / "flashinfer_sm120" / "core/autoload_hook.py").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_SM120_")}
    env.update(HOOK_DIR=str(hook_dir), FLASHINFER_SM120_AUTOLOAD_TRIGGERS=trigger,
               FLASHINFER_SM120_CACHE_DIR=str(tmp_path / "c"), FLASHINFER_SM120_QUIET="1",
               PYTHONPATH=os.pathsep.join([*map(str, extra_path), str(SRC)]))
    proc = subprocess.run([sys.executable, "-c", _COUNT % {"trigger": trigger}], env=env, capture_output=True,
                          text=True, timeout=120)
    line = [x for x in proc.stdout.splitlines() if x.startswith("@@")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    return json.loads(line[-1][2:]), proc


@pytest.mark.parametrize("trigger", ["wrapt", "filelock", "packaging"])
def test_a_trigger_the_package_imports_itself_runs_once(tmp_path, trigger):
    """A trigger that flashinfer_sm120 imports itself (wrapt, filelock, packaging) is executed once, never
    twice (P1)."""
    got, proc = _run(tmp_path, trigger)
    assert got["loaded"], proc.stderr  # the trigger did load flashinfer_sm120
    assert got["twice"] == {}, got
    assert got["same"] and got["spec"] == trigger and got["file"]


def test_a_plain_trigger_runs_once_and_loads_the_package(tmp_path):
    pkg = tmp_path / "lib" / "my_server"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 42\n")
    got, proc = _run(tmp_path, "my_server", extra_path=[tmp_path / "lib"])
    assert got["loaded"] and got["twice"] == {} and got["same"], got


@pytest.mark.parametrize("trigger", ["torch", "numpy"])
def test_a_trigger_flashinfer_imports_names_the_circle_and_the_fix(tmp_path, trigger):
    """A trigger FlashInfer imports during its own import (torch) loaded flashinfer_sm120 with flashinfer.jit.core
    half made: 'patching failed ... Please report this'; it says what happened and the fix, no traceback (P8)."""
    pytest.importorskip("flashinfer")
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    hook = (SRC / "flashinfer_sm120" / "core" / "autoload_hook.py").read_text()
    (hook_dir / "flashinfer_sm120_autoload.py").write_text(hook)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_SM120_")}
    env.update(FLASHINFER_SM120_AUTOLOAD_TRIGGERS=trigger, FLASHINFER_SM120_CACHE_DIR=str(tmp_path / "c"),
               FLASHINFER_CUDA_ARCH_LIST="12.0", PYTHONPATH=os.pathsep.join([str(hook_dir), str(SRC)]))
    code = ("import flashinfer_sm120_autoload as a; a.install(); import flashinfer.jit.core, flashinfer_sm120; "
            "print('@@' + flashinfer_sm120.status()['mode'])")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "@@failed" in proc.stdout, proc.stderr[-3000:]
    assert "partially initialised" in proc.stderr and "FLASHINFER_SM120_AUTOLOAD_TRIGGERS" in proc.stderr
    assert "Please report" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("value, expected", [
    (None, ("flashinfer", "vllm", "sglang")), ("", ("flashinfer", "vllm", "sglang")),
    (" , ", ("flashinfer", "vllm", "sglang")), ("flashinfer.jit", ("flashinfer",)),
    ("vllm, my_server vllm", ("vllm", "my_server")), ("FlashInfer", ("FlashInfer",))])
def test_triggers_read_as_imports_are_matched(value, expected):
    """A set but blank value, or a submodule, never silently turns the autoload off (P8): blank is the default,
    a submodule stands for its top-level module, which is what an import is matched against."""
    from flashinfer_sm120.core.autoload_hook import triggers

    assert triggers({} if value is None else {"FLASHINFER_SM120_AUTOLOAD_TRIGGERS": value}) == expected


@pytest.mark.parametrize("value", ["FlashInfer", "vllm", "flashinfer;vllm"])
def test_doctor_warns_on_the_verdict_line_when_the_triggers_leave_flashinfer_out(value):
    """``FlashInfer`` never fires (imports are case-sensitive) and ``vllm`` alone leaves SGLang's process unpatched:
    doctor's OK line names the variable and the fix (P8)."""
    from flashinfer_sm120.core.autoload_hook import triggers
    from flashinfer_sm120.diagnose.verify import diagnosis

    report = {"autoload": {"pth": ["/site/flashinfer_sm120_autoload.pth"],
                           "triggers": list(triggers({"FLASHINFER_SM120_AUTOLOAD_TRIGGERS": value}))}}
    found = [f for f in diagnosis._check_sections(report) if f.code == "autoload-triggers"]
    assert len(found) == 1 and value in found[0].text and "unset it" in found[0].fix, found
    assert "separated by commas or spaces" in found[0].fix  # `;` is no separator
    assert "autoload-triggers" in diagnosis.VERDICT_NOTES
    report["autoload"]["triggers"] = list(triggers({}))
    assert not [f for f in diagnosis._check_sections(report) if f.code == "autoload-triggers"]
