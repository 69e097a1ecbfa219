# Stand-in written from vLLM 0.33.0 vllm/envs.py: the two variables flashinfer-sm120 relies on,
# read lazily through a module __getattr__ as the real module does.
import os

environment_variables = {
    # 0 by default; int() of the value (a non-integer raises ValueError, as in vLLM)
    "VLLM_HAS_FLASHINFER_CUBIN": lambda: bool(int(os.getenv("VLLM_HAS_FLASHINFER_CUBIN", "0"))),
    # True unless set; "0" opts out of FlashInfer's top-k/top-p sampler
    "VLLM_USE_FLASHINFER_SAMPLER": lambda: (
        bool(int(os.environ["VLLM_USE_FLASHINFER_SAMPLER"])) if "VLLM_USE_FLASHINFER_SAMPLER" in os.environ
        else True),
}


def __getattr__(name):
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(name)
