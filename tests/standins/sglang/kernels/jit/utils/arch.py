# Stand-in written from SGLang 0.5.23 sglang/kernels/jit/utils/arch.py: _jit_cuda_version(), the
# release of the nvcc SGLang's JIT runs (its target suffix follows: 120f needs >= 12.9), with
# torch's CUDA as the fallback when that nvcc cannot be run.
import functools
import os
import re
import shutil
import subprocess


@functools.lru_cache(maxsize=None)
def _jit_cuda_version():
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home is None:
        nvcc = shutil.which("nvcc")
        home = os.path.dirname(os.path.dirname(nvcc)) if nvcc is not None else "/usr/local/cuda"
    try:
        out = subprocess.check_output([os.path.join(home, "bin", "nvcc"), "--version"], text=True)
        m = re.search(r"release (\d+)\.(\d+)", out)
        if m is not None:
            return int(m.group(1)), int(m.group(2))
    except (OSError, subprocess.SubprocessError):
        pass
    from sglang.srt.utils.common import get_cuda_version

    return get_cuda_version()
