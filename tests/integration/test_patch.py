"""FlashInfer patched for real, in child processes (patching is process-wide).

The seed: a fake nvcc 12.8 first on PATH and as CUDA_HOME, a real CUDA 13 nvcc
elsewhere (pip wheel or /usr/local/cuda-13.x), and a simulated GPU.
"""

import os

import pytest

from helpers.child import run_py
from helpers.host import needs_flashinfer
from helpers.toolkits import make_toolkit

pytestmark = needs_flashinfer

REPORT = """
import json, os, sys
import flashinfer.jit.core as core, flashinfer.jit.cpp_ext as cx, flashinfer.jit.env as jit_env
from flashinfer.compilation_context import CompilationContext
import flashinfer_sm120.core.patch as p
bad_bindings = sorted(
    f"{n}.{a}" for n, m in list(sys.modules.items()) if n.startswith("flashinfer.") and m
    for a in ("get_cuda_version", "get_cuda_path") if a in vars(m) and vars(m)[a] is not cx.get_cuda_version
    and vars(m)[a] is not cx.get_cuda_path)
out = dict(
    version=str(cx.get_cuda_version()), path=cx.get_cuda_path(),
    nvcc_real=os.path.realpath(os.path.join(cx.get_cuda_path(), "bin", "nvcc")),
    current=sorted(map(list, core.current_compilation_context.TARGET_CUDA_ARCHS)),
    fresh=sorted(map(list, CompilationContext().TARGET_CUDA_ARCHS)),
    jit_dir=str(jit_env.FLASHINFER_JIT_DIR), env_cuda_home=os.environ.get("CUDA_HOME"),
    status=p.status(), bad_bindings=bad_bindings,
    normalize_wrapped=type(vars(CompilationContext)["_normalize_cuda_arch"].__func__).__name__,
)
print("@@" + json.dumps(out))
"""


@pytest.fixture
def seed_env(clean_env, tmp_path, real_nvcc13):
    fake = make_toolkit(tmp_path / "cuda-12.8")
    env = dict(clean_env)
    env["PATH"] = f"{fake}/bin:{env['PATH']}"
    env["CUDA_HOME"] = str(fake)
    env["FAKE_GPU_CAPS"] = "12.0"
    env["FAKE_TORCH_CUDA"] = "13.0"
    env["SEED_FAKE"] = str(fake)
    return env


@pytest.mark.parametrize("order", ["shim_first", "flashinfer_first"])
def test_seed_fixed_whatever_the_import_order(seed_env, order):
    pre = ("import helpers.fakegpu, flashinfer_sm120, flashinfer" if order == "shim_first"
           else "import helpers.fakegpu, flashinfer, flashinfer_sm120")
    out, proc = run_py(pre + "\n" + REPORT, seed_env)
    assert out["status"]["mode"] == "patched", proc.stderr
    assert out["version"].startswith("13."), out
    assert out["current"] == [[12, "0f"]] and out["fresh"] == [[12, "0f"]]
    ws = os.path.dirname(out["jit_dir"])  # .../<flashinfer>/120f/nvcc13.x.y-<fingerprint>
    assert os.path.basename(os.path.dirname(ws)) == "120f"
    assert os.path.basename(ws).startswith("nvcc" + out["status"]["resolution"]["choice"]["toolkit"]["nvcc_full"])
    assert out["path"] == out["env_cuda_home"] != seed_env["SEED_FAKE"]
    assert not out["nvcc_real"].startswith(seed_env["SEED_FAKE"])
    assert out["bad_bindings"] == []
    assert out["normalize_wrapped"] == "FunctionWrapper"
    # it tells the user what it did, since it overrode their CUDA_HOME
    assert "patched FlashInfer" in proc.stderr and seed_env["SEED_FAKE"] in proc.stderr


def test_unpatched_flashinfer_has_the_seed_bug(seed_env):
    env = dict(seed_env, FLASHINFER_SM120_DISABLE="1", FAKE_GPU_CAPS="12.1")
    out, _ = run_py("import helpers.fakegpu, flashinfer_sm120, flashinfer\n" + REPORT, env)
    assert out["status"]["mode"] == "disabled"
    assert out["version"] == "12.8" and out["path"] == seed_env["SEED_FAKE"]
    assert out["current"] == []  # SM 12.1 on nvcc 12.8: FlashInfer gives up, set stays empty


def test_sm121_gets_121a(seed_env):
    out, _ = run_py("import helpers.fakegpu, flashinfer_sm120\n" + REPORT, dict(seed_env, FAKE_GPU_CAPS="12.1"))
    assert out["current"] == [[12, "1a"]] and out["fresh"] == [[12, "1a"]]


def test_mixed_gpus_and_visible_devices(seed_env):
    env = dict(seed_env, FAKE_GPU_CAPS="9.0 12.0 12.1", CUDA_VISIBLE_DEVICES="2,0")
    out, _ = run_py("import helpers.fakegpu, flashinfer_sm120\n" + REPORT, env)
    assert out["current"] == [[9, "0a"], [12, "1a"]]


def test_revert_restores_flashinfer(seed_env):
    code = "import helpers.fakegpu, flashinfer_sm120, flashinfer\nflashinfer_sm120.revert()\n" + REPORT
    out, _ = run_py(code, seed_env)
    assert out["status"]["mode"] == "reverted"
    assert out["path"] == seed_env["SEED_FAKE"] == out["env_cuda_home"]
    assert out["version"] == "12.8"
    assert out["normalize_wrapped"] == "function"
    assert [12, "0f"] not in out["current"]


def test_install_after_revert_patches_again(seed_env):
    code = ("import helpers.fakegpu, flashinfer_sm120, flashinfer\nflashinfer_sm120.revert()\n"
            "flashinfer_sm120.install()\n" + REPORT)
    out, _ = run_py(code, seed_env)
    assert out["status"]["mode"] == "patched" and out["current"] == [[12, "0f"]]


def test_failure_midway_rolls_everything_back(seed_env):
    code = (
        "import helpers.fakegpu\nimport flashinfer_sm120.core.patch.steps as s\n"
        "def boom(mod): raise RuntimeError('injected failure')\n"
        "s.STEPS['flashinfer.jit.cpp_ext'].insert(0, s.Step('boom', boom, frozenset({s.Mode.PATCHED})))\n"
        "import flashinfer_sm120, flashinfer\n" + REPORT
    )
    out, proc = run_py(code, seed_env)
    assert out["status"]["mode"] == "failed" and "injected failure" in out["status"]["error"]
    assert out["normalize_wrapped"] == "function"  # the class patch applied earlier was undone
    assert out["env_cuda_home"] == seed_env["SEED_FAKE"]  # CUDA_HOME restored
    assert out["version"] == "12.8"
    assert "every change was undone" in proc.stderr


@pytest.mark.parametrize("value", ["blackwell", "12.0 hopper"])
def test_garbled_arch_list_does_not_break_import(seed_env, value):
    env = dict(seed_env, FLASHINFER_CUDA_ARCH_LIST=value)
    # FlashInfer alone crashes at import on this value ...
    out, _ = run_py("import helpers.fakegpu\ntry:\n    import flashinfer\n    print('@@' + '{\"ok\": true}')\n"
                    "except Exception as e:\n    import json; print('@@' + json.dumps({'error': repr(e)}))\n",
                    dict(env, FLASHINFER_SM120_DISABLE="1"))
    assert "error" in out
    # ... with the shim the import works, the value is named, and the GPU is targeted.
    out, proc = run_py("import helpers.fakegpu, flashinfer_sm120\n" + REPORT, env)
    assert out["current"] == [[12, "0f"]]
    assert f"FLASHINFER_CUDA_ARCH_LIST={value!r}" in proc.stderr
    # with no usable entry the targets come from the GPUs: a field, and words in the summary
    usable = value != "blackwell"
    assert out["status"]["resolution"]["targets_from"] == ("arch_list" if usable else "gpus")
    assert (f"(from FLASHINFER_CUDA_ARCH_LIST={value!r})" if usable else "(GPUs from ") in out["status"]["summary"]


def test_arch_list_spelling_flashinfer_rejects_is_accepted(seed_env):
    env = dict(seed_env, FLASHINFER_CUDA_ARCH_LIST="sm_120,sm_121", FAKE_GPU_CAPS="")
    out, _ = run_py("import helpers.fakegpu, flashinfer_sm120\n" + REPORT, env)
    assert out["current"] == [[12, "0f"], [12, "1a"]]


def test_bad_cuda_home_falls_back_and_never_breaks_import(seed_env, tmp_path):
    env = dict(seed_env, CUDA_HOME=str(tmp_path / "no-such-cuda"))
    out, proc = run_py("import helpers.fakegpu, flashinfer_sm120\n" + REPORT, env)
    assert out["status"]["mode"] == "patched" and out["version"].startswith("13.")
    cands = out["status"]["resolution"]["choice"]["rejected"]
    assert any("does not exist" in c["reason"] and "no-such-cuda" in c["reason"] for c in cands)
    # the one line printed at import says why the user's CUDA_HOME was not used
    assert f"CUDA_HOME='{tmp_path / 'no-such-cuda'}'" in proc.stderr and "Fix: unset CUDA_HOME" in proc.stderr


def test_noop_when_flashinfer_already_resolves_correctly(seed_env):
    code = ("import helpers.fakegpu, os, flashinfer_sm120\n"
            "os.environ['CUDA_HOME'] = flashinfer_sm120.resolve().home.path\n" + REPORT)
    out, _ = run_py(code, seed_env)
    assert out["status"]["mode"] == "noop", out["status"]
    assert "already resolves correctly" in out["status"]["summary"]
    assert out["normalize_wrapped"] == "function"
    assert out["current"] == [[12, "0f"]] and out["version"].startswith("13.")


def test_nothing_usable_guards_flashinfer(clean_env, tmp_path):
    env = dict(clean_env, FAKE_GPU_CAPS="12.1", FAKE_TORCH_CUDA="11.8",
               CUDA_HOME=str(make_toolkit(tmp_path / "cuda-12.8")))
    code = ("import helpers.fakegpu, flashinfer_sm120\n" + REPORT.replace('print("@@"', 'out0 = out #')
            + "from flashinfer.jit.sampling import gen_sampling_module\n"
            + "try:\n    gen_sampling_module().build_and_load()\n    out['build'] = 'ran'\n"
            + "except Exception as e:\n    out['build'] = type(e).__name__ + ': ' + str(e)\n"
            + "print('@@' + json.dumps(out))\n")
    out, proc = run_py(code, env)
    assert out["status"]["mode"] == "guard" and "no CUDA toolkit can build sm_121a" in out["status"]["error"]
    # FlashInfer keeps its own toolkit and arch logic; only its JIT entry points are guarded
    assert out["normalize_wrapped"] == "function" and out["env_cuda_home"] == env["CUDA_HOME"]
    assert out["build"].startswith("ToolkitError: flashinfer-sm120 stopped this FlashInfer JIT build")
    assert "no CUDA toolkit can build sm_121a" in out["build"] and "sm75" not in out["build"]
    assert "guarding FlashInfer" in proc.stderr


def test_explicit_install_retries_after_failure(clean_env, tmp_path):
    env = dict(clean_env, FAKE_GPU_CAPS="12.1", FAKE_TORCH_CUDA="11.8",
               CUDA_HOME=str(make_toolkit(tmp_path / "cuda-12.8")))
    code = ("import helpers.fakegpu, flashinfer_sm120, flashinfer, torch\n"
            "assert flashinfer_sm120.status()['mode'] == 'guard'\n"
            "torch.version.cuda = '13.0'  # e.g. the user fixed their environment\n"
            "flashinfer_sm120.install()\n" + REPORT)
    out, _ = run_py(code, env)
    assert out["status"]["mode"] == "patched" and out["current"] == [[12, "1a"]]


def test_one_bad_arch_entry_keeps_the_good_ones(seed_env):
    env = dict(seed_env, FLASHINFER_CUDA_ARCH_LIST="12.1 garbage", FAKE_GPU_CAPS="")
    out, proc = run_py("import helpers.fakegpu, flashinfer_sm120\n" + REPORT, env)
    assert out["current"] == [[12, "1a"]]
    assert "'garbage'" in proc.stderr and "using 12.1" in proc.stderr
    assert out["status"]["resolution"]["targets_from"] == "arch_list"
    assert "(from FLASHINFER_CUDA_ARCH_LIST='12.1 garbage')" in out["status"]["summary"]


def test_an_optional_step_that_raises_is_reported_skipped(seed_env):
    """An optional step that raises is skipped, with why, in status() and in the summary."""
    code = (
        "import helpers.fakegpu\nimport flashinfer_sm120.core.patch.steps as s\n"
        "def boom(mod): raise RuntimeError('injected')\n"
        "s.STEPS['flashinfer.compilation_context'].insert(0, s.Step('extra', boom, frozenset({s.Mode.PATCHED}), required=False))\n"
        "import flashinfer_sm120, flashinfer\n" + REPORT
    )
    out, proc = run_py(code, seed_env)
    st = out["status"]
    assert st["mode"] == "patched", proc.stderr
    assert st["steps"]["extra"] == "skipped: RuntimeError('injected')" and st["steps"]["toolkit"] == "applied"
    assert st["summary"].endswith("; steps skipped: extra (RuntimeError('injected'))")


@pytest.mark.parametrize("value, mode", [("false", "patched"), ("off", "patched"), ("0", "patched"),
                                         ("yes", "disabled"), ("1", "disabled")])
def test_disable_flag_values(seed_env, value, mode):
    out, _ = run_py("import helpers.fakegpu, flashinfer_sm120\n" + REPORT, dict(seed_env, FLASHINFER_SM120_DISABLE=value))
    assert out["status"]["mode"] == mode


def test_child_inheriting_our_cuda_home_is_a_noop_on_the_same_toolkit(seed_env):
    code = ("import helpers.fakegpu, flashinfer_sm120, flashinfer, subprocess, sys, json, os\n"
            "child = subprocess.run([sys.executable, '-c', 'import helpers.fakegpu, flashinfer_sm120, flashinfer;"
            "import json; s = flashinfer_sm120.status(); print(json.dumps([s[\\'mode\\'], "
            "s[\\'resolution\\'][\\'choice\\'][\\'toolkit\\'][\\'root\\']]))'],"
            " capture_output=True, text=True).stdout\n"
            "mine = flashinfer_sm120.status()['resolution']['choice']['toolkit']['root']\n"
            "print('@@' + json.dumps({'child': json.loads(child.splitlines()[-1]), 'mine': mine}))\n")
    out, _ = run_py(code, seed_env)
    assert out["child"] == ["noop", out["mine"]]


def test_the_guard_points_are_the_release_table_s(seed_env):
    """The steps wrap what releases.guard_points lists (it was never read; the steps named their own)."""
    code = (
        "import helpers.fakegpu\nimport flashinfer_sm120.core.facts.releases as r\n"
        "r._GUARD = tuple(p for p in r._GUARD if p[1] != 'run_ninja')\n"
        "import flashinfer_sm120, flashinfer, flashinfer.jit.cpp_ext as cx, flashinfer.jit.core as core\n"
        "import json, wrapt\n"
        "w = lambda f: isinstance(f, wrapt.FunctionWrapper)\n"
        "print('@@' + json.dumps(dict(gen=w(cx.generate_ninja_build_for_op), run=w(cx.run_ninja),\n"
        "    check=w(core.check_cuda_arch), steps=flashinfer_sm120.status()['steps'])))\n"
    )
    out, proc = run_py(code, seed_env)
    assert (out["gen"], out["run"], out["check"]) == (True, False, True), (out, proc.stderr[-2000:])
    assert out["steps"]["nvcc_gate"] == "applied" and out["steps"]["arch_check"] == "applied"
