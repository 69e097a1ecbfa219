"""The patch against one FlashInfer release of each era of its arch rules.

Eras (see ``flashinfer_sm120/core/facts/releases.py``): 0.4.x has no ``_normalize_cuda_arch``
(SM 9+ gets ``a``, so SM120 -> 120a); 0.5.0 - 0.6.7 map every SM 12.x to 120f;
0.6.8 - 0.7.0 give SM121 its own 121a; 0.7.1+ accept SM120 on CUDA 12.8 as 120a.
Older releases are fetched once with ``pip download --no-deps`` into
``$FLASHINFER_SM120_TEST_WHEELS`` (default ``~/.cache/flashinfer-sm120-test-wheels``)
and put first on ``PYTHONPATH``; their dependencies are the installed ones.
0.4.x exists only as an sdist: its pure-Python ``flashinfer/`` package is
extracted (nothing is built), which is all a ninja-file test needs.
"""

import os

import pytest

from helpers.child import run_py
from helpers.host import needs_flashinfer, release_dir
from helpers.toolkits import make_toolkit

pytestmark = needs_flashinfer

#: The old releases are downloaded (once, into wheels_dir()): slow; the installed one is not.
RELEASES = [pytest.param(v, marks=pytest.mark.slow) for v in ("0.4.0", "0.6.7", "0.6.17")] + ["installed"]

REPORT = """
import json, os, helpers.fakegpu, flashinfer_sm120, flashinfer
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



@pytest.fixture(params=RELEASES)
def release_env(request, clean_env, tmp_path, real_nvcc13):
    env = dict(clean_env, FAKE_TORCH_CUDA="13.0")
    target = release_dir(request.param)
    if target:
        env["PYTHONPATH"] = target + os.pathsep + env["PYTHONPATH"]
    fake = make_toolkit(tmp_path / "cuda-12.8")
    env["PATH"] = f"{fake}/bin:{env['PATH']}"
    env["CUDA_HOME"] = str(fake)
    return request.param, env, str(fake)


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
def test_release_seed_and_fix(release_env):
    release, env, fake = release_env
    # unpatched: SM121 on nvcc 12.8 ends with an empty arch set (0.4.x: 121a, which 12.8 cannot build)
    out, _ = run_py(REPORT, dict(env, FAKE_GPU_CAPS="12.1", FLASHINFER_SM120_DISABLE="1"))
    if release != "installed":
        assert out["release"] == release
    if release == "0.4.0":
        assert out["version"] == "12.8" and out["current"] == [[12, "1a"]]
    else:
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
    # an arch list without suffix: 0.4.x alone would build plain compute_120 (trap stubs on SM120)
    out, proc = run_py(REPORT, dict(env, FAKE_GPU_CAPS="12.0", FLASHINFER_CUDA_ARCH_LIST="12.0"))
    assert out["current"] == [[12, "0f"]] and "compute_120f,code=sm_120f" in out["ninja"], proc.stderr[-2000:]
    assert "compute_120," not in out["ninja"]


def test_release_noop_only_where_flashinfer_agrees(release_env):
    release, env, _ = release_env
    code = ("import helpers.fakegpu, os, flashinfer_sm120\n"
            "os.environ['CUDA_HOME'] = flashinfer_sm120.resolve().home.path\n") + REPORT
    out, _ = run_py(code, dict(env, FAKE_GPU_CAPS="12.1"))
    assert out["current"] == [[12, "1a"]]
    # 0.6.7 builds SM121 as 120f even with a right toolkit, so it must be patched
    assert out["mode"] == ("patched" if release == "0.6.7" else "noop")
    assert "sm75" not in out.get("error", "")


def test_release_table_names_each_era():
    from flashinfer_sm120.core.facts.releases import release_info

    eras = {v: release_info(v).era for v in ("0.4.0", "0.5.0", "0.6.7.post3", "0.6.8", "0.6.18rc10",
                                              "0.7.0.post1", "0.7.1", "0.7.4", "0.9.0")}
    assert eras == {"0.4.0": "inline-a", "0.5.0": "sm12x-120f", "0.6.7.post3": "sm12x-120f",
                    "0.6.8": "sm121a", "0.6.18rc10": "sm121a", "0.7.0.post1": "sm121a",
                    "0.7.1": "sm120a-12.8", "0.7.4": "sm120a-12.8", "0.9.0": "sm120a-12.8"}
    assert release_info("0.6.17").min_nvcc is None and str(release_info("0.6.18").min_nvcc) == "12.8"
    old = release_info("0.3.1")
    assert not old.supported and "FlashInfer 0.3.1 is not supported" in old.reason and "not patching" in old.reason


def test_the_release_rows_cover_every_supported_version_once():
    """``release_info`` takes the first row that holds a version: a gap or an overlap between rows is a bug."""
    from flashinfer_sm120.core.facts.releases import RELEASES, SUPPORTED

    bounds = [[s.version for s in sorted(spec, key=lambda s: s.operator != ">=")] for spec, _ in RELEASES]
    assert {s.version for s in SUPPORTED} == {bounds[0][0]} and len(bounds[-1]) == 1
    assert all(high == nxt[0] for (_, high), nxt in zip(bounds[:-1], bounds[1:])), bounds
    assert all({s.operator for s in spec} <= {">=", "<"} for spec, _ in RELEASES)


def test_unsupported_release_is_left_alone(clean_env, tmp_path):
    # a stand-in FlashInfer 0.3.1: the gate refuses it before any step runs
    pkg = tmp_path / "old" / "flashinfer"
    (pkg / "jit").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import compilation_context\n")
    (pkg / "version.py").write_text("__version__ = '0.3.1'\n")
    (pkg / "compilation_context.py").write_text("class CompilationContext:\n    pass\n")
    env = dict(clean_env, PYTHONPATH=f"{tmp_path / 'old'}{os.pathsep}{clean_env['PYTHONPATH']}")
    out, proc = run_py("import json, flashinfer_sm120, flashinfer\nst = flashinfer_sm120.status()\n"
                       "print('@@' + json.dumps(st))\n", env)
    assert out["mode"] == "failed" and "FlashInfer 0.3.1 is not supported" in out["error"]
    assert out["steps"] == {} and "not patching" in proc.stderr


def test_0_6_18_needs_nvcc_12_8_for_its_own_flags(clean_env, tmp_path):
    # torch cu126, an H100 and only nvcc 12.6: FlashInfer 0.6.18 passes --compress-mode=size,
    # which nvcc 12.6 rejects, so the shim guards instead of reporting noop.
    target = release_dir("0.6.18")
    fake = make_toolkit(tmp_path / "cuda-12.6", "12.6.85")
    env = dict(clean_env, FAKE_TORCH_CUDA="12.6", FAKE_GPU_CAPS="9.0", CUDA_HOME=str(fake),
               PYTHONPATH=target + os.pathsep + clean_env["PYTHONPATH"])
    out, proc = run_py(REPORT, env)
    assert out["release"] == "0.6.18" and out["mode"] == "guard", proc.stderr[-2000:]
    assert "compress-mode" in proc.stderr
    assert out["error"].startswith("ToolkitError") and "sm75" not in out["error"]


def test_offline_release_download_skips_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_SM120_TEST_WHEELS", str(tmp_path / "wheels"))
    empty = tmp_path / "no-index"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # as offline: no index, an empty find-links
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    with pytest.raises(pytest.skip.Exception) as exc:
        release_dir("0.6.7")
    msg = str(exc.value)
    assert "cannot download flashinfer-python==0.6.7" in msg and "FLASHINFER_SM120_TEST_WHEELS" in msg
    assert str(tmp_path / "wheels") in msg
