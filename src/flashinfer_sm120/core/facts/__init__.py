"""Facts read from released code (FlashInfer, CUDA, vLLM, SGLang), as data apart from their lookups."""
