# Stand-in written from SGLang 0.5.23 sglang/__init__.py (PyPI wheel
# sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl): before anything else (the real file then
# imports torch and FlashInfer through hf_transformers_patches and lang.api), it points the
# third-party JIT caches at SGLANG_CACHE_DIR.
from sglang.srt.environ import redirect_third_party_caches as _redirect_third_party_caches

_redirect_third_party_caches()

__version__ = "0.5.23"
