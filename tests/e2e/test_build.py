"""The seed, end to end: FlashInfer fails on SM 12.x with an old nvcc first (its sampling module, the
crash users see), and the shim builds real FlashInfer kernels for sm_120f with a CUDA 13 nvcc, inside
a memory cgroup its naive -j exceeds where root can make one (issue 14's real-compile check). The
real build is of the smallest modules (``activation`` for three functions: one compile each);
the README's main job builds sampling itself.

Needs a real CUDA 13 nvcc (skipped with the reason otherwise) and a few minutes:
no GPU is needed to compile, the GPU's capability is simulated.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from helpers import TESTS
from helpers.child import cli, run_py
from helpers.host import REAL_NVCC13, needs_flashinfer
from helpers.toolkits import make_toolkit

pytestmark = [needs_flashinfer, pytest.mark.slow, pytest.mark.nvcc]

NINJA_ONLY = """
import json, os, helpers.fakegpu, flashinfer_sm120, flashinfer
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


BUILD = ["build", "activation", "--act", "silu,gelu,gelu_tanh", "--json", "-j", "2"]
MODULES = ["activation-silu", "activation-gelu", "activation-gelu_tanh"]


@pytest.fixture(scope="module")
def real_build(tmp_path_factory):
    """Built for real once for this module: a fake nvcc 12.8 first on PATH and as CUDA_HOME, a
    simulated SM 12.0 GPU, three modules of one compile each.  Where root can create a memory
    cgroup (v2 or v1), the build runs inside one whose limit its naive ``-j 2`` exceeds: the
    build process's footprint plus 1.5x the peak of the first module's compile, measured first
    in the same cgroup (that compile's object is then reused by the build)."""
    from helpers import cgroups as cgroup_util

    if REAL_NVCC13 is None:
        pytest.skip("no CUDA 13 nvcc found (pip install 'cuda-toolkit[nvcc,cccl,curand]==13.0.*')")
    tmp = tmp_path_factory.mktemp("e2e")
    fake = make_toolkit(tmp / "cuda-12.8", "12.8.93")
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_HOME", "CUDA_PATH", "FLASHINFER_CUDA_ARCH_LIST", "FLASHINFER_SM120_DISABLE",
                        "CUDA_VISIBLE_DEVICES", "MAX_JOBS")}
    env.update(FLASHINFER_WORKSPACE_BASE=str(tmp / "ws"), FLASHINFER_SM120_CACHE_DIR=str(tmp / "sm120cache"),
               CUDA_HOME=str(fake), FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0",
               PATH=f"{fake}/bin:{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join([str(TESTS)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    cg, why = None, None
    for version in ("2", "1"):
        cg, why = cgroup_util.make(version)
        if cg is not None:
            break
    run = (lambda c: cg.prefix(["nice", "-n", "10", *c])) if cg else (lambda c: ["nice", "-n", "10", *c])
    out = {"env": env, "fake": fake, "cgroup": None, "cgroup_skip": why}
    try:
        if cg is not None:
            proc = cli([*BUILD, "--ninja-only"], env, 600, fakegpu=True,
                       python=sys.executable, prefix=run([]))
            assert proc.returncode == 0, proc.stderr[-3000:]
            base = cg.peak()  # Python with torch and FlashInfer, writing the ninja file
            ninja_file = json.loads(proc.stdout)["modules"][0]["ninja"]
            first = next(line.split()[1].rstrip(":") for line in open(ninja_file)
                         if line.startswith("build ") and line.split()[1].endswith(".cuda.o:"))
            cg.reset_peak()
            ninja = os.path.join(os.path.dirname(sys.executable), "ninja")
            proc = subprocess.run(run([ninja, "-C", os.path.dirname(ninja_file), "-f", ninja_file, first]),
                                  env=env, capture_output=True, text=True, timeout=1800)
            assert proc.returncode == 0, proc.stdout[-3000:]
            one = cg.peak()  # one compile (nvcc and the tools it runs) and ninja
            limit = base + int(1.5 * one)
            cg.set_limit(limit)
            cg.reset_peak()
            out["cgroup"] = {"base": base, "one": one, "limit": limit}
        t0 = time.monotonic()
        proc = cli(BUILD, env, 1800, fakegpu=True, python=sys.executable,
                   prefix=run([]))
        out.update(proc=proc, wall=time.monotonic() - t0)
        if cg is not None:
            out["cgroup"].update(peak=cg.peak(), oom_kills=cg.oom_kills())
        yield out
    finally:
        if cg is not None:
            cg.close()


def test_shim_builds_real_kernels_for_sm120f(real_build):
    """Real FlashInfer kernels built with a CUDA 13 nvcc for sm_120f only, into a JIT directory of
    that toolkit, that FlashInfer's own ninja run finds up to date."""
    env, fake, proc = real_build["env"], real_build["fake"], real_build["proc"]
    assert proc.returncode == 0, proc.stderr[-6000:]
    report = json.loads(proc.stdout)
    assert report["cuda_version"].startswith("13.") and report["target_cuda_archs"] == ["sm_120f"]
    assert [m["module"] for m in report["modules"]] == MODULES
    assert {m["status"] for m in report["modules"]} == {"built"}
    for mod in report["modules"]:
        assert mod["binary"] == ["SASS sm_120f"]  # no PTX
        so = mod["library"]
        assert so.startswith(env["FLASHINFER_WORKSPACE_BASE"])
        assert re.search(rf"/120f/nvcc13\.[0-9.]+-[0-9a-f]{{8}}/cached_ops/{mod['name']}/", so), so  # a JIT dir per toolkit
        assert os.path.getsize(so) > 50_000
    so = report["modules"][0]["library"]
    ninja = open(os.path.join(os.path.dirname(so), "build.ninja")).read()
    home = re.search(r"^cuda_home = (.*)$", ninja, re.M).group(1)
    assert home != str(fake)
    nvcc = os.path.realpath(os.path.join(home, "bin", "nvcc"))
    ver = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    assert "release 13." in ver
    # one progress display: steps named when they finish, never before
    assert "to build: 3 modules," in proc.stderr
    assert ": compiled " in proc.stderr and all(f"done: {m}" in proc.stderr for m in MODULES), proc.stderr[-3000:]
    assert re.search(r"\[(\d+)/\1\] ", proc.stderr) and "FAILED" not in proc.stderr
    # FlashInfer's own run (ninja in the module dir, flashinfer/jit/core.py) has nothing to do
    d = os.path.dirname(so)
    dry = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ninja"), "-n", "-C", d, "-f",
                          os.path.join(d, "build.ninja")], capture_output=True, text=True)
    assert "no work to do" in dry.stdout, dry.stdout[-2000:]
    again = cli(BUILD, env, 600, fakegpu=True, python=sys.executable)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [m["status"] for m in json.loads(again.stdout)["modules"]] == ["up to date"] * 3
    assert "up to date" not in again.stderr and "to build" not in again.stderr  # said once, in the report
    cuobjdump = shutil.which("cuobjdump", path=os.path.join(home, "bin") + os.pathsep + os.environ["PATH"])
    if cuobjdump:
        elf = subprocess.run([cuobjdump, "--list-elf", so], capture_output=True, text=True).stdout
        assert "sm_120" in elf, elf
        ptx = subprocess.run([cuobjdump, "--list-ptx", so], capture_output=True, text=True).stdout
        assert "compute_120" not in ptx  # the summary said SASS only


def test_real_build_fits_a_limit_its_naive_j_exceeds(real_build):
    """Issue 14: a real build of three compiles inside a memory cgroup whose limit ninja's naive
    ``-j 2`` exceeds: the memory policy runs one compile at a time, and nothing is OOM-killed."""
    cg = real_build["cgroup"]
    if cg is None:
        pytest.skip(f"no writable memory cgroup: {real_build['cgroup_skip']}")
    proc = real_build["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert cg["base"] + 2 * cg["one"] > cg["limit"]  # the two compiles left, at once, do not fit
    rep = json.loads(proc.stdout)
    assert {m["status"] for m in rep["modules"]} == {"built"} and cg["oom_kills"] == 0
    assert rep["plan"]["at_once"] == 1, rep["plan"]
    assert cg["peak"] <= cg["limit"]
    print(f"\nactivation: build process {cg['base'] >> 20} MiB, one compile {cg['one'] >> 20} MiB; limit "
          f"{cg['limit'] >> 20} MiB (naive -j 2 needs {(cg['base'] + 2 * cg['one']) >> 20}); built with "
          f"{rep['plan']['at_once']} at once, peak {cg['peak'] >> 20} MiB, {real_build['wall']:.0f} s; "
          f"recorded peak RSS {rep['modules'][0]['peak_rss'] >> 20} MiB")
