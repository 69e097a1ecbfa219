# Stand-in written from SGLang 0.5.23 sglang/kernels/jit/utils/compile/toolchain.py: cuda_home(),
# the CUDA root SGLang's own JIT kernels compile with (cached once per process).
import functools
import os
import shutil


@functools.lru_cache(maxsize=None)
def cuda_home():
    configured = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if configured is not None:
        return configured
    nvcc = shutil.which("nvcc")
    if nvcc is not None:
        return os.path.dirname(os.path.dirname(nvcc))
    return "/usr/local/cuda"


def device_compiler_path():
    return os.path.join(cuda_home(), "bin", "nvcc")
