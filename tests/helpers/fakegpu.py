"""Simulate GPUs on a GPU-less machine, for tests run in a subprocess.

Import this first in the child process.  ``FAKE_GPU_CAPS="12.0 12.1"`` makes
NVML (pynvml) and ``torch.cuda`` report those compute capabilities, and
``FAKE_TORCH_CUDA="13.0"`` makes ``torch.version.cuda`` read like a cu130 wheel.
``FAKE_NVML=missing`` makes ``nvmlInit`` fail as in a container without
``libnvidia-ml.so.1`` (torch still sees the GPUs); ``FAKE_NVML=error`` makes NVML
fail mid-query.  The variables are read at every call, so one child can switch
GPUs by changing ``os.environ`` (``FAKE_TORCH_CUDA``: call :func:`set_torch_cuda`).
Nothing here is imported by the library itself.
"""

import os


def _caps():
    return [tuple(int(x) for x in c.split(".")) for c in os.environ.get("FAKE_GPU_CAPS", "").split()]


def set_torch_cuda(value):
    """Make ``torch.version.cuda`` read ``value`` (``None`` for a CPU build)."""
    import torch

    torch.version.cuda = value


if os.environ.get("FAKE_GPU_CAPS") is not None:
    import pynvml

    class _Err(pynvml.NVMLError):
        def __init__(self, what="fake NVML error"):
            self.what = what

        def __str__(self):
            return self.what

    def _init(*a, **k):
        if os.environ.get("FAKE_NVML") == "missing":
            raise _Err("NVML Shared Library Not Found (fake: no libnvidia-ml.so.1)")

    def _count():
        if os.environ.get("FAKE_NVML") == "error":
            raise _Err("Unknown Error (fake)")
        return len(_caps())

    pynvml.nvmlInit = _init
    pynvml.nvmlShutdown = lambda *a, **k: None
    pynvml.nvmlDeviceGetCount = _count
    pynvml.nvmlDeviceGetHandleByIndex = lambda i: i
    pynvml.nvmlDeviceGetCudaComputeCapability = lambda h: _caps()[h]
    pynvml.nvmlDeviceGetName = lambda h: f"Fake GPU sm_{_caps()[h][0]}{_caps()[h][1]}"
    pynvml.nvmlDeviceGetUUID = lambda h: f"GPU-fake0000-0000-0000-0000-00000000000{h}"

    import torch

    torch.cuda.device_count = lambda: len(_caps())
    torch.cuda.get_device_capability = lambda device=None: _caps()[0 if device is None else int(device)]
    torch.cuda.is_available = lambda: bool(_caps())

    def _props(device=None):
        import types

        major, minor = _caps()[0 if device is None else int(getattr(device, "index", device) or 0)]
        return types.SimpleNamespace(major=major, minor=minor, name=f"Fake GPU sm_{major}{minor}",
                                     multi_processor_count=170, total_memory=32 << 30,
                                     shared_memory_per_block_optin=99 << 10, L2_cache_size=96 << 20)

    # some FlashInfer releases (0.6.17) read device properties at import
    torch.cuda.get_device_properties = _props

if os.environ.get("FAKE_TORCH_CUDA"):
    set_torch_cuda(os.environ["FAKE_TORCH_CUDA"])
