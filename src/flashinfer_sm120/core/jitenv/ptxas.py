"""Triton's ``ptxas``: pointed at the chosen toolkit's where the one Triton bundles cannot build the GPU's target.

Triton assembles with the ptxas in its wheel, overridable with ``TRITON_PTXAS_PATH`` /
``TRITON_PTXAS_BLACKWELL_PATH`` / ``TRITON_PTXAS_THOR_PATH`` (read at each use: ``triton/knobs.py``
``env_nvidia_tool``).  Some releases bundle one too old for the GPU (Triton 3.5.0's ptxas 12.8 rejects
``sm_121a``: triton-lang/triton#8539, #9181).  Only then, and only when the user set none of those
variables, the matching one is set (a step of :func:`flashinfer_sm120.core.jitenv.environ.export`).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Callable

from packaging.version import Version

from flashinfer_sm120.core.facts import arch as _arch

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["TRITON_PTXAS", "export"]

#: Which bundled ptxas Triton runs for an SM number, first match wins
#: (``get_ptxas`` in ``triton/backends/nvidia/compiler.py``): ``ptxas-thor`` for
#: sm_110 (release/3.7.x, triton PR #10462), ``ptxas-blackwell`` for SM >= 100
#: (Triton 3.6.0+; 3.9 also uses it for sm_90, whose sm_90a every bundled ptxas
#: builds), else ``ptxas``.  A binary absent from the wheel falls through.
TRITON_PTXAS: tuple[tuple[str, Callable[[int], bool]], ...] = (
    ("ptxas-thor", lambda sm: sm == 110),
    ("ptxas-blackwell", lambda sm: sm >= 100),
    ("ptxas", lambda sm: True),
)

_RELEASE_RE = re.compile(rb"release (\d+)\.(\d+)")
_TOOL_TIMEOUT_S = 10.0
_OUTPUT_CAP = 64 << 10


def _triton_env_var(binary: str) -> str:
    """``ptxas-blackwell`` -> ``TRITON_PTXAS_BLACKWELL_PATH`` (``env_nvidia_tool`` in triton/knobs.py)."""
    return f"TRITON_{binary.upper().replace('-', '_')}_PATH"


def _triton_target(sm: int) -> tuple[int, str]:
    """Triton's ``--gpu-name`` for an SM: ``sm_{sm}a`` from SM 9.0 on, else ``sm_{sm}``
    (``sm_arch_from_capability`` in triton/backends/nvidia/compiler.py, 3.x)."""
    return (sm // 10, f"{sm % 10}a" if sm >= 90 else str(sm % 10))


_release_memo: dict[tuple, Version | None] = {}


def tool_release(path: str) -> Version | None:
    """``major.minor`` printed by ``<path> --version``, or ``None``; runs only a trusted file (P2), bounded
    (P6); remembered per process by path, size and mtime."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if key in _release_memo:
        return _release_memo[key]
    result = None
    try:
        from flashinfer_sm120.safety.proc import run
        from flashinfer_sm120.safety.trust import check_executable

        if check_executable(path) is None and os.access(path, os.X_OK):
            m = _RELEASE_RE.search(run([path, "--version"], timeout=_TOOL_TIMEOUT_S,
                                       max_output=_OUTPUT_CAP).output)
            result = Version(f"{int(m.group(1))}.{int(m.group(2))}") if m else None
    except Exception as exc:
        logger.debug("flashinfer-sm120: %s --version failed: %r", path, exc)
    _release_memo[key] = result
    return result


def _triton_bin_dir() -> str | None:
    try:
        import importlib.util

        spec = importlib.util.find_spec("triton")  # a top-level package: found, not imported
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    for sub in (("backends", "nvidia", "bin"), ("third_party", "cuda", "bin")):  # 3.x, 2.x
        d = os.path.join(root, *sub)
        if os.path.isdir(d):
            return d
    return None


def export(steps, bin_dir: str, sms: list[int]) -> None:
    """Point Triton at ``bin_dir/ptxas`` for each SM in ``sms`` its bundled ptxas cannot build, through
    ``steps`` (the export's undo log); ``steps.info["triton"]`` says what was decided per target."""
    key = "triton"
    triton_bin = _triton_bin_dir()
    if triton_bin is None:
        steps.info[key] = "not installed"
        return
    user = sorted(v for v in os.environ if v.startswith("TRITON_PTXAS") and v.endswith("_PATH"))
    if user:
        steps.info[key] = f"unchanged: {', '.join(user)} set by you"
        return
    notes = []
    for sm in sorted(set(sms)):
        binary = next(name for name, applies in TRITON_PTXAS
                      if applies(sm) and os.path.exists(os.path.join(triton_bin, name)))
        target = _triton_target(sm)
        need = _arch.min_nvcc_for(target)
        var = _triton_env_var(binary)
        bundled = tool_release(os.path.join(triton_bin, binary))
        label = f"{_arch.format_target(target)}: Triton's {binary} {bundled or '?'}"
        if need is None or bundled is None:
            notes.append(f"{label}: unchanged (cannot tell what it needs)")
        elif bundled >= need:
            notes.append(f"{label} builds it")
        elif var in os.environ:
            notes.append(f"{label} cannot build it (needs {need}); {var} already set for another GPU")
        else:
            ours = os.path.join(bin_dir, "ptxas")
            have = tool_release(ours)
            if have is None or have < need:
                notes.append(f"{label} cannot build it (needs {need}); neither can {ours} ({have})")
                continue
            steps.set_env(var, ours)
            notes.append(f"{label} cannot build it (needs {need}): {var}={ours} ({have})")
            logger.info("flashinfer-sm120: Triton's bundled %s %s cannot build %s; set %s=%s",
                        binary, bundled, _arch.format_target(target), var, ours)
    steps.info[key] = "; ".join(notes) or "no GPU target"
