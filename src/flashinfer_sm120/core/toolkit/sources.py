"""Where CUDA toolkits are looked for: :data:`FIND_STEPS` (``env -> [placeholder]``, in preference order, as
cuda-pathfinder arranges its own search), run by :func:`discover`."""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import shutil
import site
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from packaging.version import Version

from flashinfer_sm120.core.facts.arch import major_minor
from flashinfer_sm120.core.toolkit.model import Toolkit
from flashinfer_sm120.core.toolkit.probe import inspect
from flashinfer_sm120.core.view.meta import META_NAME
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.formats.reads import read_json_file
from flashinfer_sm120.safety.formats.fields import check_text, field
from flashinfer_sm120.safety.trust import trace

logger = logging.getLogger("flashinfer_sm120")

_PIP_PREFIX_RE = re.compile(r"cu1[3-9]")  # site-packages/nvidia/cu13: no pip wheel before 13 ships nvcc
_NOT_IN_BIN = "is not in a toolkit's bin/ directory, so no toolkit prefix"


def _found(source: str, root: str, given: str, problem: str | None = None) -> Toolkit:
    return Toolkit(root=root, sources=(source,), given_as=given, problem=problem)


def clean_home(value: str) -> str:
    """``CUDA_HOME`` without what people add: a leading ``:``, a trailing ``/bin``, ``/bin/nvcc`` or ``/``."""
    v = value.strip().strip(os.pathsep).split(os.pathsep)[0].rstrip("/") or value
    for tail in ("/bin/nvcc", "/bin"):
        if v.endswith(tail):
            v = v[: -len(tail)]
    return v


def site_dirs() -> list[str]:
    """Every site-packages directory, the user site only when Python reads it (not under ``python -s``)."""
    dirs = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    user = None
    with contextlib.suppress(Exception):  # site may be disabled (python -S)
        user = site.getusersitepackages()
        dirs = site.getsitepackages() + [user] + dirs
    return list(dict.fromkeys(d for d in dirs if d and (site.ENABLE_USER_SITE or d != user)))


def _view_toolkit(path: str) -> str | None:
    """The real toolkit behind a flashinfer-sm120 view, else ``None`` (then the path is inspected as given)."""
    meta = os.path.join(path, META_NAME)
    if not os.path.lexists(meta):
        return None
    try:
        root = field(read_json_file(meta, 64 << 10), "toolkit", str, meta, max_len=4096)
    except FormatError as exc:
        logger.info("flashinfer-sm120: not reading %s as a view: %s", path, exc)
        return None
    return root if os.path.isabs(root) and os.path.isdir(root) else None


def pathfinder_binary(name: str) -> str | None:
    """cuda-pathfinder's path of the wheel tool ``name``, or ``None``; asked only when a wheel holds it,
    so its last resort (a subprocess loading libcudart) never runs.  Not checked for trust."""
    try:  # cuda-pathfinder searches these, not sys.path
        dirs = list(site.getsitepackages()) + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    except Exception:
        return None
    if not any(os.access(os.path.join(d, "nvidia", sub, "bin", name), os.X_OK)
               for d in dirs if d for sub in ("cu13", "cuda_nvcc")):
        return None
    try:
        from cuda.pathfinder import find_nvidia_binary_utility

        return find_nvidia_binary_utility(name)
    except Exception as exc:  # its errors must not stop discovery
        logger.debug("flashinfer-sm120: cuda-pathfinder failed: %s", exc)
        return None


def _env_prefix(var: str, label: str | None = None) -> Callable[[Mapping[str, str]], list[Toolkit]]:
    """The step for a variable naming a toolkit prefix (what people add to it cleaned; a view's toolkit behind it)."""
    label = label or var

    def step(env: Mapping[str, str]) -> list[Toolkit]:
        val = env.get(var)
        if not val:
            return []
        try:
            check_text(val, f"${var}", fix=f"set {var} to the toolkit prefix (the directory above bin/nvcc) or unset it")
        except FormatError as exc:
            return [_found(label, shown(val), f"${var}", str(exc))]
        home = clean_home(val)
        behind = _view_toolkit(home)
        if behind:  # exported by flashinfer-sm120 to this process's parent
            return [_found(label, behind, f"${var}={val} (flashinfer-sm120 view of {behind})")]
        return [_found(label, home, f"${var}={val}")]

    return step


def from_pip(env: Mapping[str, str]) -> list[Toolkit]:
    """NVIDIA's wheels: ``nvidia/cu13`` (and later), newest first, and ``nvidia/cuda_nvcc``; cuda-pathfinder's pick first."""
    out: list[Toolkit] = []
    for sd in site_dirs():
        try:
            subs = os.listdir(os.path.join(sd, "nvidia"))
        except OSError:
            continue
        roots = [os.path.join(sd, "nvidia", n) for n in sorted(filter(_PIP_PREFIX_RE.fullmatch, subs), reverse=True)]
        legacy = os.path.join(sd, "nvidia", "cuda_nvcc")
        roots += [legacy] if os.path.isfile(os.path.join(legacy, "bin", "nvcc")) else []
        out += [_found("pip", r, r) for r in roots]
    picked = pathfinder_binary("nvcc") if out else None
    if picked and os.path.basename(os.path.dirname(picked)) == "bin":
        root = os.path.dirname(os.path.dirname(picked))
        out = [_found("pip", root, root)] + [f for f in out if os.path.realpath(f.root) != root]
    return out


def _has_headers(root: str | None) -> bool:
    return bool(root) and os.path.isfile(os.path.join(root, "include", "cuda_runtime_api.h"))


def _bin_parent(path: str) -> str | None:
    return os.path.dirname(os.path.dirname(path)) if os.path.basename(os.path.dirname(path)) == "bin" else None


def from_path(env: Mapping[str, str]) -> list[Toolkit]:
    """``nvcc`` on ``PATH``, wrappers read (not run): the prefix above the real nvcc's ``bin/`` (Debian: ``/usr``)."""
    which = shutil.which("nvcc", path=env.get("PATH", os.defpath))
    if not which:
        return []
    which = os.path.abspath(which)
    real = os.path.realpath(trace(which).target or which)
    lexical, real_root = _bin_parent(which), _bin_parent(real)
    if real_root and (_has_headers(real_root) or not _has_headers(lexical)):
        return [_found("PATH", real_root, which)]
    if lexical and (_has_headers(lexical) or not real_root):
        return [_found("PATH", lexical, which if real == which else f"{which} (runs {real})")]
    runs = f", which runs {real}" if real != which else ""
    return [_found("PATH", os.path.dirname(which), which, (
        f"the nvcc on PATH ({which}{runs}) {_NOT_IN_BIN} (include/, lib64/) follows from it; put the "
        f"toolkit's bin/ directory on PATH instead, or set CUDA_HOME to the toolkit prefix"))]


def from_flashinfer_nvcc(env: Mapping[str, str]) -> list[Toolkit]:
    """``$FLASHINFER_NVCC`` (FlashInfer 0.7 ``jit/cpp_ext.py`` compiles with it): its toolkit, never another's headers."""
    val = env.get("FLASHINFER_NVCC")
    if val is None:
        return []
    given = f"$FLASHINFER_NVCC={val[:200]}"
    words = val.split()
    if len(words) != 1 or not os.path.isabs(words[0]):
        return [_found("FLASHINFER_NVCC", val[:200] or "(empty)", given, (
            "FLASHINFER_NVCC must be the absolute path of one nvcc; put a launcher in "
            "FLASHINFER_NVCC_LAUNCHER instead"))]
    real = os.path.realpath(trace(words[0]).target or words[0])
    root = _bin_parent(real)
    if root is None:
        return [_found("FLASHINFER_NVCC", os.path.dirname(real), given, (
            f"the nvcc it runs ({real}) {_NOT_IN_BIN} follows from it; set CUDA_HOME to the toolkit "
            "prefix instead"))]
    return [_found("FLASHINFER_NVCC", _view_toolkit(root) or root, given)]


def from_usr_local(env: Mapping[str, str]) -> list[Toolkit]:
    """``/usr/local/cuda-X.Y`` directories, newest version first."""
    found = sorted(glob.glob("/usr/local/cuda-[0-9]*"), reverse=True,
                   key=lambda p: major_minor(p.rsplit("-", 1)[-1]) or Version("0"))
    return [_found("versioned", p, p) for p in found]


#: The search, in preference order: ``(label, step)``.
FIND_STEPS: tuple[tuple[str, Callable[[Mapping[str, str]], list[Toolkit]]], ...] = (
    ("FLASHINFER_NVCC", from_flashinfer_nvcc),
    ("CUDA_HOME", _env_prefix("CUDA_HOME")),
    ("CUDA_PATH", _env_prefix("CUDA_PATH")),
    ("pip", from_pip),
    ("PATH", from_path),
    ("/usr/local/cuda", lambda env: [_found("/usr/local/cuda", "/usr/local/cuda", "/usr/local/cuda")]),
    ("versioned", from_usr_local),
    ("conda", _env_prefix("CONDA_PREFIX", "conda")),
)

_NAMED = ("FLASHINFER_NVCC", "CUDA_HOME", "CUDA_PATH", "conda")  # a missing directory is reported, not skipped


class Candidates(Sequence):
    """Candidates, each inspected when first looked at: start-up reads one or two toolkits, not all."""

    def __init__(self, found: list[Toolkit]) -> None:
        self._found, self._done = found, {}

    def __len__(self) -> int:
        return len(self._found)

    def __getitem__(self, i: int) -> Toolkit:  # type: ignore[override]
        i = range(len(self))[i]
        if i not in self._done:
            f = self._found[i]
            self._done[i] = f if f.problem else inspect(f.root, f.sources, f.given_as)
        return self._done[i]

    def unread(self, i: int) -> Toolkit | None:
        """Candidate ``i``'s placeholder while it has not been inspected, else ``None``."""
        return None if i in self._done else self._found[i]


def discover(env: Mapping[str, str] | None = None) -> Candidates:
    """Every candidate of :data:`FIND_STEPS` for ``env``, one per real nvcc (sources merged), unusable ones first."""
    env = dict(os.environ if env is None else env)
    bad: list[Toolkit] = []
    merged: dict[str, Toolkit] = {}
    for _label, step in FIND_STEPS:
        for tk in step(env):
            if tk.problem or not os.path.isdir(tk.root):
                if tk.problem or tk.sources[0] in _NAMED:
                    bad.append(tk)
                continue
            key = os.path.realpath(os.path.join(tk.root, "bin", "nvcc"))  # wrappers: followed by inspect()
            have = merged.setdefault(key, tk)
            if tk.sources[0] not in have.sources:
                merged[key] = replace(have, sources=have.sources + tk.sources)
    return Candidates(bad + list(merged.values()))


def flashinfer_naive_root(env: Mapping[str, str] | None = None, *, server: bool = False) -> str | None:
    """FlashInfer 0.6.7-0.7.4 ``get_cuda_path()``: ``CUDA_HOME``/``CUDA_PATH`` as set, else above ``which nvcc``, else
    an existing ``/usr/local/cuda``; ``server``: vLLM 0.33's and SGLang 0.5.23's (empty is unset, any /usr/local/cuda)."""
    env = dict(os.environ if env is None else env)
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home if server else home is not None:
        return home
    which = shutil.which("nvcc", path=env.get("PATH", os.defpath))
    if which:
        return os.path.dirname(os.path.dirname(which))
    return "/usr/local/cuda" if server or os.path.exists("/usr/local/cuda") else None
