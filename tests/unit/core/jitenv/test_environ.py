"""One toolkit for the whole process: CUDA_HOME, PATH, torch's cpp_extension, Triton's ptxas.

Unit tests call :func:`flashinfer_sm120.core.jitenv.environ.export` on fake toolkits in this
process (always undone); the end-to-end test patches real FlashInfer in a child.
"""

import os
import shutil
import sys
import types

import pytest

from helpers.child import run_py
from helpers.host import needs_flashinfer
from helpers.toolkits import make_toolkit, script
from flashinfer_sm120.core.jitenv import environ, toolchain


def tool(path, release):
    return script(path, f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")


def toolkit(root, version="13.0.88"):
    make_toolkit(root, version)
    tool(root / "bin" / "ptxas", ".".join(version.split(".")[:2]))
    return root


def fake_triton(root, **ptxas):
    """``root/triton`` with ``backends/nvidia/bin/<name>`` printing each release;
    importing it fails like an absent Triton (find_spec still finds it)."""
    (root / "triton").mkdir(parents=True)
    (root / "triton" / "__init__.py").write_text("raise ImportError('fake triton for tests')\n")
    for name, release in ptxas.items():
        tool(root / "triton" / "backends" / "nvidia" / "bin" / name.replace("_", "-"), release)
    return root


@pytest.fixture
def env(monkeypatch, tmp_path):
    """A controlled environment; fails the test if an export is left behind."""
    old = make_toolkit(tmp_path / "cuda-12.8")
    monkeypatch.setenv("PATH", f"{old}/bin:/usr/bin:/bin")
    monkeypatch.setenv("CUDA_HOME", str(old))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    for k in list(os.environ):
        if k.startswith("TRITON_PTXAS"):
            monkeypatch.delenv(k)
    # These tests are about nvcc's PATH entry: ninja is taken from PATH here, so its step
    # changes nothing (its own tests: tests/unit/core/toolkit/test_ninja.py).
    from flashinfer_sm120.core.toolkit import ninja

    monkeypatch.setattr(ninja, "FIND_STEPS", (("PATH", ninja._on_path),))
    yield old
    assert environ.exported() == {}, "a test left an export behind"


def test_export_sets_home_and_path_and_undo_restores_them(env, tmp_path):
    home = toolkit(tmp_path / "cuda-13.0")
    nvcc = str(home / "bin" / "nvcc")
    before = dict(os.environ)
    undo = environ.export(str(home), nvcc, [(12, "0f")])
    try:
        assert os.environ["CUDA_HOME"] == str(home)
        assert shutil.which("nvcc") == nvcc and os.environ["PATH"].startswith(f"{home}/bin:")
        assert "CUDA_PATH" not in os.environ  # only updated when the user set it
        info = environ.exported()
        assert info["cuda_home"] == str(home) and info["which_nvcc"] == nvcc and info["targets"] == ["sm_120f"]
        assert environ.export(str(home), nvcc, [(12, "0f")]) is undo  # idempotent
        assert os.environ["PATH"].count(f"{home}/bin") == 1
    finally:
        undo()
    assert dict(os.environ) == before
    undo()  # twice is harmless
    assert dict(os.environ) == before


def test_max_jobs_waits_for_the_first_build_is_refreshed_and_undo_removes_it(env, tmp_path, monkeypatch):
    """MAX_JOBS (read by FlashInfer only in run_ninja) is set by prepare_builds, which the build gate
    calls, not by the export at import; a second call changes nothing; refresh_max_jobs (the gate, before
    each build) takes the memory left now while it is ours; the undo removes it, a user's is never touched."""
    from flashinfer_sm120.core.jitenv import memory

    monkeypatch.delenv("MAX_JOBS", raising=False)
    home = toolkit(tmp_path / "cuda-13.0")
    before = dict(os.environ)
    undo = environ.export(str(home), str(home / "bin" / "nvcc"), [(12, "0f")])
    try:
        assert "MAX_JOBS" not in os.environ
        toolchain.prepare_builds()
        jobs = os.environ["MAX_JOBS"]
        assert jobs.isdigit() and "MAX_JOBS=" in environ.exported()["builds"]["max_jobs"]
        toolchain.prepare_builds()
        assert os.environ["MAX_JOBS"] == jobs
        monkeypatch.setattr(memory, "server_max_jobs", lambda targets, env: (int(jobs) + 1, "the model loaded"))
        toolchain.refresh_max_jobs()
        assert os.environ["MAX_JOBS"] == str(int(jobs) + 1)
    finally:
        undo()
    assert dict(os.environ) == before
    toolchain.prepare_builds()  # after the undo: nothing left to prepare
    assert "MAX_JOBS" not in os.environ
    monkeypatch.setenv("MAX_JOBS", str(int(jobs) + 1))  # the user's now, though equal to ours before: never touched
    toolchain.refresh_max_jobs()
    assert os.environ["MAX_JOBS"] == str(int(jobs) + 1)


def test_a_view_home_puts_its_own_bin_on_path(env, tmp_path):
    real = toolkit(tmp_path / "pip" / "nvidia" / "cu13")
    view = tmp_path / "cache" / "cuda-home" / "cuda-13.0.88-abc"
    view.mkdir(parents=True)
    (view / "bin").symlink_to(real / "bin")
    undo = environ.export(str(view), str(real / "bin" / "nvcc"), [(12, "0f")])  # the toolkit's own nvcc
    try:
        assert os.environ["PATH"].startswith(f"{view}/bin:") and shutil.which("nvcc") == f"{view}/bin/nvcc"
    finally:
        undo()


def test_cuda_path_follows_when_the_user_set_it(env, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_PATH", str(env))
    home = toolkit(tmp_path / "cuda-13.0")
    undo = environ.export(str(home), str(home / "bin" / "nvcc"), [(12, "0f")])
    try:
        assert os.environ["CUDA_PATH"] == str(home)
    finally:
        undo()
    assert os.environ["CUDA_PATH"] == str(env)


def test_path_left_alone_when_nvcc_already_first_or_dir_is_shared(env, tmp_path, monkeypatch):
    home = toolkit(tmp_path / "cuda-13.0")
    monkeypatch.setenv("PATH", f"{home}/bin:/usr/bin:/bin")
    undo = environ.export(str(home), str(home / "bin" / "nvcc"), [(12, "0f")])
    try:
        assert os.environ["PATH"] == f"{home}/bin:/usr/bin:/bin"
        assert environ.exported()["PATH"].startswith("unchanged: nvcc on PATH is already")
    finally:
        undo()
    conda = toolkit(tmp_path / "conda")  # a conda prefix: bin holds python too
    tool(conda / "bin" / "python3", "0.0")
    monkeypatch.setenv("PATH", f"{env}/bin:/usr/bin:/bin")
    undo = environ.export(str(conda), str(conda / "bin" / "nvcc"), [(12, "0f")])
    try:
        assert os.environ["PATH"] == f"{env}/bin:/usr/bin:/bin"
        assert "also holds a Python interpreter" in environ.exported()["PATH"]
        assert os.environ["CUDA_HOME"] == str(conda)
    finally:
        undo()


def test_undo_leaves_what_others_changed_since_and_a_new_export_replaces_the_old(env, tmp_path, monkeypatch):
    a, b = toolkit(tmp_path / "a"), toolkit(tmp_path / "b")
    undo_a = environ.export(str(a), str(a / "bin" / "nvcc"), [(12, "0f")])
    undo_b = environ.export(str(b), str(b / "bin" / "nvcc"), [(12, "0f")])
    assert os.environ["CUDA_HOME"] == str(b) and os.environ["PATH"].startswith(f"{b}/bin:")
    assert str(a) not in os.environ["PATH"]
    undo_a()  # stale: no effect
    assert os.environ["CUDA_HOME"] == str(b)
    os.environ["CUDA_HOME"] = "/somebody/else"
    undo_b()
    assert os.environ["CUDA_HOME"] == "/somebody/else" and os.environ["PATH"] == f"{env}/bin:/usr/bin:/bin"


def test_cpp_extension_global_follows_and_is_restored(env, tmp_path, monkeypatch):
    """torch 2.13's cpp_extension computes CUDA_HOME once at import (stand-in modules here)."""
    torch = types.SimpleNamespace(version=types.SimpleNamespace(cuda="13.0"))
    monkeypatch.setitem(sys.modules, "torch", torch)
    ce = types.ModuleType("torch.utils.cpp_extension")
    ce._find_cuda_home = lambda: os.environ.get("CUDA_HOME")
    ce.CUDA_HOME = str(env)
    monkeypatch.setitem(sys.modules, "torch.utils.cpp_extension", ce)
    home = toolkit(tmp_path / "cuda-13.0")
    undo = environ.export(str(home), str(home / "bin" / "nvcc"), [(12, "0f")])
    assert ce.CUDA_HOME == str(home)
    undo()
    assert ce.CUDA_HOME == str(env)
    # imported while exported: it read our CUDA_HOME; after undo it is asked again
    monkeypatch.delitem(sys.modules, "torch.utils.cpp_extension")
    undo = environ.export(str(home), str(home / "bin" / "nvcc"), [(12, "0f")])
    late = types.ModuleType("torch.utils.cpp_extension")
    late._find_cuda_home = lambda: os.environ.get("CUDA_HOME")
    late.CUDA_HOME = os.environ["CUDA_HOME"]
    monkeypatch.setitem(sys.modules, "torch.utils.cpp_extension", late)
    undo()
    assert late.CUDA_HOME == str(env)


@pytest.mark.parametrize("bundled, target, expect", [
    ({"ptxas": "12.8"}, (12, "1a"), "TRITON_PTXAS_PATH"),  # Triton 3.5: sm_121a needs 12.9
    ({"ptxas": "12.8"}, (12, "0f"), None),  # sm_120a: 12.8 is enough
    ({"ptxas": "12.8", "ptxas_blackwell": "12.9"}, (12, "1a"), None),  # Triton 3.6+
    ({"ptxas": "12.8", "ptxas_blackwell": "12.9"}, (11, "0a"), "TRITON_PTXAS_BLACKWELL_PATH"),
    ({"ptxas": "12.8", "ptxas_blackwell": "12.9", "ptxas_thor": "13.1"}, (11, "0a"), None),
    ({"ptxas": "12.9"}, (8, "9"), None),
])
def test_triton_ptxas_only_when_the_bundled_one_is_too_old(env, tmp_path, monkeypatch, bundled, target, expect):
    monkeypatch.syspath_prepend(str(fake_triton(tmp_path / "site", **bundled)))
    home = toolkit(tmp_path / "cuda-13.0")
    undo = environ.export(str(home), str(home / "bin" / "nvcc"), [target])
    try:
        set_now = sorted(k for k in os.environ if k.startswith("TRITON_PTXAS"))
        assert set_now == ([expect] if expect else []), environ.exported()["triton"]
        if expect:
            assert os.environ[expect] == str(home / "bin" / "ptxas")
            assert "cannot build it" in environ.exported()["triton"]
    finally:
        undo()
    assert not [k for k in os.environ if k.startswith("TRITON_PTXAS")]


def test_triton_left_alone_when_the_user_chose_a_ptxas_or_ours_is_too_old(env, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(fake_triton(tmp_path / "site", ptxas="12.8")))
    home = toolkit(tmp_path / "cuda-13.0")
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", "/opt/mine/ptxas")
    undo = environ.export(str(home), str(home / "bin" / "nvcc"), [(12, "1a")])
    try:
        assert "TRITON_PTXAS_PATH" not in os.environ
        assert "set by you" in environ.exported()["triton"]
    finally:
        undo()
    monkeypatch.delenv("TRITON_PTXAS_BLACKWELL_PATH")
    old = toolkit(tmp_path / "cuda-12.8b", "12.8.93")
    undo = environ.export(str(old), str(old / "bin" / "nvcc"), [(12, "1a")])
    try:
        assert "TRITON_PTXAS_PATH" not in os.environ and "neither can" in environ.exported()["triton"]
    finally:
        undo()


CHILD = """
import helpers.fakegpu, json, os, shutil, subprocess, sys
import torch.utils.cpp_extension as ce
first = dict(cpp=ce.CUDA_HOME, path=os.environ["PATH"], home=os.environ.get("CUDA_HOME"))
import flashinfer_sm120, flashinfer
from flashinfer_sm120.core.jitenv import environ
st = flashinfer_sm120.status()
home = st["resolution"]["cuda_home"]["path"] if st["resolution"] else None
sh = subprocess.run(["sh", "-c", 'command -v nvcc; echo "$CUDA_HOME"'], capture_output=True, text=True).stdout.split()
now = dict(mode=st["mode"], home=home, env_home=os.environ.get("CUDA_HOME"), cpp=ce.CUDA_HOME,
           which=shutil.which("nvcc"), child=sh, triton=os.environ.get("TRITON_PTXAS_PATH"),
           exported=environ.exported())
flashinfer_sm120.revert()
after = dict(cpp=ce.CUDA_HOME, path=os.environ["PATH"], home=os.environ.get("CUDA_HOME"),
             triton=os.environ.get("TRITON_PTXAS_PATH"), exported=environ.exported())
print("@@" + json.dumps(dict(first=first, now=now, after=after)))
"""


@needs_flashinfer
def test_patched_process_exports_one_toolkit_and_revert_undoes_it(clean_env, tmp_path, real_nvcc13):
    fake = make_toolkit(tmp_path / "cuda-12.8")
    env = dict(clean_env, CUDA_HOME=str(fake), FAKE_GPU_CAPS="12.1", FAKE_TORCH_CUDA="13.0",
               PATH=f"{fake}/bin:/usr/bin:/bin")
    env["PYTHONPATH"] += os.pathsep + str(fake_triton(tmp_path / "tr", ptxas="12.8"))  # Triton 3.5
    out, proc = run_py(CHILD, env)
    first, now, after = out["first"], out["now"], out["after"]
    assert now["mode"] == "patched", proc.stderr
    home = now["home"]
    nvcc = os.path.join(home, "bin", "nvcc")
    assert first["cpp"] in (None, str(fake))  # a CPU torch finds nothing; a CUDA torch the user's 12.8
    assert now["env_home"] == home and now["cpp"] == home
    assert now["which"] == nvcc and now["child"] == [nvcc, home]
    assert now["triton"] == os.path.join(home, "bin", "ptxas")  # sm_121a on a bundled 12.8 ptxas
    assert now["exported"]["cuda_home"] == home and now["exported"]["targets"] == ["sm_121a"]
    assert after == dict(cpp=first["cpp"], path=first["path"], home=str(fake), triton=None, exported={})


GATE = """
import json, os
from pathlib import Path
import flashinfer_sm120, flashinfer.jit.cpp_ext as cpp_ext
at_import = os.environ.get("MAX_JOBS")
try:  # the patched run_ninja: the gate sets up the build, then FlashInfer's own fails on a missing ninja file
    cpp_ext.run_ninja(Path(os.environ["WORK"]), Path("missing.ninja"), False)
except Exception:
    pass
print("@@" + json.dumps({"mode": flashinfer_sm120.status()["mode"], "at_import": at_import,
                         "at_build": os.environ.get("MAX_JOBS")}))
"""


@needs_flashinfer
def test_max_jobs_is_set_by_the_build_gate_before_flashinfer_runs_ninja(clean_env, tmp_path, real_nvcc13):
    env = dict(clean_env, FLASHINFER_CUDA_ARCH_LIST="12.0", WORK=str(tmp_path / "work"))
    env.pop("MAX_JOBS", None)
    out, proc = run_py(GATE, env)
    assert out["mode"] == "patched", proc.stderr
    assert out["at_import"] is None and out["at_build"] and out["at_build"].isdigit(), out


@needs_flashinfer
def test_nothing_exported_when_disabled(clean_env, tmp_path):
    fake = make_toolkit(tmp_path / "cuda-12.8")
    env = dict(clean_env, CUDA_HOME=str(fake), FAKE_GPU_CAPS="12.0", FLASHINFER_SM120_DISABLE="1",
               PATH=f"{fake}/bin:/usr/bin:/bin")
    out, proc = run_py(CHILD, env)
    assert out["now"]["mode"] == "disabled" and out["now"]["exported"] == {}
    assert out["now"]["env_home"] == str(fake) and out["now"]["which"] == str(fake / "bin" / "nvcc")
