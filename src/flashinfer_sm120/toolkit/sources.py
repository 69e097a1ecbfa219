"""Where CUDA toolkits are looked for, in order (one tuple of find steps)."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import site
import sys
from collections.abc import Sequence

from packaging.version import Version

from .model import Toolkit
from .probe import NVCC_TIMEOUT_S, _resolve_nvcc, inspect, major_minor, read_text

__all__ = ["SOURCES", "Candidates", "discover", "flashinfer_naive_root", "torch_cuda_version",
           "clean_home", "site_dirs"]

_PIP_PREFIX_RE = re.compile(r"cu1[3-9]")  # site-packages/nvidia/cu13: no pip wheel before 13 ships nvcc
_VERSIONED_RE = re.compile(r"cuda-\d")

#: Source labels, in the order a candidate is preferred when several pass.
SOURCES = ("CUDA_HOME", "CUDA_PATH", "pip", "PATH", "/usr/local/cuda", "versioned", "conda")


def clean_home(value: str) -> str:
    """``CUDA_HOME`` as people write it: ``:/opt/cuda`` (from ``$X:$CUDA_HOME``),
    a trailing ``/bin`` or ``/bin/nvcc``, or a trailing slash."""
    v = value.strip().strip(os.pathsep).split(os.pathsep)[0].rstrip("/") or value
    for tail in ("/bin/nvcc", "/bin"):
        if v.endswith(tail):
            v = v[: -len(tail)]
    return v


@functools.lru_cache(maxsize=8)
def _site_dirs_for(path_key: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(_site_dirs_uncached())


def site_dirs() -> list[str]:
    """Every site-packages directory of this interpreter (cached per ``sys.path``)."""
    return list(_site_dirs_for(tuple(sys.path)))


def _view_toolkit(path: str) -> str | None:
    """The real toolkit behind a flashinfer-sm120 ``CUDA_HOME`` view, else ``None``."""
    txt = read_text(os.path.join(path, "flashinfer_sm120_view.json"), 64 << 10)
    if not txt:
        return None
    try:
        root = json.loads(txt).get("toolkit")
    except (ValueError, AttributeError):
        return None
    return root if isinstance(root, str) and os.path.isdir(root) else None


def _site_dirs_uncached() -> list[str]:
    dirs: list[str] = []
    for getter in (
        lambda: site.getsitepackages(),
        lambda: [site.getusersitepackages()],
        lambda: [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))],
    ):
        try:
            for d in getter():
                if d and d not in dirs:
                    dirs.append(d)
        except Exception:  # site may be disabled (python -S)
            continue
    return dirs


def _raw_candidates(env: dict[str, str]) -> list[tuple[str, str, str]]:
    """(source, root, given_as) in preference order; roots may repeat."""
    out: list[tuple[str, str, str]] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        val = env.get(var)
        if val:
            home = clean_home(val)
            behind = _view_toolkit(home)
            if behind:  # exported by flashinfer-sm120 to this process's parent
                out.append((var, behind, f"${var}={val} (flashinfer-sm120 view of {behind})"))
            else:
                out.append((var, home, f"${var}={val}"))
    for sd in site_dirs():
        try:
            subs = os.listdir(os.path.join(sd, "nvidia"))
        except OSError:
            continue
        for name in sorted((n for n in subs if _PIP_PREFIX_RE.fullmatch(n)), reverse=True):
            sub = os.path.join(sd, "nvidia", name)
            out.append(("pip", sub, sub))
        legacy = os.path.join(sd, "nvidia", "cuda_nvcc")  # cu12 wheels: no nvcc before 13
        if os.path.isfile(os.path.join(legacy, "bin", "nvcc")):
            out.append(("pip", legacy, legacy))
    which = shutil.which("nvcc", path=env.get("PATH", os.defpath))
    if which:
        real = _resolve_nvcc(which)
        root = os.path.dirname(os.path.dirname(real)) if real else os.path.dirname(os.path.dirname(which))
        out.append(("PATH", root, which))
    out.append(("/usr/local/cuda", "/usr/local/cuda", "/usr/local/cuda"))
    try:
        versioned = [os.path.join("/usr/local", n) for n in os.listdir("/usr/local")
                     if _VERSIONED_RE.match(n)]
    except OSError:
        versioned = []

    def _vkey(p: str) -> Version:
        return major_minor(p.rsplit("-", 1)[-1]) or Version("0")

    for p in sorted(versioned, key=_vkey, reverse=True):
        out.append(("versioned", p, p))
    conda = env.get("CONDA_PREFIX")
    if conda:
        out.append(("conda", conda, f"$CONDA_PREFIX={conda}"))
    return out



class Candidates(Sequence):
    """Toolkit candidates in preference order, inspected only when first looked at.

    :func:`choose` stops at the first acceptable toolkit, so the usual start-up
    reads the files of one or two toolkits, not every toolkit on the machine.
    ``len()`` and iteration are cheap to ask for; items are :class:`Toolkit`.
    """

    def __init__(self, raw: list[tuple[tuple[str, ...], str, str]], timeout: float) -> None:
        self._raw = raw  # (sources, root, given_as)
        self._timeout = timeout
        self._done: dict[int, Toolkit] = {}

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if i not in self._done:
            sources, root, given = self._raw[i]
            self._done[i] = inspect(root, sources, given, timeout=self._timeout)
        return self._done[i]

    def is_read(self, i: int) -> bool:
        """Whether candidate ``i`` has been inspected (its files read) already."""
        return i in self._done

    def peek(self, i: int) -> Toolkit:
        """The toolkit if already inspected, else a placeholder with root and sources only."""
        if i in self._done:
            return self._done[i]
        sources, root, given = self._raw[i]
        return Toolkit(root, "", sources, None, None, None, None, (), None, given_as=given)


def discover(env: dict[str, str] | None = None, *, timeout: float = NVCC_TIMEOUT_S) -> Candidates:
    """All candidate toolkits, in preference order, one entry per real nvcc.

    Sources, in order: ``CUDA_HOME``, ``CUDA_PATH`` (cleaned of a leading ``:`` and a
    trailing ``/bin``), pip wheels (``site-packages/nvidia/cu13`` in every site
    directory), ``nvcc`` on ``PATH`` (symlinks and wrapper scripts followed),
    ``/usr/local/cuda``, ``/usr/local/cuda-X.Y`` (newest first), ``$CONDA_PREFIX``.

    Args:
        env: environment to read (default ``os.environ``).
        timeout: seconds allowed per ``nvcc --version`` fallback.

    Returns:
        A lazy sequence of :class:`Toolkit`, including unusable ones (their
        ``problem`` is set), e.g. a ``CUDA_HOME`` that does not exist.
    """
    env = dict(os.environ if env is None else env)
    merged: dict[str, tuple[list[str], str, str]] = {}
    order: list[str] = []
    bad: list[tuple[tuple[str, ...], str, str]] = []
    for source, root, given in _raw_candidates(env):
        if not os.path.isdir(root):
            if source in ("CUDA_HOME", "CUDA_PATH", "conda"):
                bad.append(((source,), root, given))
            continue
        # Dedupe on the real path (cheap); wrappers are followed later by inspect().
        key = os.path.realpath(os.path.join(root, "bin", "nvcc"))
        if key in merged:
            if source not in merged[key][0]:
                merged[key][0].append(source)
            continue
        merged[key] = ([source], root, given)
        order.append(key)
    raw = bad + [(tuple(merged[k][0]), merged[k][1], merged[k][2]) for k in order]
    return Candidates(raw, timeout)


def flashinfer_naive_root(env: dict[str, str] | None = None) -> str | None:
    """The toolkit prefix FlashInfer's own ``get_cuda_path()`` would return.

    Mirrors ``flashinfer/jit/cpp_ext.py`` (0.6.7 - 0.7.4): ``CUDA_HOME`` or
    ``CUDA_PATH`` verbatim, else ``dirname(dirname(which nvcc))`` without resolving
    links (so a wrapper at ``/usr/local/bin/nvcc`` gives ``/usr/local``), else
    ``/usr/local/cuda`` when it exists, else ``None``.
    """
    env = dict(os.environ if env is None else env)
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home is not None:
        return home
    which = shutil.which("nvcc", path=env.get("PATH", os.defpath))
    if which:
        return os.path.dirname(os.path.dirname(which))
    return "/usr/local/cuda" if os.path.exists("/usr/local/cuda") else None


def torch_cuda_version() -> str | None:
    """``torch.version.cuda`` (``"13.0"`` for cu130 wheels, ``None`` for CPU builds).

    Imports torch if needed (FlashInfer does anyway); ``None`` if torch is absent.
    """
    try:
        import torch
    except Exception:
        return None
    return getattr(torch.version, "cuda", None)


