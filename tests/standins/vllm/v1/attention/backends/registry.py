# Stand-in written from vLLM 0.33.0 vllm/v1/attention/backends/registry.py: the members of
# AttentionBackendEnum that serve without FlashInfer, and FlashInfer's own.
import enum


class AttentionBackendEnum(enum.Enum):
    FLASH_ATTN = "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"
    TRITON_ATTN = "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"
    FLASHINFER = "vllm.v1.attention.backends.flashinfer.FlashInferBackend"
