# Stand-in written from SGLang 0.5.23 sglang/srt/model_executor/model_runner.py: importing it
# imports FlashInfer (the real chain: model_runner -> sglang/srt/configs/model_config.py ->
# sglang/srt/layers/quantization/__init__.py -> modelopt_quant.py, whose module level runs
# `from flashinfer import mm_fp4`), so FlashInfer's JIT directory is fixed before
# ModelRunner.load_model() calls set_cuda_arch().
import flashinfer  # noqa: F401

from sglang.srt.utils.common import set_cuda_arch


class ModelRunner:
    def load_model(self):
        # the real load_model: set_num_threads, maybe_downgrade_dtype_for_legacy_gpu, then this,
        # before any weight or kernel is loaded
        set_cuda_arch()
