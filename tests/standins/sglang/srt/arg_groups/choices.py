# Stand-in written from SGLang 0.5.23 sglang/srt/arg_groups/choices.py: the backends that serve
# without FlashInfer ("triton" attention/MoE/FP8 GEMM, "pytorch" sampling, "marlin" FP4 GEMM)
# among the accepted choices.
ATTENTION_BACKEND_CHOICES = [
    "triton",
    "torch_native",
    "flashinfer",
]

BUILT_IN_SAMPLING_BACKENDS = frozenset({"flashinfer", "pytorch"})
SAMPLING_BACKEND_CHOICES = set(BUILT_IN_SAMPLING_BACKENDS)

MOE_RUNNER_BACKEND_CHOICES = [
    "auto",
    "triton",
    "flashinfer_cutlass",
]

FP8_GEMM_RUNNER_BACKEND_CHOICES = [
    "auto",
    "flashinfer_cutlass",
    "cutlass",
    "triton",
]

FP4_GEMM_RUNNER_BACKEND_CHOICES = [
    "auto",
    "flashinfer_cutlass",
    "marlin",
]
