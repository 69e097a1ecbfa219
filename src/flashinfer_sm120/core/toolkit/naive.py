"""What the process settles on without this package: the toolkit prefix FlashInfer's own lookup
finds (and the one vLLM and SGLang derive for it), and the CUDA release torch was built for."""

from __future__ import annotations

import os
import shutil

__all__ = ["flashinfer_naive_root", "torch_cuda_version"]


def flashinfer_naive_root(env: dict[str, str] | None = None, *, server: bool = False) -> str | None:
    """The prefix FlashInfer's ``get_cuda_path()`` returns (0.6.7 - 0.7.4 ``flashinfer/jit/cpp_ext.py``:
    ``CUDA_HOME`` or ``CUDA_PATH`` verbatim, else ``dirname(dirname(which nvcc))`` with links unresolved,
    so a wrapper at ``/usr/local/bin/nvcc`` gives ``/usr/local``, else ``/usr/local/cuda`` if it
    exists), or with ``server`` the one vLLM (0.33 ``_flashinfer_nvcc_path``) and SGLang (0.5.23
    ``cuda_home``) derive: an empty value counts as unset, ``/usr/local/cuda`` whether it exists or not."""
    env = dict(os.environ if env is None else env)
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home if server else home is not None:
        return home
    which = shutil.which("nvcc", path=env.get("PATH", os.defpath))
    if which:
        return os.path.dirname(os.path.dirname(which))
    return "/usr/local/cuda" if server or os.path.exists("/usr/local/cuda") else None


def torch_cuda_version() -> str | None:
    """``torch.version.cuda`` (``None`` for a CPU build, or without torch)."""
    try:
        import torch
    except Exception:
        return None
    return getattr(torch.version, "cuda", None)
