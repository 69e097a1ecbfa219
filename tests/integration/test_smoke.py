"""``flashinfer-sm120 doctor --smoke`` (issue 15 item 2): a tiny kernel compiled and linked with
FlashInfer's own build line by the real pip nvcc passes; a broken toolkit fails naming the step,
with its output cut to the end."""

from __future__ import annotations

import json
import os
import sys

import pytest

from helpers.child import cli, run_py
from helpers.host import needs_flashinfer
from helpers.toolkits import make_toolkit

pytestmark = [needs_flashinfer, pytest.mark.nvcc]


def doctor(env, *args, timeout=600):
    return cli(["doctor", "--smoke", *args], env, timeout, python=sys.executable)


@pytest.mark.slow
def test_smoke_passes_with_the_pip_nvcc(clean_env, real_nvcc13):
    proc = doctor(dict(clean_env, FLASHINFER_CUDA_ARCH_LIST="12.0"), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    smoke = json.loads(proc.stdout)["smoke"]
    steps = {s["name"]: s for s in smoke["steps"]}
    assert smoke["ok"] and smoke["failed"] is None and smoke["targets"] == ["sm_120f"]
    assert [s["name"] for s in smoke["steps"]] == ["toolkit", "generate", "compile", "link", "link check", "load", "run"]
    assert all(steps[n]["status"] == "passed" for n in ("toolkit", "generate", "compile", "link", "link check"))
    assert "-gencode=arch=compute_120f,code=sm_120f" in steps["generate"]["detail"]  # FlashInfer's flags
    assert "libcuda.so.1" in steps["link check"]["detail"] and "SASS sm_120f" in steps["link check"]["detail"]
    assert steps["load"]["status"] == steps["run"]["status"] == "skipped"
    assert "no GPU visible" in steps["run"]["detail"]
    scratch = os.path.join(clean_env["FLASHINFER_SM120_CACHE_DIR"])
    assert not [n for n in os.listdir(scratch) if n.startswith("smoke-")]  # cleaned up


BROKEN_NVCC = """#!/bin/sh
[ "$1" = --version ] && echo "Cuda compilation tools, release 13.0, V13.0.88" && exit 0
""" + "".join(f"echo 'noise line {i} from a broken toolkit ........................'\n" for i in range(200)) + """echo "nvcc fatal   : this toolkit is broken on purpose" >&2
exit 1
"""


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
def test_a_broken_toolkit_fails_naming_the_step_with_its_output(clean_env, tmp_path):
    fake = make_toolkit(tmp_path / "cuda-13.0", "13.0.88", nvcc_script=BROKEN_NVCC, version_json=True)
    env = dict(clean_env, CUDA_HOME=str(fake), FLASHINFER_CUDA_ARCH_LIST="12.0")
    proc = doctor(env, "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    smoke = json.loads(proc.stdout)["smoke"]
    assert smoke["ok"] is False and smoke["failed"] == "compile"
    step = {s["name"]: s for s in smoke["steps"]}
    assert step["toolkit"]["status"] == "passed" and str(fake.name) in step["toolkit"]["detail"]
    failed = step["compile"]
    assert failed["status"] == "failed" and "exit" in failed["detail"]
    assert failed["output"].rstrip().endswith("ninja: build stopped: subcommand failed.")
    assert "broken on purpose" in failed["output"] and "characters cut" in failed["output"]
    assert len(failed["output"]) < 2200  # truncated: the end, where compilers put the error
    assert all(step[n]["status"] == "skipped" and "compile failed" in step[n]["detail"]
               for n in ("link", "link check", "load", "run"))
    from flashinfer_sm120.cli.doctor import smoke_lines

    human = "\n".join(smoke_lines(smoke))  # what doctor prints for it
    assert human.startswith("PROBLEM: the smoke check failed at step 'compile'") and "broken on purpose" in human


def test_no_usable_ninja_fails_the_compile_step_with_the_fix(clean_env, tmp_path, real_nvcc13):
    empty = tmp_path / "bin"
    empty.mkdir()
    out, _ = run_py("""
        import json
        from flashinfer_sm120.core.toolkit import ninja
        from flashinfer_sm120.diagnose.verify import smoke
        ninja.FIND_STEPS = ()  # neither the wheel next to FlashInfer nor one on PATH
        print("@@" + json.dumps(smoke.run_smoke()))
    """, dict(clean_env, FLASHINFER_CUDA_ARCH_LIST="12.0", PATH=str(empty)))
    assert out["failed"] == "compile"
    (step,) = [s for s in out["steps"] if s["name"] == "compile"]
    assert "no usable ninja" in step["detail"] and "pip install ninja" in step["detail"]


def test_smoke_runs_the_wheels_ninja_with_the_venv_bin_off_path(clean_env, tmp_path, real_nvcc13):
    """systemd's PATH lacks the venv's bin: the smoke check still runs the ninja the server will run."""
    out, _ = run_py("""
        import json
        from flashinfer_sm120.core.toolkit import ninja
        from flashinfer_sm120.diagnose.verify import smoke
        print("@@" + json.dumps([smoke.run_smoke(), ninja.choose().path]))
    """, dict(clean_env, FLASHINFER_CUDA_ARCH_LIST="12.0", PATH="/usr/bin:/bin"))  # systemd's default
    result, chosen = out
    (step,) = [s for s in result["steps"] if s["name"] == "compile"]
    assert step["status"] == "passed" and chosen in step["detail"]


def test_no_targets_fail_the_toolkit_step_saying_what_to_set(clean_env, real_nvcc13):
    out, _ = run_py("""
        import helpers.fakegpu, json
        from flashinfer_sm120.diagnose.verify import smoke
        print("@@" + json.dumps(smoke.run_smoke()))
    """, dict(clean_env, FAKE_GPU_CAPS=""))
    assert out["failed"] == "toolkit" and "FLASHINFER_CUDA_ARCH_LIST=12.0" in out["steps"][0]["detail"]
    assert "check with flashinfer-sm120 doctor --smoke --arch 12.0" in out["steps"][0]["detail"]  # this check again


def test_the_examples_run_the_smoke_check_before_start():
    from helpers import ROOT

    unit = (ROOT / "examples" / "flashinfer-sm120.service").read_text()
    pre = [ln for ln in unit.splitlines() if ln.startswith("ExecStartPre=")]
    assert any(ln.split()[1:3] == ["doctor", "--timeout"] and "--smoke" in ln.split() for ln in pre), pre
    stage = (ROOT / "examples" / "build-stage.sh").read_text()
    assert 'flashinfer-sm120" doctor --smoke --arch "$ARCHS"' in stage
    assert 'flashinfer-sm120" doctor --json --arch "$ARCHS"' in stage  # the full report, kept as JSON
