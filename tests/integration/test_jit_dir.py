"""Where FlashInfer builds: a JIT directory another user can change is refused (P2, P4).

``build`` writes no ``build.ninja`` file and runs no ninja in a JIT directory
under a directory another user owns or everyone may write (``sudo`` keeping another user's ``HOME``;
a shared ``FLASHINFER_WORKSPACE_BASE``), where that user could replace a level and swap the
``build.ninja`` ninja runs or the ``.so`` the server loads.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers.untrusted import make_unsafe
from helpers.child import cli
from helpers.host import needs_flashinfer

pytestmark = needs_flashinfer


def _build(env):
    return cli(["build", "--ninja-only", "--arch", "12.0", "sampling"], env, 600, python=sys.executable)


@pytest.mark.parametrize("how", ["world-writable", "another user's"])
def test_a_jit_directory_another_user_can_change_is_refused(clean_env, tmp_path, how):
    base = tmp_path / "base"
    base.mkdir()
    make_unsafe(base, how)
    env = dict(clean_env, FLASHINFER_WORKSPACE_BASE=str(base))
    proc = _build(env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out, out[-3000:]
    # refused before FlashInfer's import could create its cache (and open its log) in it (P4)
    said = "would be created inside" if how == "another user's" else "is not a place of yours"
    assert said in out and str(base) in out and "FLASHINFER_WORKSPACE_BASE" in out, out[-3000:]
    assert not (base / ".cache").exists()


def test_a_jit_directory_of_your_own_is_used(clean_env, tmp_path):
    env = dict(clean_env, FLASHINFER_WORKSPACE_BASE=str(tmp_path / "mine"))
    proc = _build(env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert list((tmp_path / "mine").rglob("build.ninja"))


LOAD = """
import json, helpers.fakegpu, flashinfer_sm120
from flashinfer.jit.sampling import gen_sampling_module
try:
    gen_sampling_module().build_and_load()
    print("@@" + json.dumps("loaded"))
except Exception as e:
    print("@@" + json.dumps(type(e).__name__ + ": " + str(e)))
"""


def test_a_module_in_a_jit_directory_others_can_change_is_neither_built_nor_loaded(clean_env, tmp_path):
    """With FLASHINFER_WORKSPACE_BASE in a tree another uid made (mode 777), a warning is not enough:
    FlashInfer would find the .so they planted up to date and load it, so it is neither built nor loaded (P2)."""
    from helpers.child import run_py
    from helpers.toolkits import make_toolkit

    tk = make_toolkit(tmp_path / "cuda-13.0", "13.0.88", curand=True)
    base = tmp_path / "base"
    base.mkdir()
    make_unsafe(base, "world-writable")
    env = dict(clean_env, CUDA_HOME=str(tk), FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0",
               FLASHINFER_WORKSPACE_BASE=str(base))
    out, proc = run_py(LOAD, env)
    assert out.startswith("ToolkitError: flashinfer-sm120 stopped this FlashInfer JIT build before nvcc ran"), out
    assert str(base) in out and "FLASHINFER_WORKSPACE_BASE" in out and "Fix:" in out, out
    assert not list(base.rglob("*.so")) and not list(base.rglob("build.ninja"))


# --------------------------------------------------------------------------- FlashInfer's JIT directory as ninja reads it

def _build_ninja_only(env, *extra):
    return cli(["build", "--ninja-only", "--arch", "12.0", *extra, "norm"], env, fakegpu=True)


@pytest.mark.parametrize("var,value,escaped", [
    ("FLASHINFER_WORKSPACE_BASE", "w$s", "w"),   # ninja reads '$s' as a variable: the .so went to <tmp>/w/...
    ("FLASHINFER_WORKSPACE_BASE", "w s", None),  # a space splits ninja's build line
    ("SGLANG_CACHE_DIR", "a:b", None),           # ':' ends the outputs of a build line
])
def test_a_jit_directory_ninja_cannot_carry_is_refused(clean_env, tmp_path, var, value, escaped):
    """FlashInfer writes its JIT directory unquoted into build.ninja: ``build --ninja-only`` said
    "ninja written" for a directory whose ``$`` made ninja build into another directory."""
    env = dict(clean_env, HOME=str(tmp_path))
    if var == "SGLANG_CACHE_DIR":
        env.pop("FLASHINFER_WORKSPACE_BASE")  # SGLang's setdefault keeps a set one
    env[var] = str(tmp_path / value)
    extra = ("--for", "sglang") if var == "SGLANG_CACHE_DIR" else ()
    proc = _build_ninja_only(env, *extra)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert var in proc.stderr and "Fix:" in proc.stderr and "build.ninja" in proc.stderr and "Traceback" not in proc.stderr
    if escaped:
        assert not (tmp_path / escaped).exists()


def test_import_warns_when_flashinfer_jit_directory_breaks_its_ninja_files(clean_env, tmp_path):
    from helpers.child import run_code

    env = dict(clean_env, FLASHINFER_WORKSPACE_BASE=str(tmp_path / "w s"), FLASHINFER_CUDA_ARCH_LIST="12.0")
    proc = run_code("import flashinfer_sm120; flashinfer_sm120.install(); import flashinfer.jit.core", env, 300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "FLASHINFER_WORKSPACE_BASE" in proc.stderr and "build.ninja" in proc.stderr


@pytest.mark.parametrize("how", ["world-writable", "another user's"])
def test_the_patch_warning_and_build_check_the_jit_directory_one_way(tmp_path, how):
    """The patch's warning checked FlashInfer's JIT directory itself, ``build`` also its lock level
    ``tmp``; both now ask :func:`code_dirs_refused`, which checks both (the stricter)."""
    from flashinfer_sm120.core.facts.refusals import builds_refused
    from flashinfer_sm120.core.facts.workspace import code_dirs_refused

    jit = tmp_path / "jit"
    (jit / "tmp").mkdir(parents=True)
    assert code_dirs_refused(str(jit)) is None
    make_unsafe(jit / "tmp", how)
    problem = code_dirs_refused(str(jit))
    assert problem is not None and str(jit / "tmp") in str(problem) and "Fix" in str(problem)
    assert str(problem) in (builds_refused(str(jit)) or "")


# --------------------------------------------------------------------------- CuTe DSL's cache, as a server imports

SERVER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("flashinfer_sm120_autoload", sys.argv[1])
hook = importlib.util.module_from_spec(spec)
sys.modules["flashinfer_sm120_autoload"] = hook
spec.loader.exec_module(hook)
hook.install()  # as the .pth does
import flashinfer, flashinfer_sm120
print("@@" + json.dumps(flashinfer_sm120.status()))
"""


@pytest.mark.parametrize("planted", ["$USER directory", "$USER file"])
def test_a_cute_dsl_cache_another_user_planted_is_refused_by_a_server_import_as_by_status(clean_env, planted):
    """CuTe DSL compiles and runs what it finds in ``$TMPDIR/$USER/cutlass_python_cache``, or, where that cannot be
    made (another uid planted a file ``$USER``), in ``$TMPDIR/cutlass_python_cache``. Another uid's there: the
    server import said ``patched`` without a word while ``status`` refused, naming the wrong directory for a file."""
    import json
    import subprocess

    from helpers import SRC
    from helpers.probing import as_uid, need_root, reachable_dir

    need_root()
    with reachable_dir() as top:
        tmp = top / "tmp"
        tmp.mkdir(mode=0o1777)
        tmp.chmod(0o1777)
        plant = f"mkdir -m 777 {tmp}/root" if planted == "$USER directory" else \
            f"touch {tmp}/root && mkdir -m 777 {tmp}/cutlass_python_cache"
        assert as_uid(4321, ["sh", "-c", plant], clean_env).returncode == 0
        cute = tmp / "root" / "cutlass_python_cache" if planted == "$USER directory" else tmp / "cutlass_python_cache"
        env = dict(clean_env, TMPDIR=str(tmp), USER="root", FLASHINFER_CUDA_ARCH_LIST="12.0")
        env.pop("CUTE_DSL_CACHE_DIR", None)
        for _ in ("first process", "later process"):  # the later one replays the record
            proc = subprocess.run([sys.executable, "-c", SERVER, str(SRC / "flashinfer_sm120/core/autoload_hook.py")],
                                  env=env, capture_output=True, text=True, timeout=300)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("@@")), None)
            assert line, proc.stdout[-2000:] + proc.stderr[-3000:]
            st = json.loads(line[2:])
            error = st["error"]
            assert st["mode"] == "patched" and error and str(cute) in error and "uid 4321" in error, error
            assert "CUTE_DSL_CACHE_DIR" in error.rpartition("Fix:")[2], error
            warned = [x for x in proc.stderr.splitlines() if str(cute) in x and "uid 4321" in x]
            assert len(warned) == 1, proc.stderr[-3000:]
        record = (Path(env["FLASHINFER_SM120_CACHE_DIR"]) / "last-status.json").read_text()
        assert str(cute) in record
        proc = cli(["status"], env, python=sys.executable)
        assert proc.returncode == 1 and str(cute) in proc.stdout and "uid 4321" in proc.stdout, proc.stdout
