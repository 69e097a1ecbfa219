"""The libcuda.so link stub of the CUDA_HOME view (issue 5 item 9): written without a C
compiler whatever ``CC`` holds, defines the driver API so ``ld --as-needed`` keeps
``NEEDED libcuda.so.1``, and links with the real nvcc and FlashInfer's link rule."""

import os
import shutil
import subprocess
import sys

import pytest

from helpers.toolkits import make_toolkit
from flashinfer_sm120.core.view.build import linkable_home
from flashinfer_sm120.errors import ViewError
from flashinfer_sm120.core.toolkit.probe import inspect
from flashinfer_sm120.core.view import build as view_build
from flashinfer_sm120.core.view import stub as linkstub
from helpers.views import dynamic_section, pip_like, tmp_dirs


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# --------------------------------------------------------------------------- item 9: the libcuda.so stub


@pytest.mark.parametrize("cc", ["gcc -m64", "ccache gcc", "/nonexistent/cc", None, "'unbalanced"])
def test_stub_needs_no_c_compiler(tmp_path, cache, monkeypatch, cc):
    if cc is None:
        monkeypatch.delenv("CC", raising=False)
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no cc/gcc anywhere
    else:
        monkeypatch.setenv("CC", cc)
    home = linkable_home(inspect(str(pip_like(tmp_path))))
    stub = os.path.join(home.path, "lib64", "stubs", "libcuda.so")
    with open(stub, "rb") as fh:
        head = fh.read(20)
    assert head[:4] == b"\x7fELF" and head[16] == 3  # ET_DYN
    if shutil.which("readelf", path="/usr/bin:/bin"):
        assert "Library soname: [libcuda.so.1]" in subprocess.run(
            [shutil.which("readelf", path="/usr/bin:/bin"), "-d", stub], capture_output=True, text=True).stdout


def test_toolkit_own_stub_is_linked_not_built(tmp_path, cache, monkeypatch):
    root = make_toolkit(tmp_path / "cuda-13.0", "13.0.88")  # lib64/stubs/libcuda.so, no curand.h
    site_dir = tmp_path / "site" / "nvidia" / "cu13" / "include"
    site_dir.mkdir(parents=True)
    (site_dir / "curand.h").write_text("")
    monkeypatch.setattr(view_build, "site_dirs", lambda: [str(tmp_path / "site")])
    monkeypatch.setattr(linkstub, "write_stub", lambda *a: pytest.fail("stub built although the toolkit has one"))
    home = linkable_home(inspect(str(root)))
    assert os.path.realpath(os.path.join(home.path, "lib64/stubs/libcuda.so")) == str(root / "lib64/stubs/libcuda.so")
    assert home.added == ("include/curand.h",)


def test_no_elf_reference_names_the_fix(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(linkstub, "elf_ident", lambda paths: None)  # no platform CUDA supports
    with pytest.raises(ViewError, match="own lib64/stubs/libcuda.so"):
        linkable_home(inspect(str(pip_like(tmp_path))))
    assert not tmp_dirs(tmp_path / "cache" / "cuda-home")


@pytest.mark.skipif(not shutil.which("gcc"), reason="linking against the stub needs gcc")
def test_stub_links_and_keeps_needed_libcuda_under_as_needed(tmp_path):
    """A module calling a driver API function links with -lcuda against our stub, records
    NEEDED libcuda.so.1 even with --as-needed, and loads against a (fake) driver library."""
    cuda_h = tmp_path / "cuda.h"
    cuda_h.write_text("CUresult CUDAAPI cuInit(unsigned int Flags);\n"
                      "#define cuMemAlloc cuMemAlloc_v2\n"
                      "CUresult CUDAAPI cuTensorMapEncodeTiled(void *m);\n")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    linkstub.write_stub(str(stubs / "libcuda.so"), [], str(cuda_h))
    src = tmp_path / "mod.c"
    src.write_text("int cuTensorMapEncodeTiled(void *m);\nint f(void){return cuTensorMapEncodeTiled(0);}\n")
    mod = tmp_path / "mod.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,--as-needed", str(src), "-o", str(mod), f"-L{stubs}",
                    "-lcuda"], check=True, capture_output=True, timeout=120)
    assert "Shared library: [libcuda.so.1]" in dynamic_section(str(mod))
    drv = tmp_path / "driver"
    drv.mkdir()
    (tmp_path / "drv.c").write_text("int cuTensorMapEncodeTiled(void *m){return 42;}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", str(tmp_path / "drv.c"), "-o",
                    str(drv / "libcuda.so.1")], check=True, capture_output=True, timeout=120)
    out = subprocess.run([sys.executable, "-c", f"import ctypes, os; print(ctypes.CDLL({str(mod)!r}, "
                          f"mode=os.RTLD_NOW).f())"], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, LD_LIBRARY_PATH=str(drv)))
    assert out.stdout.strip() == "42", out.stderr


@pytest.mark.nvcc
@pytest.mark.skipif(not shutil.which("c++") or not shutil.which("gcc"), reason="needs a host C/C++ compiler")
def test_real_nvcc_and_flashinfer_link_rule_against_the_view(tmp_path, cache, real_nvcc13):
    """The real CUDA 13 nvcc compiles with the view as CUDA_HOME, FlashInfer's link rule
    (``$cxx $in -shared -L$cuda_home/lib64 -L$cuda_home/lib64/stubs -lcudart -lcuda``,
    flashinfer/jit/cpp_ext.py) links against our stub, and the module loads (RTLD_NOW)
    against a stand-in driver ``libcuda.so.1`` and calls into it."""
    home = linkable_home(inspect(real_nvcc13)).path
    src = tmp_path / "m.cu"
    src.write_text('#include <cuda.h>\nextern "C" int f(){ CUtensorMap m; '
                   'return (int)cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 1, 0, 0, 0, 0, 0, '
                   'CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, '
                   'CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE); }\n')
    obj, mod = tmp_path / "m.o", tmp_path / "m.so"
    proc = subprocess.run([os.path.join(home, "bin", "nvcc"), "-c", "-Xcompiler", "-fPIC", "-isystem",
                           f"{home}/include", str(src), "-o", str(obj)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run(["c++", str(obj), "-shared", f"-L{home}/lib64", f"-L{home}/lib64/stubs", "-lcudart",
                           "-lcuda", "-o", str(mod)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if shutil.which("readelf"):
        assert "[libcuda.so.1]" in dynamic_section(str(mod))
    drv = tmp_path / "driver"
    drv.mkdir()
    (tmp_path / "drv.c").write_text("int cuTensorMapEncodeTiled(){return 42;}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", str(tmp_path / "drv.c"), "-o",
                    str(drv / "libcuda.so.1")], check=True, capture_output=True, timeout=120)
    out = subprocess.run([sys.executable, "-c", f"import ctypes, os; print(ctypes.CDLL({str(mod)!r}, "
                          f"mode=os.RTLD_NOW).f())"], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, LD_LIBRARY_PATH=f"{drv}:{home}/lib64"))
    assert out.stdout.strip() == "42", out.stderr
