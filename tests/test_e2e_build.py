"""The seed, end to end, compiling FlashInfer's real sampling kernels for sm_120f.

Needs a real CUDA 13 nvcc (skipped with the reason otherwise) and a few minutes:
no GPU is needed to compile, the GPU's capability is simulated.
"""

import json
import os
import re
import shutil
import subprocess

import pytest

from conftest import make_toolkit, needs_flashinfer, run_py

pytestmark = [needs_flashinfer, pytest.mark.slow, pytest.mark.nvcc]

NINJA_ONLY = """
import json, os, fakegpu, flashinfer_sm120, flashinfer
from flashinfer.jit.sampling import gen_sampling_module
import flashinfer.jit.cpp_ext as cx
import flashinfer.jit.core as core
out = {"archs": sorted(map(list, core.current_compilation_context.TARGET_CUDA_ARCHS)),
       "version": str(cx.get_cuda_version())}
try:
    spec = gen_sampling_module()
    spec.write_ninja()
    out["ninja"] = spec.ninja_path.read_text()
    try:
        spec.build(False)
        out["built"] = True
    except Exception as e:
        out["build_error"] = repr(e)[:2000]
except Exception as e:
    out["error"] = repr(e)
print("@@" + json.dumps(out))
"""


@pytest.fixture
def seed(clean_env, tmp_path, real_nvcc13):
    fake = make_toolkit(tmp_path / "cuda-12.8", "12.8.93")
    env = dict(clean_env, CUDA_HOME=str(fake), FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0")
    env["PATH"] = f"{fake}/bin:{env['PATH']}"
    return env, fake


def _gencodes(ninja_text):
    return sorted(set(re.findall(r"-gencode=arch=(compute_\w+),code=(sm_\w+)", ninja_text)))


def test_without_shim_flashinfer_uses_the_old_nvcc_and_fails(seed):
    env, fake = seed
    env = dict(env, FLASHINFER_SM120_DISABLE="1")
    out, _ = run_py(NINJA_ONLY, dict(env, FAKE_GPU_CAPS="12.1"))
    assert out["archs"] == [] and out["version"] == "12.8"
    assert "sm75 or higher" in out["error"]  # the crash users see under load
    out, _ = run_py(NINJA_ONLY, env)
    assert out["version"] == "12.8" and [12, "0f"] not in out["archs"]
    if "ninja" in out:  # FlashInfer >= 0.7.2 settles for sm_120a on 12.8 ...
        assert f"cuda_home = {fake}" in out["ninja"]
        assert "built" not in out  # ... and the old toolkit cannot build it
    else:  # 0.6.7 - 0.6.17: empty arch set
        assert "sm75 or higher" in out["error"]


def test_sm121_ninja_targets_121a(seed):
    env, fake = seed
    code = NINJA_ONLY.replace("        spec.build(False)\n", "        raise SystemError('skip build')\n")
    out, _ = run_py(code, dict(env, FAKE_GPU_CAPS="12.1"))
    assert out["archs"] == [[12, "1a"]]
    assert _gencodes(out["ninja"]) == [("compute_121a", "sm_121a")]


def test_shim_builds_real_sampling_kernels_for_sm120f(seed, tmp_path):
    """One pooled build of sampling (the seed's crash) and a small module (activation)."""
    env, fake = seed
    code = ("import fakegpu, sys\nfrom flashinfer_sm120.cli import main\n"
            "sys.exit(main(['build', 'sampling', 'activation', '--json', '-j', '2']))\n")
    proc = subprocess.run([os.sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-6000:]
    report = json.loads(proc.stdout)
    assert report["cuda_version"].startswith("13.") and report["target_cuda_archs"] == ["sm_120f"]
    mod, act = report["modules"]
    assert (mod["module"], act["module"]) == ("sampling", "activation-silu")
    assert mod["status"] == act["status"] == "built"
    assert mod["gencode"] == ["compute_120f,sm_120f"] and mod["binary"] == ["SASS sm_120f"]  # no PTX
    so = mod["library"]
    assert so.startswith(env["FLASHINFER_WORKSPACE_BASE"])
    assert re.search(r"/120f/nvcc13\.[0-9.]+-[0-9a-f]{8}/cached_ops/sampling/", so), so  # one JIT dir per toolkit
    assert os.path.getsize(so) > 100_000 and os.path.getsize(act["library"]) > 10_000
    ninja = open(os.path.join(os.path.dirname(so), "build.ninja")).read()
    home = re.search(r"^cuda_home = (.*)$", ninja, re.M).group(1)
    assert home != str(fake)
    nvcc = os.path.realpath(os.path.join(home, "bin", "nvcc"))
    ver = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    assert "release 13." in ver
    # one progress display for the pool: steps named when they finish, never before
    assert "to build: 2 module(s)" in proc.stderr and "sampling: compiled sampling.cu" in proc.stderr
    assert re.search(r"\[(\d+)/\1\] ", proc.stderr) and "FAILED" not in proc.stderr
    # FlashInfer's own run (ninja in the module dir, flashinfer/jit/core.py) has nothing to do
    for lib in (so, act["library"]):
        d = os.path.dirname(lib)
        dry = subprocess.run(["ninja", "-n", "-C", d, "-f", os.path.join(d, "build.ninja")],
                             capture_output=True, text=True)
        assert "no work to do" in dry.stdout, dry.stdout[-2000:]
    again = subprocess.run([os.sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [m["status"] for m in json.loads(again.stdout)["modules"]] == ["up to date", "up to date"]
    assert again.stderr.count("up to date: sampling") == 1 and "to build" not in again.stderr
    cuobjdump = shutil.which("cuobjdump", path=os.path.join(home, "bin") + os.pathsep + os.environ["PATH"])
    if cuobjdump:
        elf = subprocess.run([cuobjdump, "--list-elf", so], capture_output=True, text=True).stdout
        assert "sm_120" in elf, elf
        ptx = subprocess.run([cuobjdump, "--list-ptx", so], capture_output=True, text=True).stdout
        assert "compute_120" not in ptx  # the summary said SASS only
