# Stand-in written from SGLang 0.5.23 sglang/srt/utils/common.py: is_flashinfer_available(),
# SGLang's only FlashInfer check (no nvcc, no ninja), what it calls, and set_cuda_arch(), with which
# every model process (ModelRunner.load_model) chooses FlashInfer's targets itself.
import importlib.util
import os

import torch  # the real module imports it at the top; set_cuda_arch() uses the module's name


def get_bool_env_var(name, default="false"):
    return os.getenv(name, default).lower() in ("true", "1")


def is_cuda():
    return torch.cuda.is_available() and torch.version.cuda is not None


def is_flashinfer_available():
    if not get_bool_env_var("SGLANG_IS_FLASHINFER_AVAILABLE", default="true"):
        return False
    return importlib.util.find_spec("flashinfer") is not None and is_cuda()


def get_cuda_version():
    # torch's CUDA release as (major, minor): _jit_cuda_version()'s fallback
    return tuple(int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])


def set_cuda_arch():
    # 0.5.23: "a" for major >= 9, so 12.0a on an RTX PRO 6000 (FlashInfer would pick 120f itself)
    if is_flashinfer_available():
        capability = torch.cuda.get_device_capability()
        arch = f"{capability[0]}.{capability[1]}"
        os.environ["FLASHINFER_CUDA_ARCH_LIST"] = (
            f"{arch}{'a' if capability[0] >= 9 else ''}"
        )
