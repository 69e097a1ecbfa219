# Stand-in written from FlashInfer 0.7.4 flashinfer/jit/env.py _get_aot_providers (wheel
# flashinfer_python-0.7.4-py3-none-any.whl): what FlashInfer asks of the flashinfer-jit-cache package,
# its __version__ and get_jit_cache_providers(), one object per entry point of the group
# flashinfer.jit_cache.providers (each returning schema_version 1 and the fields below).
import importlib.metadata
import types

__version__ = importlib.metadata.version("flashinfer-jit-cache")

_FIELDS = ("distribution", "version", "jit_cache_dir", "cuda_architectures", "modules")


def get_jit_cache_providers():
    out = []
    for ep in importlib.metadata.entry_points(group="flashinfer.jit_cache.providers"):
        data = ep.load()()
        out.append(types.SimpleNamespace(provider_id=ep.name, **{k: data[k] for k in _FIELDS}))
    return out
