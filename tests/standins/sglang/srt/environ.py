# Stand-in written from SGLang 0.5.23 sglang/srt/environ.py: SGLANG_CACHE_DIR and the cache
# redirection. Standard library only, as the real module (flashinfer-sm120 runs
# third_party_cache_defaults() of the installed file in a child process).
import os


class EnvStr:
    # EnvField.get(): the variable's value when set (EnvStr.parse keeps it as it is, "" included),
    # else the default, which for SGLANG_CACHE_DIR was expanded when this module was imported.
    def __init__(self, name, default):
        self.name, self.default = name, default

    def get(self):
        value = os.getenv(self.name)
        return self.default if value is None else value


class Envs:
    SGLANG_CACHE_DIR = EnvStr("SGLANG_CACHE_DIR", os.path.expanduser("~/.cache/sglang"))


envs = Envs()


def third_party_cache_defaults():
    base = os.path.expanduser(envs.SGLANG_CACHE_DIR.get())
    return {
        "TRITON_CACHE_DIR": os.path.join(base, "triton"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(base, "inductor"),
        "CUDA_CACHE_PATH": os.path.join(base, "nv"),
        "TILELANG_CACHE_DIR": os.path.join(base, "tilelang"),
        # the base, not the cache dir: FlashInfer appends .cache/flashinfer itself
        "FLASHINFER_WORKSPACE_BASE": base,
    }


def redirect_third_party_caches():
    # setdefault: a value set before `import sglang` (the user's) is kept
    for key, value in third_party_cache_defaults().items():
        os.environ.setdefault(key, value)
