"""What this host has: FlashInfer installed (:data:`needs_flashinfer`), a real CUDA 13 nvcc
(:data:`REAL_NVCC13`), the cache of downloaded wheels (:func:`wheels_dir`)."""

from __future__ import annotations

import glob
import importlib.util
import os
import site
import subprocess
import sysconfig

import pytest


def has_flashinfer() -> bool:
    try:
        return importlib.util.find_spec("flashinfer") is not None
    except Exception:
        return False


needs_flashinfer = pytest.mark.skipif(not has_flashinfer(), reason="flashinfer-python is not installed")


def _real_nvcc13_root() -> str | None:
    dirs = []
    for getter in (site.getsitepackages, lambda: [sysconfig.get_paths()["purelib"]]):
        try:
            dirs += getter()
        except Exception:
            pass
    roots = [p for d in dirs for p in glob.glob(os.path.join(d, "nvidia", "cu13"))]
    roots += sorted(glob.glob("/usr/local/cuda-13*"), reverse=True)
    for root in roots:
        nvcc = os.path.join(root, "bin", "nvcc")
        if os.access(nvcc, os.X_OK):
            try:
                out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
            except Exception:
                continue
            if "release 13." in out:
                return root
    return None


#: Prefix of a real CUDA 13 nvcc (pip's ``nvidia/cu13`` or ``/usr/local/cuda-13*``), or ``None``;
#: the ``real_nvcc13`` fixture skips the test where there is none.
REAL_NVCC13 = _real_nvcc13_root()


def wheels_dir() -> str:
    """The documented cache of downloaded wheels (old FlashInfer releases, the aarch64 CUDA
    wheels): ``$FLASHINFER_SM120_TEST_WHEELS``, default ``~/.cache/flashinfer-sm120-test-wheels``."""
    return os.environ.get("FLASHINFER_SM120_TEST_WHEELS") or os.path.expanduser(
        "~/.cache/flashinfer-sm120-test-wheels")
