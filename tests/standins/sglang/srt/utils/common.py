# Stand-in written from SGLang 0.5.23 sglang/srt/utils/common.py: is_flashinfer_available(),
# SGLang's only FlashInfer check (no nvcc, no ninja), and what it calls.
import importlib.util
import os


def get_bool_env_var(name, default="false"):
    return os.getenv(name, default).lower() in ("true", "1")


def is_cuda():
    import torch

    return torch.cuda.is_available() and torch.version.cuda is not None


def is_flashinfer_available():
    if not get_bool_env_var("SGLANG_IS_FLASHINFER_AVAILABLE", default="true"):
        return False
    return importlib.util.find_spec("flashinfer") is not None and is_cuda()


def get_cuda_version():
    # torch's CUDA release as (major, minor): _jit_cuda_version()'s fallback
    import torch

    return tuple(int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])
