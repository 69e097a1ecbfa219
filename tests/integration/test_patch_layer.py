"""Patch-layer faults from issues 5 and 6, each reproduced in a child process.

Issue 6: 1 (NVML missing while torch sees the GPU), 2 (guard; an explicit arch
target the toolkit cannot build never reaches nvcc), 5 (one JIT dir per
toolkit), 7 (a cleaned CUDA_HOME is reported).  Issue 5: 10 (missing
dependency), 13 (status tells what really happened).
"""

import json
import os

import pytest

from helpers.child import cli, run_py
from helpers.host import needs_flashinfer
from helpers.toolkits import make_toolkit
from helpers.patching import logging_toolkit

STATE = """
import json, os, sys
import flashinfer_sm120 as s
def report(**kw):
    st = s.status()
    kw.update(mode=st["mode"], error=st["error"], summary=st["summary"], steps=st["steps"],
              targets=st["target_cuda_archs"], exported=st["exported"], env_cuda_home=os.environ.get("CUDA_HOME"),
              gpu_source=(st["resolution"] or {}).get("gpu_source"))
    print("@@" + json.dumps(kw))
"""


@needs_flashinfer
def test_nvml_missing_falls_back_to_torch(clean_env, real_nvcc13):
    env = dict(clean_env, FAKE_GPU_CAPS="12.0", FAKE_NVML="missing", FAKE_TORCH_CUDA="13.0")
    out, proc = run_py("import helpers.fakegpu\n" + STATE + "import flashinfer\nreport()\n", env)
    assert out["mode"] == "patched", proc.stderr
    assert out["targets"] == ["sm_120f"]  # not the empty set that brings back the seed crash
    assert out["gpu_source"].startswith("torch.cuda (NVML: nvmlInit failed")
    assert "GPUs from torch.cuda" in out["summary"]
    # a broken nvidia-ml-py (any exception, not only NVMLError) is the same case; FlashInfer
    # imports pynvml itself, so a missing one is not a case that reaches FlashInfer
    broken = ("import helpers.fakegpu, pynvml\n"
              "def init(): raise OSError('broken libnvidia-ml.so.1')\n"
              "pynvml.nvmlInit = init\n")
    out, proc = run_py(broken + STATE + "import flashinfer\nreport()\n", dict(env, FAKE_NVML=""))
    assert out["mode"] == "patched" and out["targets"] == ["sm_120f"], proc.stderr
    assert out["gpu_source"].startswith("torch.cuda (NVML: nvmlInit failed: broken libnvidia-ml.so.1")


@needs_flashinfer
def test_explicit_arch_target_never_reaches_an_nvcc_that_cannot_build_it(clean_env, tmp_path):
    log = tmp_path / "nvcc.log"
    tk = logging_toolkit(tmp_path / "cuda-12.8", "12.8.93", log)
    base = dict(clean_env, FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="12.8", CUDA_HOME=str(tk),
                PATH=f"{tk}/bin:{os.environ['PATH']}")
    build = """
from flashinfer.jit.sampling import gen_sampling_module
def build():
    try:
        gen_sampling_module().build_and_load()
        return "ran"
    except Exception as e:
        return type(e).__name__ + ": " + str(e)
"""
    # At import: 12.0f asked, only nvcc 12.8 of torch's major -> guard, nothing runs nvcc.
    out, proc = run_py("import helpers.fakegpu\n" + STATE + "import flashinfer\n" + build + "report(build=build())\n",
                       dict(base, FLASHINFER_CUDA_ARCH_LIST="12.0f"))
    assert out["mode"] == "guard", proc.stderr
    assert out["build"].startswith("ToolkitError: flashinfer-sm120 stopped this FlashInfer JIT build")
    assert "sm75" not in out["build"] and "sm_120f" in out["build"]
    assert not log.exists() or "compute_120f" not in log.read_text()
    # nvcc 12.8 builds 120a, as FlashInfer 0.7.4 alone would (noop); then the arch list
    # changes at run time: refused before nvcc.
    code = ("import helpers.fakegpu\n" + STATE + "import flashinfer\n" + build
            + "os.environ['FLASHINFER_CUDA_ARCH_LIST'] = '12.0f'\nreport(build=build())\n")
    out, proc = run_py(code, base)
    assert out["mode"] in ("noop", "patched") and out["targets"] == ["sm_120a"], proc.stderr
    assert "sm_120f cannot be built by nvcc 12.8" in out["build"] and "FLASHINFER_CUDA_ARCH_LIST='12.0f'" in out["build"]
    assert not log.exists() or "compute_120f" not in log.read_text()


@needs_flashinfer
def test_each_toolkit_gets_its_own_jit_dir(clean_env, real_nvcc13):
    if not os.path.isfile("/usr/local/cuda-13.0/bin/nvcc") or "/usr/local/cuda-13.0" == real_nvcc13:
        pytest.skip("needs two CUDA 13 toolkits: pip nvcc and /usr/local/cuda-13.0")
    env = dict(clean_env, FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0")
    code = "import helpers.fakegpu\n" + STATE + f"PIP = {real_nvcc13!r}\n" + """
import flashinfer, flashinfer.jit.env as e
dirs, prebuilt = [], []
for home in (PIP, "/usr/local/cuda-13.0", PIP, "/usr/local/cuda-13.0"):
    s.revert()
    os.environ["CUDA_HOME"] = home
    st = s.install()
    dirs.append([str(e.FLASHINFER_JIT_DIR), st["resolution"]["choice"]["toolkit"]["root"]])
    prebuilt.append([str(e.FLASHINFER_CUBIN_DIR), str(e.FLASHINFER_AOT_DIR)])
s.revert()
alone = [str(e.FLASHINFER_CUBIN_DIR), str(e.FLASHINFER_AOT_DIR)]
report(dirs=dirs, prebuilt=prebuilt, alone=alone)
"""
    out, proc = run_py(code, env)
    (a, ra), (b, rb), (c, _), (d, _) = out["dirs"]
    assert ra != rb, out  # two different toolkits were chosen ...
    assert a != b and a == c and b == d  # ... each with its own, stable JIT dir
    assert os.path.dirname(os.path.dirname(a)) == os.path.dirname(os.path.dirname(b))  # same arch dir
    # prebuilt cubins and AOT modules are still looked up where FlashInfer alone looks
    assert all(p == out["alone"] for p in out["prebuilt"])
    assert out["alone"][0] == os.path.join(env["FLASHINFER_WORKSPACE_BASE"], ".cache", "flashinfer", "cubins")


@needs_flashinfer
@pytest.mark.parametrize("value", [":{tk}", "{tk}/bin", "{tk}/bin/nvcc"])
def test_cleaned_cuda_home_is_reported(clean_env, real_nvcc13, value):
    env = dict(clean_env, FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0",
               CUDA_HOME=value.format(tk=real_nvcc13))
    out, proc = run_py("import helpers.fakegpu\n" + STATE + "import flashinfer\nreport()\n", env)
    assert out["mode"] in ("patched", "noop")
    assert f"CUDA_HOME={env['CUDA_HOME']!r} " in out["summary"] and f"read as {real_nvcc13!r}" in out["summary"]
    assert f"Fix: export CUDA_HOME={real_nvcc13}" in out["summary"]
    assert proc.stderr.count(f"Fix: export CUDA_HOME={real_nvcc13}") == 1, proc.stderr  # said once, in the summary


@pytest.mark.parametrize("dep", ["wrapt", "packaging", "packaging.version"])
def test_missing_dependency_never_breaks_import(clean_env, dep):
    code = (f"import sys, json\nsys.modules[{dep!r}] = None\nimport flashinfer_sm120 as s\n"
            "st = s.install(); print('@@' + json.dumps({'mode': st['mode'], 'error': st['error']}))\n")
    out, proc = run_py(code, clean_env)
    assert out["mode"] == "failed" and dep.split(".")[0] in out["error"]
    assert proc.stderr.count("flashinfer-sm120 cannot load") == 1 and "Traceback" not in proc.stderr


@needs_flashinfer
def test_flashinfer_failing_at_import_is_not_reported_patched(clean_env, real_nvcc13):
    env = dict(clean_env, FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0")
    code = "import helpers.fakegpu\n" + STATE + """
import importlib.abc
class Boom(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "flashinfer.jit.cpp_ext":
            raise ImportError("injected: cpp_ext cannot be imported")
sys.meta_path.insert(0, Boom())
try:
    import flashinfer
    raised = None
except ImportError as exc:
    raised = str(exc)
report(raised=raised)
"""
    out, proc = run_py(code, env)
    assert out["raised"] and out["mode"] == "failed", out
    assert "FlashInfer raised during its own import" in out["error"]
    assert out["env_cuda_home"] is None and out["exported"] == {}


@needs_flashinfer
def test_renamed_current_compilation_context_is_not_reported_patched(clean_env, real_nvcc13):
    env = dict(clean_env, FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0")
    code = """
import wrapt, helpers.fakegpu
def rename(mod):
    mod.renamed_context = mod.__dict__.pop("current_compilation_context")
wrapt.register_post_import_hook(rename, "flashinfer.jit.core")  # runs before ours
""" + STATE + """
try:  # FlashInfer's own modules import the old name too, so its import fails as well
    import flashinfer
except ImportError:
    pass
report()
"""
    out, proc = run_py(code, env)
    assert out["mode"] == "failed" and "current_compilation_context" in out["error"], out
    assert out["env_cuda_home"] is None and out["exported"] == {}
    assert "every change was undone" in proc.stderr


@needs_flashinfer
def test_doctor_shows_gpu_source_guard_cleaned_home_and_release(clean_env, tmp_path, real_nvcc13):
    fake = make_toolkit(tmp_path / "cuda-12.8")
    env = dict(clean_env, FAKE_GPU_CAPS="12.1", FAKE_NVML="missing", FAKE_TORCH_CUDA="12.8",
               CUDA_HOME=f":{fake}")
    proc = cli(["doctor", "--json", "--timeout", "60"], env, 600, fakegpu=True)
    r = json.loads(proc.stdout)
    assert r["gpu_source"].startswith("torch.cuda (NVML: nvmlInit failed") and r["gpus"][0]["capability"] == "12.1"
    assert r["guard"] is True and "sm_121a" in r["resolution_error"]
    assert r["after"]["status"]["mode"] == "guard"
    assert {"variable": "CUDA_HOME", "value": f":{fake}", "why": f"malformed, read as {str(fake)!r}",
            "fix": f"export CUDA_HOME={fake}"} in r["settings"]
    assert r["release"]["era"] == "sm120a-12.8" and r["release"]["min_nvcc"] == "12.8"
    # the human report is printed from the same report (one doctor run, and its child, fewer)
    from flashinfer_sm120.cli import doctor

    human = "\n".join(doctor.render(r, verbose=True))
    assert '"gpu_source": "torch.cuda (NVML' in human and '"guard": true' in human and '"resolution_error": ' in human
    assert f"WARNING: CUDA_HOME=':{fake}' was not used as given" in human and '"arch_rules": ' in human
    assert human.startswith("PROBLEM: no CUDA toolkit found here can build for these targets")
    short = doctor.render(r)
    assert short[0].startswith("PROBLEM: ") and "era sm120a" not in "\n".join(short)


def test_guard_when_flashinfer_alone_cannot_import_says_so_with_the_fix(clean_env, tmp_path):
    """A CPU torch and no nvcc anywhere: FlashInfer's own import needs an nvcc for SM 12.x
    targets, so it raises with or without flashinfer-sm120.  The message must say that and
    give the guard's fix, not ask for a bug report (P8)."""
    import shutil
    import subprocess
    import sys
    import textwrap

    from helpers.host import real_toolkit_dirs

    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-m", "--propagation", "private", "true"], capture_output=True).returncode:
        pytest.skip("private mount namespaces unavailable (unshare -m)")
    empty = tmp_path / "empty"
    empty.mkdir()
    hide = [p for p in real_toolkit_dirs() + ["/usr/local/bin/nvcc", "/usr/bin/nvcc"] if os.path.exists(p)]
    mounts = " && ".join(f"mount --bind {empty if os.path.isdir(p) else '/dev/null'} {p}" for p in hide) or "true"
    code = textwrap.dedent("""
        import json, flashinfer_sm120
        try:
            import flashinfer
            out = {"imported": True}
        except Exception as exc:
            out = {"imported": False, "raised": repr(exc)[:300]}
        st = flashinfer_sm120.status()
        out.update(mode=st["mode"], error=st["error"])
        print("@@" + json.dumps(out))
    """)
    env = dict(clean_env, FLASHINFER_CUDA_ARCH_LIST="12.0", PATH="/usr/bin:/bin")
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           f'{mounts} && exec "$0" -c "$1"', sys.executable, code],
                          capture_output=True, text=True, env=env, timeout=300)
    line = [x for x in proc.stdout.splitlines() if x.startswith("@@")]
    assert line, proc.stderr[-3000:]
    out = json.loads(line[-1][2:])
    if out["imported"]:
        pytest.skip("this FlashInfer release imports without an nvcc: nothing to report")
    assert out["mode"] == "failed"
    assert "fails the same way without flashinfer-sm120" in out["error"] and "Fix: pip install" in out["error"]
    assert "Please report" not in proc.stderr, proc.stderr[-2000:]


@needs_flashinfer
def test_no_targets_at_import_names_the_fix(clean_env, real_nvcc13):
    """No GPU and no arch list: the import-time line says what to set (P1: the message names the fix)."""
    env = dict(clean_env, FAKE_GPU_CAPS="", FAKE_TORCH_CUDA="13.0")
    out, proc = run_py("import helpers.fakegpu\n" + STATE + "import flashinfer\nreport()\n", env)
    assert out["targets"] == [], proc.stderr
    assert "none (no GPU visible, no FLASHINFER_CUDA_ARCH_LIST; Fix: set e.g. FLASHINFER_CUDA_ARCH_LIST=12.0" \
        in out["summary"]


@needs_flashinfer
@pytest.mark.parametrize("own_version, drop, kept, said", [("13.0.88", None, True, False),
                                                         ("13.0.88", "lib64/stubs/libcuda.so", True, True),
                                                         ("12.8.93", None, False, True)])
def test_flashinfer_own_toolkit_kept_quietly_or_replaced_with_a_warning(clean_env, tmp_path, real_nvcc13,
                                                                          own_version, drop, kept, said):
    """A CPU torch and FlashInfer's own nvcc on PATH: a CUDA 13 one builds sm_120f, so it is kept and
    nothing is printed (docs/using.md); kept in a view because FlashInfer could not link with its own
    CUDA_HOME (no lib64/stubs/libcuda.so: -lcuda fails without a driver's libcuda.so), the change is said;
    a 12.x one is replaced and said (P1)."""
    tk = make_toolkit(tmp_path / f"cuda-{own_version}", own_version, curand=True)
    if drop:
        (tk / drop).unlink()
    env = dict(clean_env, FAKE_GPU_CAPS="12.0", PATH=f"{tk}/bin:{os.environ['PATH']}")
    env.pop("FAKE_TORCH_CUDA", None)
    out, proc = run_py("import helpers.fakegpu\n" + STATE + "import flashinfer\nreport()\n", env)
    assert out["mode"] in ("patched", "noop"), proc.stderr
    assert (f"from {tk} [PATH" in out["summary"]) is kept, out["summary"]
    assert ("flashinfer-sm120:" in proc.stderr) is said, proc.stderr


@needs_flashinfer
def test_flashinfer_nvcc_still_wins_over_the_nvcc_on_path(clean_env, tmp_path, real_nvcc13):
    """FLASHINFER_NVCC is FlashInfer 0.7's own nvcc and first in the search: a working nvcc on PATH
    (what get_cuda_path() would give) does not take its place."""
    tk = make_toolkit(tmp_path / "cuda-13.0.88", "13.0.88", curand=True)
    env = dict(clean_env, FAKE_GPU_CAPS="12.0", PATH=f"{tk}/bin:{os.environ['PATH']}",
               FLASHINFER_NVCC=os.path.join(real_nvcc13, "bin", "nvcc"))
    out, proc = run_py("import helpers.fakegpu\n" + STATE + "import flashinfer\nreport()\n", env)
    assert out["mode"] in ("patched", "noop"), proc.stderr
    assert "[FLASHINFER_NVCC" in out["summary"] and f"from {tk} " not in out["summary"], out["summary"]
