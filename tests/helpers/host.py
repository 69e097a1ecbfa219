"""What this host has: FlashInfer installed (:data:`needs_flashinfer`), a real CUDA 13 nvcc
(:data:`REAL_NVCC13`) and its other toolkits (:func:`real_toolkit_dirs`), the cache of downloaded
wheels (:func:`wheels_dir`) and old FlashInfer releases in it (:func:`release_dir`)."""

from __future__ import annotations

import glob
import importlib.util
import os
import site
import subprocess
import sys
import sysconfig

import filelock
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


def real_toolkit_dirs() -> list[str]:
    """Paths to cover with an empty directory: the machine's own nvcc installs."""
    hide = [p for p in ("/usr/local/cuda-13.0", "/usr/local/cuda") if os.path.isdir(p) and not os.path.islink(p)]
    import site

    for d in site.getsitepackages():
        hide += glob.glob(os.path.join(d, "nvidia", "cu1*", "bin"))
    hide += [p for p in glob.glob("/usr/local/cuda-*") if os.path.isdir(p) and not os.path.islink(p)]
    return sorted(set(hide))


def release_dir(version: str) -> str | None:
    """FlashInfer ``version`` unpacked under :func:`wheels_dir` (downloaded once; skips the test
    offline); ``None`` for ``"installed"``."""
    if version == "installed":
        return None
    base = wheels_dir()
    target = os.path.join(base, version)
    os.makedirs(base, exist_ok=True)
    with filelock.FileLock(os.path.join(base, f".{version}.lock")):  # pytest -n: one worker downloads
        if not os.path.isdir(os.path.join(target, "flashinfer")):
            _fetch_release(version, base, target)
    return target


def _fetch_release(version: str, base: str, target: str) -> None:
    """Download FlashInfer ``version`` into ``base/wheels`` and unpack it at ``target``."""
    wheels = os.path.join(base, "wheels")
    # few retries and a short timeout: offline, skip in seconds rather than wait out pip's defaults
    dl = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-build-isolation",
                         "--retries", "1", "--timeout", "30", "-d", wheels, f"flashinfer-python=={version}"],
                        capture_output=True, text=True, timeout=600)
    if dl.returncode != 0:
        pytest.skip(f"cannot download flashinfer-python=={version} into {wheels} (offline? set "
                    f"FLASHINFER_SM120_TEST_WHEELS to a directory that has it): {dl.stderr.strip()[-300:]}")
    whl = [w for w in os.listdir(wheels) if w.startswith(f"flashinfer_python-{version}-")]
    if whl:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                        "--target", target, os.path.join(wheels, whl[0])], check=True, capture_output=True)
    else:  # sdist only (0.4.x): take its pure-Python package, build nothing
        import tarfile

        prefix = f"flashinfer_python-{version}/"
        with tarfile.open(os.path.join(wheels, f"flashinfer_python-{version}.tar.gz")) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix + "flashinfer/")]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(target, members=members, filter="data")
