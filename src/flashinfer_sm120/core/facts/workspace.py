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


#: The variables naming a directory FlashInfer 0.7.4 reads code from besides its JIT directory, and the default
#: under its cache when unset: ``FLASHINFER_CUBIN_DIR`` (``jit/env.py``; CuTe-DSL FMHA loads the ``.so`` files its
#: ``checksums.txt`` lists, trtllm-gen compile lines ``-I`` it), ``FLASHINFER_DSL_FMHA_LOCAL_DIR`` (``.so`` loaded).
CODE_DIRS = {"FLASHINFER_CUBIN_DIR": "cubins", "FLASHINFER_DSL_FMHA_LOCAL_DIR": None}


def code_dirs(jit_dir: str, env=None) -> list[tuple[str, str, str]]:
    """``(variable, its value, directory)`` for each directory FlashInfer reads code from, ``jit_dir`` first."""
    env = os.environ if env is None else env
    base, how = workspace_base(env)
    from_base = (WSB if how == WSB else "HOME", base)
    out = [(*from_base, jit_dir)]
    for var, default in CODE_DIRS.items():
        if env.get(var):
            out.append((var, env[var], env[var]))
        elif default:
            out.append((*from_base, os.path.join(base, ".cache", "flashinfer", default)))
    return out


def code_dirs_refused(jit_dir: str, env=None) -> str | PathProblem | None:
    """Why FlashInfer may not build or load code here (P2, P4): ``jit_dir`` breaks the path rule, or a level of a
    directory it reads code from (the JIT directory's ``tmp`` included) fails the trust rule, with its variable."""
    from flashinfer_sm120.safety.fs.statedir import jit_dir_problem
    from flashinfer_sm120.safety.ownership import check_place, own_place_fix

    problem = jit_dir_problem(jit_dir)
    for var, value, path in code_dirs(jit_dir, env):
        what = f"{var}={shown(value, 200)} names a directory FlashInfer reads code from:"
        fix = own_place_fix() if var in (WSB, "HOME") else f"set {var} to a directory of your own, or unset it"
        problem = problem or check_place(os.path.join(path, "tmp") if path == jit_dir else path, what, fix)
    return problem
