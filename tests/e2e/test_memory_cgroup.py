"""The memory policy in a real memory cgroup (root; v1 and v2 where present, skipped with the
reason otherwise): a fake nvcc that allocates and touches 400 MB, a 1 GB limit.

* what :func:`read_memory` sees inside the cgroup;
* ``build -j 8`` of 6 modules completes with no OOM kill and at most 2 compiles at once,
  where the same build without the memory policy (``--mem-limit 64G``) is OOM-killed;
* FlashInfer's own ``run_ninja`` under the ``MAX_JOBS`` this package exports, where
  FlashInfer alone (ninja's default -j) is OOM-killed;
* a real build of three ``activation`` modules inside a limit that its naive -j exceeds: with the end-to-end
  build in tests/e2e/test_build.py (one real compile serves both).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import cgroups as cgroup_util
from helpers.child import cli
from helpers.host import needs_flashinfer
from helpers.toolkits import compiled, make_toolkit

GIB, MIB = 1 << 30, 1 << 20


@pytest.fixture(params=["1", "2"])
def cgroup(request):
    cg, why = cgroup_util.make(request.param)
    if cg is None:
        pytest.skip(f"cgroup v{request.param}: {why}")
    yield cg
    cg.close()


@pytest.fixture
def cgroup_v1_or_v2():
    for version in ("2", "1"):
        cg, why = cgroup_util.make(version)
        if cg is not None:
            yield cg
            cg.close()
            return
    pytest.skip(f"no writable memory cgroup: {why}")


def test_read_memory_sees_the_cgroup_limit(cgroup):
    cgroup.set_limit(GIB)
    code = ("import json; from flashinfer_sm120.core.jitenv import memory; v = memory.read_memory(gpu=False); "
            "print(json.dumps([v.available, v.source]))")
    out = subprocess.run(cgroup.prefix([sys.executable, "-c", code]), capture_output=True, text=True, timeout=60)
    available, source = json.loads(out.stdout)
    assert source == f"cgroup v{cgroup.version} {cgroup.path}", out.stderr
    assert 600 * MIB < available <= GIB


@pytest.fixture
def fake_tools(tmp_path, clean_env):
    tk = make_toolkit(tmp_path / "tk", "13.0.88", curand=True)
    cgroup_util.install_fake_nvcc(tk)
    (tk / "include" / "cublasLt.h").write_text("/* fake: norm includes it */\n")
    cxx = compiled(tmp_path / "fakecxx", cgroup_util.FAKE_CXX)
    env = dict(clean_env, CUDA_HOME=str(tk), CXX=str(cxx), FAKE_NVCC_MB="400", FAKE_NVCC_HOLD="0.5",
               FAKE_NVCC_LOG=str(tmp_path / "nvcc.log"), FLASHINFER_SM120_QUIET="1")
    env.pop("MAX_JOBS", None)
    return env


def _build(cg, env, *extra):
    return cli(["build", "activation", "norm", "rope", "page", "--act", "silu,gelu,gelu_tanh", "--arch", "12.0",
                "-j", "8", "--json", *extra], env, 600, python=sys.executable, prefix=cg.prefix([]))


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@needs_flashinfer
def test_build_j8_of_6_modules_fits_1g(cgroup_v1_or_v2, fake_tools, tmp_path):
    cg, env = cgroup_v1_or_v2, fake_tools
    cg.set_limit(GIB)
    proc = _build(cg, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(proc.stdout)
    assert len(rep["modules"]) == 6 and {m["status"] for m in rep["modules"]} == {"built"}
    assert cg.oom_kills() == 0
    at_once = cgroup_util.max_overlap(tmp_path / "nvcc.log")
    assert 1 <= at_once <= 2, (at_once, rep["plan"])
    assert rep["plan"]["jobs"] == 8 and rep["plan"]["budget"] < GIB
    print(f"\nbuild -j 8 in a 1 GiB cgroup: {at_once} compile(s) at once, peak "
          f"{cg.peak() / MIB:.0f} MiB; plan: {rep['plan']['budget_from']}")

    # the same build without the memory policy (a budget the cgroup cannot give) is OOM-killed
    env2 = dict(env, FLASHINFER_WORKSPACE_BASE=str(tmp_path / "ws-naive"), FAKE_NVCC_LOG=str(tmp_path / "n2.log"))
    proc = _build(cg, env2, "--mem-limit", "64G")
    assert proc.returncode != 0 and cg.oom_kills() > 0, (proc.returncode, proc.stderr[-2000:])


RUN_NINJA = """
import json, os, sys, pathlib
import flashinfer_sm120
flashinfer_sm120.install()
import flashinfer.jit.core
from flashinfer.jit.cpp_ext import run_ninja
d = pathlib.Path(sys.argv[1])
err = None
try:
    run_ninja(d, d / "build.ninja", verbose=False)
except Exception as e:
    err = repr(e)[:300]
print("@@" + json.dumps({"MAX_JOBS": os.environ.get("MAX_JOBS"), "err": err,
                         "mode": flashinfer_sm120.status()["mode"]}))
"""


def _six_compiles(d, nvcc):
    d.mkdir(parents=True)
    lines = ["ninja_required_version = 1.3", "rule cuda_compile",
             f"  command = {nvcc} --generate-dependencies-with-compile -MF $out.d -c $in -o $out", ""]
    for i in range(6):
        (d / f"k{i}.cu").write_text("// k\n")
        lines.append(f"build {d}/k{i}.cuda.o: cuda_compile {d}/k{i}.cu")
    (d / "build.ninja").write_text("\n".join(lines) + "\n")


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@needs_flashinfer
def test_flashinfer_run_ninja_follows_the_exported_max_jobs(cgroup_v1_or_v2, fake_tools, tmp_path):
    cg, env = cgroup_v1_or_v2, dict(fake_tools, FLASHINFER_CUDA_ARCH_LIST="12.0")
    cg.set_limit(GIB)
    _six_compiles(tmp_path / "m", os.path.join(env["CUDA_HOME"], "bin", "nvcc"))
    proc = subprocess.run(cg.prefix([sys.executable, "-c", RUN_NINJA, str(tmp_path / "m")]), env=env,
                          capture_output=True, text=True, timeout=300)
    res = json.loads(proc.stdout.split("@@")[-1])
    assert res["mode"] in ("patched", "noop") and res["err"] is None, (res, proc.stderr[-2000:])
    assert res["MAX_JOBS"] is not None and int(res["MAX_JOBS"]) <= 2
    assert cg.oom_kills() == 0 and cgroup_util.max_overlap(tmp_path / "nvcc.log") <= 2

    # FlashInfer alone: ninja's default parallelism (CPUs + 2) runs more than the cgroup holds
    _six_compiles(tmp_path / "m2", os.path.join(env["CUDA_HOME"], "bin", "nvcc"))
    env2 = dict(env, FLASHINFER_SM120_DISABLE="1", FAKE_NVCC_LOG=str(tmp_path / "n2.log"))
    proc = subprocess.run(cg.prefix([sys.executable, "-c", RUN_NINJA, str(tmp_path / "m2")]), env=env2,
                          capture_output=True, text=True, timeout=300)
    # the OOM killer takes the largest process: a compile (ninja fails) or the Python itself
    res = json.loads(proc.stdout.split("@@")[-1]) if "@@" in proc.stdout else {"killed": proc.returncode}
    assert cg.oom_kills() > 0 and (res.get("err") or res.get("killed")), (res, proc.stderr[-1000:])
    assert res.get("MAX_JOBS") is None
