import os
import shutil
import subprocess

import pytest

from conftest import make_toolkit
from flashinfer_sm120 import cudahome
from flashinfer_sm120.toolkit import inspect


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _pip_like(tmp_path):
    """Layout of site-packages/nvidia/cu13: lib/ with libcudart.so.13 only, curand.h."""
    root = make_toolkit(tmp_path / "site" / "nvidia" / "cu13", "13.0.88", lib64=False, curand=True)
    (root / "lib").mkdir()
    (root / "lib" / "libcudart.so.13").write_text("")
    return root


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) to build the libcuda stub")
def test_view_makes_pip_prefix_linkable(tmp_path, cache):
    root = _pip_like(tmp_path)
    home = cudahome.linkable_home(inspect(str(root)))
    assert home.is_view and home.path.startswith(str(cache))
    v = home.path
    assert os.path.realpath(os.path.join(v, "bin", "nvcc")) == str(root / "bin" / "nvcc")
    assert os.readlink(os.path.join(v, "lib64", "libcudart.so")) == "libcudart.so.13"
    assert os.path.realpath(os.path.join(v, "lib64", "libcudart.so")) == str(root / "lib" / "libcudart.so.13")
    stub = os.path.join(v, "lib64", "stubs", "libcuda.so")
    with open(stub, "rb") as fh:
        assert fh.read(4) == b"\x7fELF"
    if shutil.which("readelf"):
        dyn = subprocess.run(["readelf", "-d", stub], capture_output=True, text=True).stdout
        assert "libcuda.so.1" in dyn
    assert os.path.isfile(os.path.join(v, "include", "curand.h"))
    assert set(home.added) == {"lib64/libcudart.so", "lib64/stubs/libcuda.so"}


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) to build the libcuda stub")
def test_view_is_reused_and_repaired(tmp_path, cache):
    tk = inspect(str(_pip_like(tmp_path)))
    first = cudahome.linkable_home(tk)
    stub = os.path.join(first.path, "lib64", "stubs", "libcuda.so")
    mtime = os.stat(stub).st_mtime_ns
    assert cudahome.linkable_home(tk).path == first.path
    assert os.stat(stub).st_mtime_ns == mtime  # not rebuilt
    os.unlink(stub)  # damage it
    again = cudahome.linkable_home(tk)
    assert again.path == first.path and os.path.isfile(stub)
    assert not [p for p in os.listdir(cache / "cuda-home") if p.startswith(".tmp-")]


def test_complete_toolkit_needs_no_view(tmp_path, cache):
    root = make_toolkit(tmp_path / "cuda-12.9", "12.9.41", curand=True)
    home = cudahome.linkable_home(inspect(str(root)))
    assert not home.is_view and home.path == str(root) and not (cache / "cuda-home").exists()


def test_curand_taken_from_pip_when_toolkit_lacks_it(tmp_path, cache, monkeypatch):
    root = make_toolkit(tmp_path / "cuda-13.0", "13.0.88")  # no curand.h
    site_dir = tmp_path / "site"
    inc = site_dir / "nvidia" / "cu13" / "include"
    inc.mkdir(parents=True)
    (inc / "curand.h").write_text("/* pip curand */\n")
    (inc / "curand_kernel.h").write_text("/* pip curand */\n")
    monkeypatch.setattr(cudahome, "_site_dirs", lambda: [str(site_dir)])
    home = cudahome.linkable_home(inspect(str(root)))
    assert home.is_view and home.curand_include == str(inc) and "include/curand.h" in home.added
    assert os.path.realpath(os.path.join(home.path, "include", "curand_kernel.h")) == str(inc / "curand_kernel.h")


def test_unwritable_cache_names_the_fix(tmp_path, monkeypatch):
    # Since the per-uid cache root (issue 5): an unusable FLASHINFER_SM120_CACHE_DIR is
    # refused with a warning naming the variable and the fix, and the next candidate is used.
    from flashinfer_sm120 import cache

    cache._root_cache.clear()
    bad = tmp_path / "file"  # root ignores permissions: a file, not a directory
    bad.write_text("")
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(bad))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    home = cudahome.linkable_home(inspect(str(_pip_like(tmp_path))))
    assert home.path.startswith(str(tmp_path / "xdg"))
    assert any("FLASHINFER_SM120_CACHE_DIR" in n and str(bad) in n for n in cache.cache_root_notes())
    cache._root_cache.clear()
