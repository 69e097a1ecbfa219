"""Flags from outside can never run, load or write anything (P2), and a manifest names no flags or sources.

Checking flags for characters only is not enough: ``-ccbin=/x/cc`` runs ``/x/cc`` as nvcc's host compiler (the
same for ``-Xcompiler=-fplugin=/x.so``, ``-Wl,--plugin``, ``-B``, ``-specs=``, and ``-MF``/``-odir`` writing
anywhere).  A manifest of 0.2.0 carried flags and sources (``spec``): it is refused, naming the file and the fix.
"""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given, strategies as st

from helpers.child import cli
from helpers.host import needs_flashinfer
from helpers.toolkits import script
from flashinfer_sm120.safety.formats.params import parse_compile_flag
from flashinfer_sm120.errors import FormatError

HOSTILE = ["-ccbin=/tmp/x/cc", "-ccbin /tmp/x/cc", "--compiler-bindir=/tmp/x", "-Xcompiler=-fplugin=/x.so",
           "-Xcompiler -fplugin=/x.so", "-Wl,--plugin=/x.so", "-Xlinker=-plugin", "--linker-options=-o,/x",
           "-B/tmp/x", "-specs=/tmp/x", "-wrapper", "-MF /home/u/.bashrc", "-o /home/u/.bashrc", "--run",
           "-odir=/x", "--output-directory=/x", "-include /etc/shadow", "-fplugin=/x.so", "-fuse-ld=/tmp/ld",
           "-save-temps=/x", "-DX=1 -ccbin /x", "-I relative", "-I/a/../b", "-Xcompiler=-Wl,-lfoo",
           "--dependency-output=/x", "-Xcompiler=-B/x"]

#: Option forms FlashInfer 0.7.4 writes into its JIT specs (flashinfer/jit/*.py, read for this list).
FLASHINFER_FLAGS = ["-std=c++17", "--std=c++17", "-std=c++20", "-O3", "-O0", "-g", "-lineinfo", "-DNDEBUG",
                    "-DFLASHINFER_ENABLE_BF16", "-DPy_LIMITED_API=0x03090000", "-DFLASHINFER_CAKE_KDA_DECODE_TARGET_KIND=",
                    "-Wno-switch-bool", "-Wno-deprecated-gpu-targets", "-use_fast_math", "--use_fast_math",
                    "--fmad=true", "--ftz=false", "--prec-sqrt=true", "--prec-div=true", "--threads=1",
                    "--maxrregcount=128", "-Xfatbin=-compress-all", "--compress-mode=size",
                    "-Xptxas=--register-usage-level=10", "-gencode=arch=compute_120f,code=sm_120f",
                    "-gencode=arch=compute_90a,code=sm_90a", "--gpu-architecture=sm_120a", "--expt-relaxed-constexpr",
                    "--expt-extended-lambda", "-static-global-template-stub=false", "-default-device", "-rdc=true",
                    "--device-entity-has-hidden-visibility=false", "-lcuda", "-lcublas", "-lcublasLt", "-lnvrtc",
                    "-ltorch_cuda", "-shared", "-Xcompiler -fPIC", "--compiler-options=-fPIC",
                    "-I@FLASHINFER@/data/include", "-isystem @FLASHINFER@/data/cutlass/include",
                    "-L/usr/local/cuda/lib64"]


def _entry(flags=(), sources=("@FLASHINFER@/data/csrc/sampling.cu",), inc=None) -> dict:
    return {"format": 1, "name": "sampling", "flashinfer": "0.7.4", "targets": ["12.0f"], "toolchain": "nvcc",
            "regenerable": True,
            "spec": {"sources": list(sources), "extra_cflags": ["-O3"], "extra_cuda_cflags": list(flags),
                     "extra_ldflags": None, "extra_include_dirs": inc, "needs_device_linking": False,
                     "extra_cuda_cflags_by_source": []}}


@pytest.mark.parametrize("flag", HOSTILE)
def test_a_flag_that_runs_loads_or_writes_is_refused(flag):
    with pytest.raises(FormatError) as info:
        parse_compile_flag(flag, "m.jsonl:1")
    assert "m.jsonl:1" in str(info.value) and len(str(info.value)) < 600


@pytest.mark.parametrize("flag", FLASHINFER_FLAGS)
def test_the_flags_flashinfer_writes_are_kept(flag):
    assert parse_compile_flag(flag, "m")[0] == flag


_WORDS = st.sampled_from(["-O3", "-DX=1", "-fPIC", "-Wall", "-lcuda", "-I/usr/include", "-ccbin", "/tmp/x", "-B/x",
                          "-o", "-Wl,-x", "-MF", "-Xcompiler", "-fplugin=/x.so", "-specs=/x", "--run", "-include",
                          ",", "=", "-L", "-isystem", "@GEN@/a", "-Xcompiler=-fPIC,-Wl", "x"])


@given(st.lists(_WORDS, min_size=1, max_size=5).map(" ".join))
def test_compile_flag_property(flag):
    """Accepted flags hold only listed option words; every directory named is returned for checking."""
    try:
        _, dirs = parse_compile_flag(flag, "m")
    except FormatError:
        return
    words = flag.split()
    for bad in ("-ccbin", "-B", "-o", "-MF", "-Wl", "-fplugin", "-specs", "--run", "-include"):
        assert not any(w == bad or w.startswith(bad + ",") or w.startswith(bad + "=") for w in words), flag
    named = [w for w in words if w.startswith("/") or w.startswith("@")]
    assert all(any(d.endswith(n) or n.endswith(d) for d in dirs) for n in named), (flag, dirs)


@needs_flashinfer
def test_build_from_a_manifest_of_0_2_with_flags_and_sources_runs_nothing_it_names(clean_env, tmp_path):
    """End to end: lines of 0.2.0 (a ``spec`` with a ``-ccbin`` flag, a source in a world-writable directory) are
    refused, naming the manifest and the fix; the program the flag names never runs."""
    marker = tmp_path / "RAN"
    evil_dir = tmp_path / "evil"
    evil_dir.mkdir()
    evil_dir.chmod(0o777)
    cc = evil_dir / "cc"
    script(cc, f"#!/bin/sh\n/usr/bin/touch {marker}\nexit 1\n")
    src = evil_dir / "x.cu"
    src.write_text("__global__ void k() {}\n")
    lines = [_entry(["-O3", f"-ccbin={cc}"]), _entry(sources=[str(src)])]
    m = tmp_path / "m.jsonl"
    m.write_text("".join(json.dumps(x) + "\n" for x in lines))
    env = dict(clean_env, HOME=str(tmp_path))
    proc = cli(["build", "--from", str(m), "--arch", "12.0"], env, 600, python=sys.executable)
    out = proc.stdout + proc.stderr
    assert not marker.exists(), out[-3000:]
    assert proc.returncode != 0 and "Traceback" not in out, out[-3000:]
    assert f"{m}:1" in out and "flashinfer-sm120 0.2" in out and "and 1 more" in out, out[-3000:]
    assert "record the manifest again with FLASHINFER_SM120_RECORD" in out, out[-3000:]
