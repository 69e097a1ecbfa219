"""A recorded resolution comes back as it was (Resolution.from_dict, the replay of core/patch/laststatus),
and a malformed record raises, so the caller resolves afresh (P1); its summary line says each fact once (P8)."""

from dataclasses import replace

import pytest
from packaging.version import Version

from flashinfer_sm120.core.facts.releases import release_info
from flashinfer_sm120.core.patch.state import Resolution, describe
from flashinfer_sm120.core.toolkit.model import (GPU, Choice, CudaHome, GPUQuery, RejectKind, Rejection, Setting, Toolkit,
                                                 VersionDisagreement)


NOPE = Setting("CUDA_HOME", "/opt/nope", "directory does not exist", "unset CUDA_HOME")


def tk(root, version="13.0.88", **kw):
    return Toolkit(root=root, nvcc=f"{root}/bin/nvcc", sources=("pip", "PATH"), nvcc_version=Version(version[:4]),
                   nvcc_full=version, header_version=Version("13.0"), include_dirs=(f"{root}/include",), **kw)


def resolution():
    gpus = (GPU(0, "RTX 5090", "GPU-1", (12, 0)), GPU(1, "GB10", "GPU-2", (12, 1)))
    old = tk("/opt/cuda-12.8", "12.8.93", given_as="/opt/cuda-12.8/", problem="too old",
             disagreement=VersionDisagreement("/opt/cuda-12.8/version.json", "12.9.0", "nvcc", "12.8.93"))
    rejected = (Rejection(old, RejectKind.UNUSABLE, "cannot build sm_120f"),
                Rejection(tk("/usr/local/cuda-13.1", "13.1.80"), RejectKind.NOT_CHOSEN, "torch is CUDA 13.0"),
                Rejection(tk("/usr/local/cuda-13.2", "13.2.10"), RejectKind.USABLE, "another came first"))
    choice = Choice(tk("/venv/nvidia/cu13"), ((12, "0f"), (12, "1f")), ((12, 0), (12, 1)), rejected,
                    "pip first", "13.0")
    home = CudaHome("/cache/cuda-home/cuda-13.0.88-abc", "/venv/nvidia/cu13", True, ("include/curand.h",), "/inc")
    return Resolution(choice, home, gpus, "12.0 12.1 garbled", "garbled is not a target", "/usr/local/cuda",
                      release=release_info("0.7.4"),
                      gpu_query=GPUQuery(gpus, "torch.cuda", "nvmlInit failed: (x)"), settings=(NOPE,),
                      targets_from="arch_list", own=True)


def test_a_recorded_resolution_comes_back_as_it_was():
    res = resolution()
    back = Resolution.from_dict(res.to_dict(), res.release, res.own)
    assert back == res
    assert back.to_dict() == res.to_dict()


def test_what_flashinfer_alone_would_use_is_said_once():
    """FlashInfer alone would use /usr/local/cuda: said, unless a refused CUDA_HOME or CUDA_PATH of that very value
    already says it; a reason or another path that merely contains it is no such setting (the data decides, P8)."""
    res = resolution()
    alone = "; FlashInfer alone would use CUDA_HOME=/usr/local/cuda;"
    nvcc = Setting("FLASHINFER_NVCC", "/usr/local/cuda-12.8/bin/nvcc", "nvcc 12.8 at /usr/local/cuda is too old", "x")
    others = (nvcc, Setting("CUDA_PATH", "/usr/local/cuda-12.8", "nvcc 12.8 is too old", "y"),
              Setting("FLASHINFER_NVCC", "/usr/local/cuda", "a directory, not a program", "z"))
    for settings in [(s,) for s in others] + [others]:
        assert alone in describe(replace(res, settings=settings)), settings
    for var in ("CUDA_HOME", "CUDA_PATH"):
        text = describe(replace(res, settings=(nvcc, Setting(var, "/usr/local/cuda", "nvcc 12.8 is too old", "w"))))
        assert "alone would use" not in text and f"{var}='/usr/local/cuda' " in text and "Fix: w" in text, text


def test_a_malformed_record_raises():
    d = resolution().to_dict()
    d["choice"]["targets"] = ["sm_x"]
    with pytest.raises(Exception):
        Resolution.from_dict(d, None, False)


def test_a_failed_import_is_not_recorded_for_later_status_calls(cache_dir):
    """A run under ``ulimit -n 8`` failed with EMFILE and its record made every later ``status`` (normal limits)
    answer "failed: Too many open files" until ``--fresh``: a failure is said, not replayed (P8)."""
    from flashinfer_sm120.core.patch import laststatus

    inputs = {"env": "the same"}
    laststatus.save({"mode": "patched", "toolkit": None, "targets": ["sm_120f"], "error": None}, inputs)
    laststatus.save({"mode": "failed", "toolkit": None, "targets": [], "error": "OSError(24, 'Too many open files')"},
                    inputs)
    records, _ = laststatus.load()
    assert [r["status"]["mode"] for r in records if r["inputs"] == inputs] == []  # status resolves afresh
