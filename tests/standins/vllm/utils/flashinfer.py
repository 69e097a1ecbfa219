# Stand-in written from vLLM 0.34.0 vllm/utils/flashinfer.py (PyPI wheel
# vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl; has_flashinfer() and has_flashinfer_cubin() are
# unchanged from 0.33.0): has_flashinfer() and what it calls, without vLLM's logger, torch or
# platform imports.
import functools
import importlib.util
import os
import shutil

import vllm.envs as envs

_DEFAULT_CUDA_HOME = "/usr/local/cuda"


def _flashinfer_nvcc_path():
    # The nvcc FlashInfer would run: CUDA_HOME or CUDA_PATH, else the prefix of `which nvcc`,
    # else /usr/local/cuda; then shutil.which() of <home>/bin/nvcc (exists and is executable).
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not home:
        found = shutil.which("nvcc")
        home = os.path.dirname(os.path.dirname(found)) if found else _DEFAULT_CUDA_HOME
    return shutil.which(os.path.join(home, "bin", "nvcc"))


@functools.cache
def has_flashinfer_cubin():
    if envs.VLLM_HAS_FLASHINFER_CUBIN:
        return True
    return importlib.util.find_spec("flashinfer_cubin") is not None


@functools.cache
def has_flashinfer():
    if importlib.util.find_spec("flashinfer") is None:
        return False
    # FlashInfer's JIT runs nvcc and `ninja` from PATH: without prebuilt cubins both must exist.
    if not has_flashinfer_cubin() and (_flashinfer_nvcc_path() is None or shutil.which("ninja") is None):
        return False
    return True
