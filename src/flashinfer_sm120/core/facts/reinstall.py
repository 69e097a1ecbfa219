"""The fix for a broken install of flashinfer-sm120: the missing dependency, else a reinstall from the checkout
pip recorded (``direct_url.json``, PEP 610).  Standard library only, never raises: it runs when the rest cannot."""

from __future__ import annotations

import contextlib
import json
import urllib.parse
import urllib.request

#: Top-level module -> the distribution that brings it (pyproject.toml's dependencies).
DEPENDENCIES = {
    "wrapt": "wrapt",
    "packaging": "packaging",
    "filelock": "filelock",
    "pynvml": "nvidia-ml-py",
    "cuda": "cuda-pathfinder",
}


def require_dependencies() -> None:
    """``ModuleNotFoundError`` for the first dependency not installed (``doctor`` says so first; P8)."""
    import importlib.util

    for name in DEPENDENCIES:
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def source() -> str:
    """The checkout pip recorded (shell-quoted), else a placeholder; only a small regular ``direct_url.json``
    naming a ``file:`` URL of this host counts (P6)."""
    with contextlib.suppress(Exception):
        import os
        import shlex
        import stat
        from importlib.metadata import distribution

        dist = distribution("flashinfer-sm120")
        where = getattr(dist, "_path", None)  # PathDistribution's dist-info directory
        if where is not None:  # a FIFO would block the read, a huge file fill memory
            st = os.stat(os.path.join(os.fspath(where), "direct_url.json"))
            if not stat.S_ISREG(st.st_mode) or st.st_size >= 4096:
                raise ValueError("not a small regular file")
        text = dist.read_text("direct_url.json") or ""
        if len(text) < 4096:
            url = json.loads(text).get("url", "")
            if isinstance(url, str) and url.startswith("file:"):
                parts = urllib.parse.urlparse(url)
                path = urllib.request.url2pathname(parts.path)
                if (parts.netloc in ("", "localhost") and path.startswith("/") and path.isprintable()
                        and len(path) < 512):
                    return shlex.quote(path)
    return "/path/to/flashinfer-sm120"


def fix_for(exc: BaseException) -> str:
    """``pip install filelock`` for a missing dependency, else a reinstall from the checkout."""
    name = getattr(exc, "name", None)
    if isinstance(exc, ImportError) and isinstance(name, str):
        dist = DEPENDENCIES.get(name.partition(".")[0])
        if dist:
            return f"pip install {dist} (a dependency of flashinfer-sm120)"
    return f"pip install --force-reinstall {source()} (flashinfer-sm120 is installed from its checkout)"


def unloadable(exc: BaseException, logger) -> tuple:
    """``install``, ``revert``, ``status`` and ``resolve`` of a package that cannot load (``exc``): logged once; the
    first three leave FlashInfer alone and report ``failed``, ``resolve`` raises, each naming the fix (P8)."""
    missing = getattr(exc, "name", None) or type(exc).__name__
    error = f"flashinfer-sm120 cannot load ({missing!s}: {exc}); FlashInfer is left alone. Fix: {fix_for(exc)}"
    logger.error("%s", error)

    def status() -> dict:
        """Where patching stands: ``failed``, with the load error."""
        return {"mode": "failed", "error": error, "summary": error, "patched_modules": [],
                "steps": {}, "resolution": None, "target_cuda_archs": None, "exported": {}}

    def resolve(*args, **kwargs):
        """Raises :class:`~flashinfer_sm120.errors.Sm120Error` with the load error."""
        from flashinfer_sm120.errors import Sm120Error

        raise Sm120Error(error)

    return status, status, status, resolve
