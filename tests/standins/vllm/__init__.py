# Stand-in for vLLM 0.33.0 (vllm/__init__.py): only the version. The real package imports
# vllm.env_override (torch) at import; nothing in it calls has_flashinfer().
__version__ = "0.33.0"
