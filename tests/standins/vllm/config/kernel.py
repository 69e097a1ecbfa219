# Stand-in written from vLLM 0.33.0 vllm/config/kernel.py: MoE backends ("auto" can pick
# FlashInfer's; "triton" is vLLM's own).
from typing import Literal

MoEBackend = Literal[
    "auto",
    "triton",
    "flashinfer_trtllm",
    "flashinfer_cutlass",
]
