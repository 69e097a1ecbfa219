"""What FlashInfer will load (flashinfer_sm120.diagnose.verify.inventory), on modules built here by the
real nvcc for known targets, one of them for another GPU only (issue 15 item 3)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from helpers.child import cli
from helpers.host import needs_flashinfer
from flashinfer_sm120.cli.doctor import dump
from flashinfer_sm120.diagnose.verify import inventory, rules

pytestmark = [pytest.mark.slow, pytest.mark.nvcc]

KERNEL = """
__global__ void k(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }
extern "C" int launch(float* d, int n) { k<<<(n + 255) / 256, 256>>>(d, n); return (int)cudaGetLastError(); }
"""

#: module name -> nvcc -gencode arguments
MODULES = {
    "for_120f": ["-gencode=arch=compute_120f,code=sm_120f"],
    "for_120a": ["-gencode=arch=compute_120a,code=sm_120a"],
    "for_100a_only": ["-gencode=arch=compute_100a,code=sm_100a"],
    "ptx_120": ["-gencode=arch=compute_120,code=compute_120"],
}


def _nvcc(root: str, args: list[str], cwd: Path) -> None:
    proc = subprocess.run([os.path.join(root, "bin", "nvcc"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A fake JIT directory (``<jit>/<name>/<name>.so``) and a cubin directory, compiled once."""
    from helpers.host import REAL_NVCC13

    if REAL_NVCC13 is None:
        pytest.skip("no CUDA 13 nvcc found")
    base = tmp_path_factory.mktemp("inventory")
    (base / "k.cu").write_text(KERNEL)
    jit = base / "cached_ops"
    for name, gencode in MODULES.items():
        (jit / name).mkdir(parents=True)
        _nvcc(REAL_NVCC13, ["-shared", "-Xcompiler", "-fPIC", *gencode, "-o", str(jit / name / f"{name}.so"),
                            "k.cu"], base)
    (jit / "tmp").mkdir()  # FlashInfer's lock directory: not a module
    cubins = base / "cubins" / "trtllm"
    cubins.mkdir(parents=True)
    _nvcc(REAL_NVCC13, ["-cubin", "-arch=sm_100a", "-o", str(cubins / "gemm_Sm100a.cubin"), "k.cu"], base)
    return {"jit": str(jit), "cubins": str(base / "cubins"), "base": base}


def by_name(section: dict, kind: str = "jit") -> dict:
    (place,) = [p for p in section["places"] if p["kind"] == kind]
    return {m["name"]: m for m in place["modules"]}


def test_targets_read_from_each_module_and_a_module_for_another_gpu_flagged(built):
    assert inventory.find_cuobjdump(), "the test extra installs nvidia-cuda-cuobjdump"
    section = inventory.inventory(built["jit"], [("GPU 0 (12.0)", (12, 0))], prebuilt=False)
    mods = by_name(section)
    assert set(mods) == set(MODULES)  # tmp/ is not a module
    assert mods["for_120f"]["sass"] == ["sm_120f"] and mods["for_120f"]["ptx"] == []  # the suffix, from the headers
    assert mods["for_120a"]["sass"] == ["sm_120a"]
    assert mods["ptx_120"]["sass"] == [] and mods["ptx_120"]["ptx"] == ["compute_120"]
    assert mods["for_120f"]["runs"]["GPU 0 (12.0)"] == {"verdict": "exact", "target": "sm_120f"}
    assert mods["ptx_120"]["runs"]["GPU 0 (12.0)"]["verdict"] == "jit"
    bad = mods["for_100a_only"]
    assert bad["sass"] == ["sm_100a"] and "sm_100a" in bad["problem"] and "flashinfer-sm120 build --arch 12.0" in bad["problem"]
    assert [m for m in mods.values() if m["problem"]] == [bad] and section["problems"] == 1
    text = "\n".join(dump(section))  # what doctor --verbose prints
    assert "  - name: for_100a_only\n" in text and "problem: no code GPU 0 (12.0) can run (it holds sm_100a)" in text


def test_sm120a_code_is_flagged_on_a_12_1_gpu_and_family_code_carries_a_caution(built):
    section = inventory.inventory(built["jit"], [("GPU 0 (12.1)", (12, 1))], prebuilt=False)
    mods = by_name(section)
    assert mods["for_120a"]["problem"] and "sm_120a" in mods["for_120a"]["problem"]
    assert mods["for_100a_only"]["problem"]
    assert mods["for_120f"]["problem"] is None and "issue 3294" in mods["for_120f"]["caution"]
    assert mods["for_120f"]["runs"]["GPU 0 (12.1)"]["verdict"] == "compatible"


def test_without_cuobjdump_targets_are_unknown_and_nothing_is_flagged(built):
    so = os.path.join(built["jit"], "for_100a_only", "for_100a_only.so")
    found = inventory.module_targets(so, None)
    assert found["known"] is False and "targets unknown" in found["note"] and ".nv_fatbin" in found["note"]
    mod = inventory.check_module("for_100a_only", so, [("GPU 0 (12.0)", (12, 0))], None, "fix")
    assert mod["problem"] is None and mod["runs"] == {}


def test_cubins_are_counted_by_the_sm_in_their_elf_header(built):
    summary = inventory.cubin_summary(built["cubins"], [("GPU 0 (12.0)", (12, 0))])
    assert summary["by_sm"] == {"sm_100": 1} and summary["runs"] == {"GPU 0 (12.0)": False}
    assert "FLASHINFER_CUBIN_DIR" in summary["note"]
    assert rules.runs("sm_100", (10, 3)) == "compatible"


FAKE_JIT_CACHE = '''
"""Stand-in for flashinfer-jit-cache as FlashInfer 0.7.4 reads it (flashinfer/jit/env.py
_get_aot_providers: __version__, get_jit_cache_providers() -> objects with provider_id,
distribution, version, jit_cache_dir, cuda_architectures, modules)."""
import types
__version__ = "0.7.4"
def get_jit_cache_providers():
    return [types.SimpleNamespace(provider_id="cu130-sm100", distribution="flashinfer-jit-cache-cu130-sm100",
                                  version="0.7.4", jit_cache_dir={jit!r}, cuda_architectures=["sm100a", "sm120a"],
                                  modules=["for_100a_only", "for_120f"])]
'''

FAKE_CUBIN = '''
"""Stand-in for flashinfer-cubin as FlashInfer 0.7.4 reads it (flashinfer/jit/env.py _get_cubin_dir)."""
__version__ = "0.7.4"
def get_cubin_dir():
    return {cubins!r}
'''


@needs_flashinfer
def test_doctor_lists_the_prebuilt_packages_flashinfer_would_load_first(built, clean_env):
    pkgs = built["base"] / "pkgs"
    for name, body in (("flashinfer_jit_cache", FAKE_JIT_CACHE.format(jit=built["jit"])),
                       ("flashinfer_cubin", FAKE_CUBIN.format(cubins=built["cubins"]))):
        (pkgs / name).mkdir(parents=True, exist_ok=True)
        (pkgs / name / "__init__.py").write_text(textwrap.dedent(body))
    env = dict(clean_env, FLASHINFER_CUDA_ARCH_LIST="12.0", FLASHINFER_DISABLE_VERSION_CHECK="1")
    env["PYTHONPATH"] = os.pathsep.join([str(pkgs), env["PYTHONPATH"]])
    fi_root = os.path.join(clean_env["FLASHINFER_WORKSPACE_BASE"], ".cache", "flashinfer")
    os.makedirs(fi_root, exist_ok=True)  # as an earlier build made it: doctor, a listing, creates nothing (P4)
    proc = cli(["doctor", "--json"], env, 600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    inv = report["inventory"]
    assert "error" not in inv, inv
    assert inv["checked_against"] == ["sm_120f (no GPU visible)"]
    kinds = [p["kind"] for p in inv["places"]]
    assert kinds == ["flashinfer-jit-cache", "flashinfer-cubin", "jit"]  # FlashInfer's own order of lookup
    jc = by_name(inv, "flashinfer-jit-cache")
    assert jc["for_100a_only"]["problem"] and "pip uninstall flashinfer-jit-cache-cu130-sm100" in jc["for_100a_only"]["problem"]
    assert jc["for_120f"]["problem"] is None
    (cubin,) = [p for p in inv["places"] if p["kind"] == "flashinfer-cubin"]
    assert cubin["path"] == built["cubins"] and cubin["by_sm"] == {"sm_100": 1}
    human = "\n".join(dump(inv))  # what doctor --verbose prints for the section
    assert "problem: no code sm_120f (no GPU visible) can run (it holds sm_100a)" in human
    assert "declared: sm100a, sm120a" in human and "cubins: 1\n" in human and "sm_100: 1" in human, human
