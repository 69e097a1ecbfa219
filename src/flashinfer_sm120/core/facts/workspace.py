"""Where FlashInfer keeps its JIT workspace (0.7.4 ``jit/env.py``: ``$FLASHINFER_WORKSPACE_BASE``, else ``Path.home()``,
then ``/.cache/flashinfer``), each toolkit's directory in it, and why a build there is refused; creates nothing."""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

from flashinfer_sm120.safety.formats.base import shown

if TYPE_CHECKING:
    from flashinfer_sm120.safety.ownership import PathProblem

WSB = "FLASHINFER_WORKSPACE_BASE"


def normalize_base() -> str | None:
    """Make ``FLASHINFER_WORKSPACE_BASE=`` mean unset before FlashInfer reads it (P4: ``Path("")`` is the
    working directory); returns a warning for a relative value, else ``None``."""
    value = os.environ.get(WSB)
    if value is not None and not value.strip():
        del os.environ[WSB]
        return None
    if value is not None and not os.path.isabs(value):
        return (f"{WSB}={shown(value, 200)} is a relative path: FlashInfer keeps its JIT cache under the "
                f"working directory, a different one wherever a process starts. Fix: give an absolute path "
                f"(export {WSB}=$PWD/{shown(value, 200)}), or unset it for ~/.cache/flashinfer")
    return None


def workspace_base(env=None) -> tuple[str, str]:
    """``(base, where from)``, the one reader of the variable (blank is unset), else ``Path.home()`` as
    FlashInfer reads it: ``HOME`` (an empty one is ``/``), else the passwd entry's."""
    from flashinfer_sm120.safety.fs.statedir import home_dir

    env = os.environ if env is None else env
    value = env.get(WSB) or ""
    if value.strip():
        return value, WSB
    if "HOME" in env:
        return env["HOME"].rstrip("/") or "/", "the home directory"
    return home_dir() or "/", "the home directory"


def workspace_path() -> tuple[str, str]:
    base, how = workspace_base()
    return os.path.join(base, ".cache", "flashinfer"), how


def tag_for(tk) -> str:
    """Toolkit ``tk``'s JIT workspace directory: ``nvcc<version>-<hash of nvcc's path and versions>``."""
    key = "\0".join((os.path.realpath(tk.nvcc), str(tk.nvcc_full), str(tk.header_version)))
    return f"nvcc{tk.nvcc_full or tk.nvcc_version}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def jit_dir_refused(jit_dir: str) -> str | PathProblem | None:
    """Why ``jit_dir`` is no place to build in (path rule, or ownership of a level, ``tmp`` included; P2, P4)."""
    from flashinfer_sm120.safety.fs.statedir import jit_dir_problem
    from flashinfer_sm120.safety.ownership import check_place

    return jit_dir_problem(jit_dir) or check_place(os.path.join(jit_dir, "tmp"), "FlashInfer's JIT directory")
