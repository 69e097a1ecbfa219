"""The rules behind the checks of what was built: which code runs on which GPU
and what a module must be linked against (flashinfer_sm120.diagnose.verify.rules)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from flashinfer_sm120.diagnose.verify import rules
from flashinfer_sm120.core.view.stub import stub_bytes


@pytest.mark.parametrize("target,cap,want", [
    ("sm_120a", (12, 0), "exact"), ("sm_120a", (12, 1), None),      # arch-specific: that GPU only
    ("sm_100a", (12, 0), None), ("sm_90a", (9, 0), "exact"),
    ("sm_120f", (12, 0), "exact"), ("sm_120f", (12, 1), "compatible"),  # family: later minors of the major
    ("sm_121a", (12, 0), None), ("sm_120", (12, 1), "compatible"), ("sm_120", (10, 0), None),
    ("sm_100f", (10, 3), "compatible"), ("sm_103a", (10, 0), None), ("sm_80", (8, 6), "compatible"),
    ("compute_120", (12, 1), "jit"), ("compute_90", (12, 0), "jit"), ("compute_120", (10, 0), None),
    ("compute_120a", (12, 1), None), ("compute_120f", (12, 1), "jit"), ("compute_120f", (13, 0), None),
    ("nonsense", (12, 0), None),
])
def test_which_code_runs_where(target, cap, want):
    assert rules.runs(target, cap) == want


def test_best_prefers_exact_sass_and_cautions_on_sm12x_family_code():
    assert rules.best(["compute_120", "sm_120f", "sm_121a"], (12, 1)) == ("exact", "sm_121a")
    assert rules.best(["compute_120", "sm_120f"], (12, 1)) == ("compatible", "sm_120f")
    assert rules.best(["sm_100a"], (12, 0)) == (None, None)
    assert "3294" in rules.caution("compatible", "sm_120f", (12, 1))
    assert rules.caution("compatible", "sm_80", (8, 6)) is None and rules.caution("exact", "sm_120f", (12, 0)) is None


@pytest.fixture
def cc():
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to link test libraries")
    return cc


def _lib(cc, d, name, *args):
    (d / "m.c").write_text("int cuInit(unsigned); int cudaFree(void*);\nint f(void) { return cuInit(0) + cudaFree(0); }\n")
    out = d / name
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(d / "m.c"), *args], check=True, capture_output=True)
    return str(out)


def test_static_link_rules(tmp_path, cc):
    stubs = tmp_path / "view" / "lib64" / "stubs"
    stubs.mkdir(parents=True)
    (stubs / "libcuda.so").write_bytes(stub_bytes("<", 62, symbols=["cuInit"]))  # SONAME libcuda.so.1
    lib64 = stubs.parent
    (lib64 / "libcudart.so").write_bytes(stub_bytes("<", 62, soname="libcudart.so.13", symbols=["cudaFree"]))
    good = _lib(cc, tmp_path, "good.so", f"-L{lib64}", f"-L{stubs}", "-lcudart", "-lcuda")
    facts, problems = rules.static_problems(good, view=str(tmp_path / "view"), cuda_major=13)
    assert problems == [] and {"libcuda.so.1", "libcudart.so.13"} <= set(facts["needed"])
    _, problems = rules.static_problems(good, cuda_major=12)
    assert len(problems) == 1 and "libcudart.so.13" in problems[0] and "CUDA 12" in problems[0]
    rpath = _lib(cc, tmp_path, "rpath.so", f"-L{lib64}", f"-L{stubs}", "-lcudart", "-lcuda", f"-Wl,-rpath,{stubs}")
    _, problems = rules.static_problems(rpath, view=str(tmp_path / "view"))
    assert len(problems) == 1 and "RPATH" in problems[0] and str(stubs) in problems[0]
    nosoname = tmp_path / "plain"
    nosoname.mkdir()
    (nosoname / "c.c").write_text("int cuInit(unsigned x) { return 0; }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(nosoname / "libcuda.so"), str(nosoname / "c.c")], check=True)
    bare = _lib(cc, tmp_path, "bare.so", f"-L{lib64}", f"-L{nosoname}", "-lcudart", "-lcuda")
    _, problems = rules.static_problems(bare)
    assert any("NEEDED libcuda.so (no version)" in p for p in problems)


def test_runtime_link_rules():
    torch_rt = "/venv/nvidia/cu13/lib/libcudart.so.13"
    before = {"/usr/lib/x86_64-linux-gnu/libcuda.so.1", torch_rt, "/usr/lib/libc.so.6"}
    facts, problems = rules.runtime_problems(before, before | {"/cache/jit/sampling.so"}, view="/cache/view")
    assert problems == [] and facts["libcuda"] == ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]
    _, problems = rules.runtime_problems(before, before | {"/cache/view/lib64/stubs/libcuda.so"}, view="/cache/view")
    assert any("link stub" in p for p in problems)
    _, problems = rules.runtime_problems(before, before | {"/opt/cuda-12/lib64/libcudart.so.12"})
    assert any("two CUDA runtimes" in p for p in problems)
    _, problems = rules.runtime_problems(set(), {torch_rt})
    assert problems == ["libcuda.so.1 is not loaded: no NVIDIA driver library was found at run time"]
    assert not os.path.exists("/cache/view")  # nothing above touched the file system
