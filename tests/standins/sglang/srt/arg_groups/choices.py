# Stand-in written from SGLang 0.5.23 sglang/srt/arg_groups/choices.py: the backends that serve
# without FlashInfer ("triton" attention, "pytorch" sampling) among the accepted choices.
ATTENTION_BACKEND_CHOICES = [
    "triton",
    "torch_native",
    "flashinfer",
]

BUILT_IN_SAMPLING_BACKENDS = frozenset({"flashinfer", "pytorch"})
SAMPLING_BACKEND_CHOICES = set(BUILT_IN_SAMPLING_BACKENDS)
