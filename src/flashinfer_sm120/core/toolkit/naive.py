"""What the process settles on without this package: the toolkit prefix FlashInfer's own lookup
finds (and the one vLLM and SGLang derive for it), and the CUDA release torch was built for."""

from __future__ import annotations

import os
import shutil

__all__ = ["flashinfer_naive_root", "torch_cuda_version"]


def flashinfer_naive_root(env: dict[str, str] | None = None, *, server: bool = False) -> str | None:
    """The toolkit prefix FlashInfer's own ``get_cuda_path()`` would return, or with ``server`` the
    one vLLM (0.33 ``_flashinfer_nvcc_path``) and SGLang (0.5.23 ``cuda_home``) derive for it.

    Mirrors ``flashinfer/jit/cpp_ext.py`` (0.6.7 - 0.7.4): ``CUDA_HOME`` or
    ``CUDA_PATH`` verbatim, else ``dirname(dirname(which nvcc))`` without resolving
    links (so a wrapper at ``/usr/local/bin/nvcc`` gives ``/usr/local``), else
    ``/usr/local/cuda`` when it exists, else ``None``.  The servers take an empty value as
    unset and name ``/usr/local/cuda`` whether it exists or not.
    """
    env = dict(os.environ if env is None else env)
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home if server else home is not None:
        return home
    which = shutil.which("nvcc", path=env.get("PATH", os.defpath))
    if which:
        return os.path.dirname(os.path.dirname(which))
    return "/usr/local/cuda" if server or os.path.exists("/usr/local/cuda") else None


def torch_cuda_version() -> str | None:
    """``torch.version.cuda`` (``"13.0"`` for cu130 wheels, ``None`` for CPU builds).

    Imports torch if needed (FlashInfer does anyway); ``None`` if torch is absent.
    """
    try:
        import torch
    except Exception:
        return None
    return getattr(torch.version, "cuda", None)
