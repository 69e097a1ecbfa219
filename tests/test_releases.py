"""The patch against several FlashInfer releases, not just the installed one.

FlashInfer's arch logic changed between releases (0.6.7 maps SM121 to 120f;
0.6.12 gives SM121 its own 121a; 0.7.2 accepts SM120 on CUDA 12.8 as 120a).
Older wheels are fetched once with ``pip download --no-deps`` into
``$FLASHINFER_SM120_TEST_WHEELS`` (default ``~/.cache/flashinfer-sm120/test-wheels``)
and put first on ``PYTHONPATH``; their dependencies are the installed ones.
"""

import os
import subprocess
import sys

import pytest

from conftest import make_toolkit, needs_flashinfer, run_py

pytestmark = needs_flashinfer

RELEASES = ["0.6.7", "0.6.17", "installed"]

REPORT = """
import json, os, fakegpu, flashinfer_sm120, flashinfer
import flashinfer.jit.core as core, flashinfer.jit.cpp_ext as cx
from flashinfer.compilation_context import CompilationContext
from flashinfer.jit.sampling import gen_sampling_module
out = dict(release=flashinfer.__version__, mode=flashinfer_sm120.status()["mode"],
           version=str(cx.get_cuda_version()), path=cx.get_cuda_path(),
           current=sorted(map(list, core.current_compilation_context.TARGET_CUDA_ARCHS)),
           fresh=sorted(map(list, CompilationContext().TARGET_CUDA_ARCHS)))
try:
    spec = gen_sampling_module()
    spec.write_ninja()
    out["ninja"] = spec.ninja_path.read_text()
except Exception as e:
    out["error"] = repr(e)
print("@@" + json.dumps(out))
"""


def _release_dir(version):
    if version == "installed":
        return None
    base = os.environ.get("FLASHINFER_SM120_TEST_WHEELS") or os.path.expanduser(
        "~/.cache/flashinfer-sm120/test-wheels")
    target = os.path.join(base, version)
    if not os.path.isdir(os.path.join(target, "flashinfer")):
        wheels = os.path.join(base, "wheels")
        dl = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", wheels,
                             f"flashinfer-python=={version}"], capture_output=True, text=True, timeout=600)
        if dl.returncode != 0:
            pytest.skip(f"cannot download flashinfer-python=={version}: {dl.stderr.strip()[-300:]}")
        whl = [w for w in os.listdir(wheels) if w.startswith(f"flashinfer_python-{version}-")][0]
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                        "--target", target, os.path.join(wheels, whl)], check=True, capture_output=True)
    return target


@pytest.fixture(params=RELEASES)
def release_env(request, clean_env, tmp_path, real_nvcc13):
    env = dict(clean_env, FAKE_TORCH_CUDA="13.0")
    target = _release_dir(request.param)
    if target:
        env["PYTHONPATH"] = target + os.pathsep + env["PYTHONPATH"]
    fake = make_toolkit(tmp_path / "cuda-12.8")
    env["PATH"] = f"{fake}/bin:{env['PATH']}"
    env["CUDA_HOME"] = str(fake)
    return request.param, env, str(fake)


def test_release_seed_and_fix(release_env):
    release, env, fake = release_env
    # unpatched: SM121 on nvcc 12.8 always ends with an empty arch set
    out, _ = run_py(REPORT, dict(env, FAKE_GPU_CAPS="12.1", FLASHINFER_SM120_DISABLE="1"))
    if release != "installed":
        assert out["release"] == release
    assert out["version"] == "12.8" and out["current"] == [] and "sm75 or higher" in out["error"]
    # unpatched SM120: empty on the seed releases (0.6.7 - 0.6.17)
    out, _ = run_py(REPORT, dict(env, FAKE_GPU_CAPS="12.0", FLASHINFER_SM120_DISABLE="1"))
    if release in ("0.6.7", "0.6.17"):
        assert out["current"] == []
    # patched
    for caps, target in (("12.0", [12, "0f"]), ("12.1", [12, "1a"])):
        out, proc = run_py(REPORT, dict(env, FAKE_GPU_CAPS=caps))
        assert out["mode"] == "patched", proc.stderr[-3000:]
        assert out["version"].startswith("13.") and out["path"] != fake
        assert out["current"] == [target] and out["fresh"] == [target]
        assert f"compute_{target[0]}{target[1]},code=sm_{target[0]}{target[1]}" in out["ninja"]
        assert f"cuda_home = {out['path']}" in out["ninja"]


def test_release_noop_only_where_flashinfer_agrees(release_env):
    release, env, _ = release_env
    code = ("import fakegpu, os, flashinfer_sm120\n"
            "os.environ['CUDA_HOME'] = flashinfer_sm120.resolve().home.path\n") + REPORT
    out, _ = run_py(code, dict(env, FAKE_GPU_CAPS="12.1"))
    assert out["current"] == [[12, "1a"]]
    # 0.6.7 builds SM121 as 120f even with a right toolkit, so it must be patched
    assert out["mode"] == ("patched" if release == "0.6.7" else "noop")
