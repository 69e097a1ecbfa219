"""The CUDA_HOME view built from the real aarch64 (DGX Spark) CUDA 13.0 wheels, on this x86_64
machine and without running any of them: complete for FlashInfer's build line, its libcuda.so stub
an AArch64 ELF, the nvcc version read from the wheel's metadata."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from flashinfer_sm120.safety import proc

from helpers.host import wheels_dir

from flashinfer_sm120.core.toolkit import probe
from flashinfer_sm120.core.view import build as view_build

#: What cuda-toolkit 13.0.3.0 pins (the set pip installs next to torch's cu130 wheel).
WHEELS = ("nvidia-cuda-nvcc==13.0.88", "nvidia-cuda-runtime==13.0.96", "nvidia-cuda-crt==13.0.88",
          "nvidia-nvvm==13.0.88", "nvidia-cuda-cccl==13.0.85", "nvidia-curand==10.4.0.35")
#: The tags the aarch64 wheels carry: manylinux2014/manylinux_2_17 (curand: manylinux_2_27).
PLATFORMS = ("manylinux_2_27_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64")
EM_AARCH64 = 183


def _download() -> Path:
    """The wheels, downloaded once into ``$FLASHINFER_SM120_TEST_WHEELS/aarch64-cu13``; skips offline."""
    dest = Path(wheels_dir()) / "aarch64-cu13"
    names = [w.split("==")[0].replace("-", "_") + "-" + w.split("==")[1] for w in WHEELS]
    have = lambda: [n for n in names if not any(p.name.startswith(n + "-") for p in dest.glob("*.whl"))]  # noqa: E731
    if have():
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.11", "--retries", "1", "--timeout", "30", "-d", str(dest)]
        for p in PLATFORMS:
            cmd += ["--platform", p]
        dl = subprocess.run(cmd + list(WHEELS), capture_output=True, text=True, timeout=900)
        if dl.returncode != 0 or have():
            pytest.skip(f"cannot download the aarch64 CUDA wheels into {dest} (offline? set "
                        f"FLASHINFER_SM120_TEST_WHEELS to a directory that has them): {dl.stderr.strip()[-300:]}")
    return dest


def _install(wheel: Path, site: Path) -> None:
    """What pip does with a wheel, minus running anything: unpack it, keeping the file modes."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            path = zf.extract(info, site)
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                os.chmod(path, mode)


def _machine(path: Path) -> int:
    with open(path, "rb") as fh:
        head = fh.read(20)
    assert head[:4] == b"\x7fELF", path
    return struct.unpack("<H" if head[5] == 1 else ">H", head[18:20])[0]


@pytest.mark.slow  # downloads about 160 MB once (cached), then seconds
def test_a_view_of_the_aarch64_wheels_is_complete_and_its_stub_is_aarch64(tmp_path, cache_dir, monkeypatch):
    site = tmp_path / "site-packages"
    for wheel in sorted(_download().glob("*.whl")):
        _install(wheel, site)
    root = site / "nvidia" / "cu13"
    assert _machine(root / "bin" / "nvcc") == EM_AARCH64  # what the wheels are: nothing here can run them

    def must_not_run(*a, **k):
        raise AssertionError(f"ran something from the aarch64 wheels: {a}")

    asked = []

    def answer_as_the_spark_would(nvcc, timeout=None):  # `nvcc --version` on the aarch64 machine itself
        asked.append(nvcc)
        return "13.0.88", None

    monkeypatch.setattr(probe, "nvcc_version", answer_as_the_spark_would)  # P1: the binary's word, simulated
    monkeypatch.setattr(proc, "run", must_not_run)  # nothing else of the wheels runs either
    tk = probe.inspect(str(root), ("pip",))
    assert asked == [str(root / "bin" / "nvcc")] or [os.path.realpath(a) for a in asked] == [
        os.path.realpath(root / "bin" / "nvcc")]
    assert tk.problem is None, tk.problem
    assert (tk.nvcc_full, str(tk.nvcc_version), str(tk.header_version)) == ("13.0.88", "13.0", "13.0")
    assert tk.version_from.endswith("nvidia_cuda_nvcc-13.0.88.dist-info")
    home = view_build.linkable_home(tk)
    view = Path(home.path)
    assert view != root  # the wheels lack lib64, libcudart.so and the stub: a view is needed
    for rel in ("bin/nvcc", "include/cuda_runtime_api.h", "include/curand.h", "include/crt/host_config.h",
                "include/cccl/cuda/std/version", "nvvm/bin/cicc", "nvvm/libdevice"):
        assert (view / rel).exists(), rel
    assert (view / "lib64").is_dir() and (view / "lib64" / "stubs").is_dir()
    cudart = view / "lib64" / "libcudart.so"
    assert cudart.is_file() and os.path.realpath(cudart).endswith("libcudart.so.13")
    assert _machine(cudart) == EM_AARCH64
    libcuda = view / "lib64" / "stubs" / "libcuda.so"
    assert libcuda.is_file() and _machine(libcuda) == EM_AARCH64
    with open(libcuda, "rb") as fh:
        assert fh.read(6)[4:6] == b"\x02\x01"  # ELFCLASS64, little-endian, as libcudart
