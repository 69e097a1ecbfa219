# Stand-in written from vLLM 0.34.0 vllm/envs.py (wheel vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl;
# 0.33.0 has the same minus the two LOCALIZE variables): the variables flashinfer-sm120 relies on and
# every FlashInfer variable whose default is True, read lazily through a module __getattr__ as the
# real module does (the False-default VLLM_USE_FLASHINFER_MOE_INT4 stays: it is no default).
import os

environment_variables = {
    # 0 by default; int() of the value (a non-integer raises ValueError, as in vLLM)
    "VLLM_HAS_FLASHINFER_CUBIN": lambda: bool(int(os.getenv("VLLM_HAS_FLASHINFER_CUBIN", "0"))),
    # True unless set; "0" opts out of FlashInfer's top-k/top-p sampler
    "VLLM_USE_FLASHINFER_SAMPLER": lambda: (
        bool(int(os.environ["VLLM_USE_FLASHINFER_SAMPLER"])) if "VLLM_USE_FLASHINFER_SAMPLER" in os.environ
        else True),
    # FlashInfer FP8 block-scale GEMM for linear layers (vllm/utils/flashinfer.py)
    "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER": lambda: bool(int(os.getenv("VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER", "1"))),
    "VLLM_USE_FLASHINFER_MOE_INT4": lambda: bool(int(os.getenv("VLLM_USE_FLASHINFER_MOE_INT4", "0"))),
    # FlashInfer all-reduce (vllm/distributed/device_communicators/cuda_communicator.py)
    "VLLM_ALLREDUCE_USE_FLASHINFER": lambda: bool(int(os.getenv("VLLM_ALLREDUCE_USE_FLASHINFER", "1"))),
    # New in 0.34.0, read only with VLLM_USE_LOCALITY_DOMAINS=1 (default 0), by FlashInfer's CuteDSL NVFP4 MoE
    "VLLM_USE_LOCALITY_DOMAINS": lambda: bool(int(os.getenv("VLLM_USE_LOCALITY_DOMAINS", "0"))),
    "VLLM_FLASHINFER_CUTEDSL_MOE_LOCALIZE_MEMSET_OVERLAP": lambda: bool(
        int(os.getenv("VLLM_FLASHINFER_CUTEDSL_MOE_LOCALIZE_MEMSET_OVERLAP", "1"))),
    "VLLM_FLASHINFER_CUTEDSL_MOE_LOCALIZE_FREE_FULL_WEIGHTS": lambda: bool(
        int(os.getenv("VLLM_FLASHINFER_CUTEDSL_MOE_LOCALIZE_FREE_FULL_WEIGHTS", "0"))),
}


def __getattr__(name):
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(name)
