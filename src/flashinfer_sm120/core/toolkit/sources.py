"""Where CUDA toolkits are looked for, in order: :data:`FIND_STEPS`, one tuple
of small find steps (each ``env -> candidates``), as cuda-pathfinder arranges
its own search.  The order is the preference order of :func:`choose` among
toolkits that pass; :mod:`.candidates` runs the steps and merges what they find."""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import site
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from packaging.version import Version

from flashinfer_sm120.safety import formats
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.core.toolkit.probe import major_minor
from flashinfer_sm120.safety.trust import follow_wrappers

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["FIND_STEPS", "SOURCES", "Found", "pathfinder_binary", "clean_home", "site_dirs", "cache_clear"]

_PIP_PREFIX_RE = re.compile(r"cu1[3-9]")  # site-packages/nvidia/cu13: no pip wheel before 13 ships nvcc
_VERSIONED_RE = re.compile(r"cuda-\d")


class Found(NamedTuple):
    """One place a find step points at.

    Attributes:
        source: the step's label (an entry of :data:`SOURCES`).
        root: the toolkit prefix (``<root>/bin/nvcc``).
        given_as: how the user or environment named it, for messages.
        problem: set when the step already knows the place is unusable.
    """

    source: str
    root: str
    given_as: str
    problem: str | None = None


def clean_home(value: str) -> str:
    """``CUDA_HOME`` as people write it: ``:/opt/cuda`` (from ``$X:$CUDA_HOME``),
    a trailing ``/bin`` or ``/bin/nvcc``, or a trailing slash."""
    v = value.strip().strip(os.pathsep).split(os.pathsep)[0].rstrip("/") or value
    for tail in ("/bin/nvcc", "/bin"):
        if v.endswith(tail):
            v = v[: -len(tail)]
    return v


def cache_clear() -> None:
    """Forget the site directories already listed (after ``site``'s settings changed)."""
    _site_dirs_for.cache_clear()


@functools.lru_cache(maxsize=8)
def _site_dirs_for(path_key: tuple[str, ...], user_site: bool) -> tuple[str, ...]:
    return tuple(_site_dirs_uncached())


def site_dirs() -> list[str]:
    """Every site-packages directory of this interpreter, the user site only when
    :data:`site.ENABLE_USER_SITE` is true (not under ``python -s`` or
    ``PYTHONNOUSERSITE``; cached per ``sys.path``)."""
    return list(_site_dirs_for(tuple(sys.path), bool(site.ENABLE_USER_SITE)))


def _site_dirs_uncached() -> list[str]:
    dirs: list[str] = []
    getters: list[Callable[[], Iterable[str]]] = [lambda: site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        getters.append(lambda: [site.getusersitepackages()])
    getters.append(lambda: [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))])
    user = None
    if not site.ENABLE_USER_SITE:
        try:
            user = site.getusersitepackages()
        except Exception:
            user = None
    for getter in getters:
        try:
            for d in getter():
                if d and d not in dirs and d != user:
                    dirs.append(d)
        except Exception:  # site may be disabled (python -S)
            continue
    return dirs


def _view_toolkit(path: str) -> str | None:
    """The real toolkit behind a flashinfer-sm120 ``CUDA_HOME`` view, else ``None``
    (metadata read through :mod:`flashinfer_sm120.safety.formats`: bounded, depth-bounded;
    anything unusable means "not a view", and the path is then inspected as given)."""
    meta = os.path.join(path, "flashinfer_sm120_view.json")
    if not os.path.lexists(meta):
        return None
    try:
        data = formats.read_json_file(meta, 64 << 10)
        root = formats.field(data, "toolkit", str, meta, max_len=4096)
    except FormatError as exc:
        logger.info("flashinfer-sm120: not reading %s as a view: %s", path, exc)
        return None
    return root if os.path.isabs(root) and os.path.isdir(root) else None


# --------------------------------------------------------------------------- find steps


def _env_var(var: str) -> Callable[[Mapping[str, str]], list[Found]]:
    def step(env: Mapping[str, str]) -> list[Found]:
        val = env.get(var)
        if not val:
            return []
        try:
            formats.check_text(val, f"${var}", fix=f"set {var} to the toolkit prefix (the directory above "
                                                  f"bin/nvcc) or unset it")
        except FormatError as exc:
            return [Found(var, formats.shown(val), f"${var}", problem=str(exc))]
        home = clean_home(val)
        behind = _view_toolkit(home)
        if behind:  # exported by flashinfer-sm120 to this process's parent
            return [Found(var, behind, f"${var}={val} (flashinfer-sm120 view of {behind})")]
        return [Found(var, home, f"${var}={val}")]

    step.__name__ = f"from_{var.lower()}"
    step.__doc__ = f"``${var}`` (cleaned by :func:`clean_home`)."
    return step


def pathfinder_binary(name: str) -> str | None:
    """cuda-pathfinder's answer for where NVIDIA's wheels put the CUDA tool ``name`` (``nvcc``,
    ``cuobjdump``: it knows the wheel layouts and the venv / user-site order), or ``None``.
    Asked only when a wheel layout holds it, so that its own last resort (a subprocess
    loading libcudart through ``LD_LIBRARY_PATH``) never runs here.  Not checked for trust:
    callers apply their own rule to what it returns."""
    if not _pathfinder_answers_from_wheels(name):
        return None
    try:
        from cuda.pathfinder import find_nvidia_binary_utility
    except Exception:
        return None
    try:
        return find_nvidia_binary_utility(name)
    except Exception as exc:  # its errors must not stop discovery
        logger.debug("flashinfer-sm120: cuda-pathfinder failed: %s", exc)
        return None


def _pathfinder_answers_from_wheels(name: str) -> bool:
    """Whether cuda-pathfinder's first step (the wheels in ``site.getsitepackages()``
    and, if enabled, the user site) will find ``name``, so it never reaches its
    subprocess fallback."""
    dirs = []
    try:
        dirs += list(site.getsitepackages())
        if site.ENABLE_USER_SITE:
            dirs.append(site.getusersitepackages())
    except Exception:
        return False
    return any(os.access(os.path.join(d, "nvidia", sub, "bin", name), os.X_OK)
               for d in dirs if d for sub in ("cu13", "cuda_nvcc"))


def from_pip(env: Mapping[str, str]) -> list[Found]:
    """NVIDIA's pip wheels: ``site-packages/nvidia/cu13`` (and later ``cuNN``),
    newest first, and the legacy ``nvidia/cuda_nvcc``; cuda-pathfinder's pick first."""
    out: list[Found] = []
    for sd in site_dirs():
        try:
            subs = os.listdir(os.path.join(sd, "nvidia"))
        except OSError:
            continue
        for name in sorted((n for n in subs if _PIP_PREFIX_RE.fullmatch(n)), reverse=True):
            sub = os.path.join(sd, "nvidia", name)
            out.append(Found("pip", sub, sub))
        legacy = os.path.join(sd, "nvidia", "cuda_nvcc")  # cu12 wheels: no nvcc before 13
        if os.path.isfile(os.path.join(legacy, "bin", "nvcc")):
            out.append(Found("pip", legacy, legacy))
    if out:
        picked = pathfinder_binary("nvcc")
        if picked and os.path.basename(os.path.dirname(picked)) == "bin":
            root = os.path.dirname(os.path.dirname(picked))
            out = [Found("pip", root, root)] + [f for f in out if os.path.realpath(f.root) != root]
    return out


def _has_headers(root: str) -> bool:
    return os.path.isfile(os.path.join(root, "include", "cuda_runtime_api.h"))


def from_path(env: Mapping[str, str]) -> list[Found]:
    """``nvcc`` on ``PATH``, links and wrapper scripts followed (read, not run).

    The prefix is the directory above the ``bin/`` holding the real nvcc
    (``/usr/local/bin/nvcc`` wrapping ``/usr/local/cuda-13.0/bin/nvcc`` gives
    ``/usr/local/cuda-13.0``), except for the Debian layout: a
    ``/usr/bin/nvcc`` wrapper around ``/usr/lib/nvidia-cuda-toolkit/bin/nvcc``
    with the headers in ``/usr/include`` gives ``/usr``.  An nvcc that sits in
    no ``bin/`` directory gives no prefix, and says so in PATH terms.
    """
    which = shutil.which("nvcc", path=env.get("PATH", os.defpath))
    if not which:
        return []
    which = os.path.abspath(which)
    real = follow_wrappers(which) or os.path.realpath(which)
    in_bin = os.path.basename(os.path.dirname(real)) == "bin"
    lexical = os.path.dirname(os.path.dirname(which)) if os.path.basename(os.path.dirname(which)) == "bin" else None
    real_root = os.path.dirname(os.path.dirname(real)) if in_bin else None
    if real_root and (_has_headers(real_root) or not (lexical and _has_headers(lexical))):
        return [Found("PATH", real_root, which)]
    if lexical and (_has_headers(lexical) or not real_root):
        return [Found("PATH", lexical, which if real == which else f"{which} (runs {real})")]
    return [Found("PATH", os.path.dirname(which), which, problem=(
        f"the nvcc on PATH ({which}" + (f", which runs {real}" if real != which else "")
        + ") is not in a toolkit's bin/ directory, so no toolkit prefix (include/, lib64/) follows "
        "from it; put the toolkit's bin/ directory on PATH instead, or set CUDA_HOME to the toolkit "
        "prefix"))]


def from_flashinfer_nvcc(env: Mapping[str, str]) -> list[Found]:
    """``$FLASHINFER_NVCC``: FlashInfer 0.7 compiles with it in place of
    ``$cuda_home/bin/nvcc`` (``flashinfer/jit/cpp_ext.py``), so its own toolkit (the
    prefix above the ``bin/`` of the nvcc it runs, wrappers followed) is offered
    first; chosen only if it passes like any other, otherwise the variable is refused
    (:mod:`flashinfer_sm120.safety.compilers`), never mixed with another toolkit's headers."""
    val = env.get("FLASHINFER_NVCC")
    if val is None:
        return []
    given = f"$FLASHINFER_NVCC={val[:200]}"
    words = val.split()
    if len(words) != 1 or not os.path.isabs(words[0]):
        return [Found("FLASHINFER_NVCC", val[:200] or "(empty)", given, problem=(
            "FLASHINFER_NVCC must be the absolute path of one nvcc; put a launcher in "
            "FLASHINFER_NVCC_LAUNCHER instead"))]
    real = follow_wrappers(words[0]) or os.path.realpath(words[0])
    if os.path.basename(os.path.dirname(real)) != "bin":
        return [Found("FLASHINFER_NVCC", os.path.dirname(real), given, problem=(
            f"the nvcc it runs ({real}) is not in a toolkit's bin/ directory, so no toolkit prefix "
            "follows from it; set CUDA_HOME to the toolkit prefix instead"))]
    root = os.path.dirname(os.path.dirname(real))
    return [Found("FLASHINFER_NVCC", _view_toolkit(root) or root, given)]


def from_usr_local_cuda(env: Mapping[str, str]) -> list[Found]:
    """``/usr/local/cuda`` (the installer's symlink), FlashInfer's last resort too."""
    return [Found("/usr/local/cuda", "/usr/local/cuda", "/usr/local/cuda")]


def from_usr_local_versioned(env: Mapping[str, str]) -> list[Found]:
    """``/usr/local/cuda-X.Y``, newest first."""
    try:
        versioned = [os.path.join("/usr/local", n) for n in os.listdir("/usr/local") if _VERSIONED_RE.match(n)]
    except OSError:
        return []

    def _vkey(p: str) -> Version:
        return major_minor(p.rsplit("-", 1)[-1]) or Version("0")

    return [Found("versioned", p, p) for p in sorted(versioned, key=_vkey, reverse=True)]


def from_conda(env: Mapping[str, str]) -> list[Found]:
    """``$CONDA_PREFIX`` (conda's ``cuda-nvcc`` package installs ``bin/nvcc`` there)."""
    conda = env.get("CONDA_PREFIX")
    return [Found("conda", conda, f"$CONDA_PREFIX={conda}")] if conda else []


#: The search, in preference order: ``(label, step)``; each step maps an
#: environment to the places it points at.
FIND_STEPS: tuple[tuple[str, Callable[[Mapping[str, str]], list[Found]]], ...] = (
    ("FLASHINFER_NVCC", from_flashinfer_nvcc),
    ("CUDA_HOME", _env_var("CUDA_HOME")),
    ("CUDA_PATH", _env_var("CUDA_PATH")),
    ("pip", from_pip),
    ("PATH", from_path),
    ("/usr/local/cuda", from_usr_local_cuda),
    ("versioned", from_usr_local_versioned),
    ("conda", from_conda),
)

#: Source labels, in the order a candidate is preferred when several pass.
SOURCES = tuple(label for label, _ in FIND_STEPS)
