"""Where FlashInfer keeps its JIT workspace (0.7.4 ``jit/env.py``: ``$FLASHINFER_WORKSPACE_BASE``, else ``Path.home()``,
then ``/.cache/flashinfer``), each toolkit's directory in it, and why a build there is refused; creates nothing."""

from __future__ import annotations

import hashlib
import os
import pwd

from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.ownership import (TEMPFILE_VARIABLES, PathProblem, check_place, deepest_existing,
                                              own_place_fix, temp_dir)

WSB = "FLASHINFER_WORKSPACE_BASE"


def normalize_base() -> str | None:
    """Make ``FLASHINFER_WORKSPACE_BASE=`` mean unset before FlashInfer reads it (P4: ``Path("")`` is the
    working directory); returns a warning for a relative value, else ``None``."""
    value = os.environ.get(WSB)
    if value is not None and not value.strip():
        del os.environ[WSB]
        return None
    if value is not None and not os.path.isabs(value):
        tilde = value.startswith("~/")  # a `~` no shell expanded (systemd, .env files)
        absolute = f"$HOME/{shown(value[2:], 200)}" if tilde else f"$PWD/{shown(value, 200)}"
        return (f"{WSB}={shown(value, 200)} is a relative path: FlashInfer keeps its JIT cache under the "
                f"working directory, a different one wherever a process starts. Fix: give an absolute path "
                f"(export {WSB}={absolute}), or unset it for ~/.cache/flashinfer")
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


#: Each variable naming a directory FlashInfer 0.7.4 reads code from besides its JIT directory, then where that
#: is when unset (the first of these variables set, and the path under it; ``HOME`` is always):
#: ``FLASHINFER_CUBIN_DIR`` (``jit/env.py``; CuTe-DSL FMHA loads the ``.so`` files its ``checksums.txt`` lists,
#: trtllm-gen compile lines ``-I`` it), ``FLASHINFER_DSL_FMHA_LOCAL_DIR`` (``.so`` loaded), b12x's compile cache
#: (``.o`` loaded), CuTe DSL's cache (IR compiled and run; unset, :func:`cute_cache`); sccache's config file and
#: disk cache refuse the compiler cache instead: :func:`.launcher.private_server`.
CODE_DIRS = {
    "FLASHINFER_CUBIN_DIR": ((WSB, ".cache/flashinfer/cubins"), ("HOME", ".cache/flashinfer/cubins")),
    "FLASHINFER_DSL_FMHA_LOCAL_DIR": (),
    "B12X_COMPILE_CACHE_DIR": (("XDG_CACHE_HOME", "b12x/compile"), ("HOME", ".cache/b12x/compile")),
    "CUTE_DSL_CACHE_DIR": (),
}
CUTE_FIX = "set CUTE_DSL_CACHE_DIR to a directory of your own, or TMPDIR (mkdir -m 700 ~/tmp; TMPDIR=~/tmp)"


def cute_cache(env) -> tuple[str, str, str] | None:
    """``(variable, its value, CuTe DSL's cache)`` when ``CUTE_DSL_CACHE_DIR`` is unset:
    ``$TMPDIR/$USER/cutlass_python_cache`` (``mkdir -p``, links followed), else where that fails
    ``$TMPDIR/cutlass_python_cache``; creates nothing."""
    if env.get("CUTE_DSL_CACHE_DIR"):
        return None
    var = "TMPDIR" if "TMPDIR" in env else next((v for v in TEMPFILE_VARIABLES if env.get(v)), "TMPDIR")
    tmp = env[var] if var in env else temp_dir()  # tempfile's order; an empty TMPDIR: the working directory
    user = env.get("USER") or env.get("USERNAME")
    try:
        user = user or pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # no passwd entry: CuTe DSL's fallback (nvidia-cutlass-dsl 4.x base_dsl/cache_helpers.py)
        pass
    path = os.path.abspath(os.path.join(tmp, user or "", "cutlass_python_cache"))
    here = deepest_existing(path)
    if not os.path.isdir(here) or (here != path and not os.access(here, os.W_OK | os.X_OK)):
        path = os.path.abspath(os.path.join(tmp, "cutlass_python_cache"))
    return var, tmp, path


def code_dirs(jit_dir: str, env=None) -> list[tuple[str, str, str, str]]:
    """``(variable, its value, directory, fix)`` for each directory FlashInfer reads code from, ``jit_dir`` first."""
    env = os.environ if env is None else env
    base, how = workspace_base(env)
    home = workspace_base({k: v for k, v in env.items() if k != WSB})[0]
    given = {k: v for k, v in env.items() if v.strip()} | {"HOME": home}
    out = [(WSB if how == WSB else "HOME", base, jit_dir, own_place_fix())]
    for var, defaults in CODE_DIRS.items():
        if var in given:
            out.append((var, given[var], given[var], f"set {var} to a directory of your own, or unset it"))
            continue
        out += [(v, given[v], os.path.join(given[v], rel), f"set {var} to a directory of your own")
                for v, rel in defaults if v in given][:1]
    cute = cute_cache(env)
    return out + ([(*cute, CUTE_FIX)] if cute else [])


def code_dirs_refused(jit_dir: str, env=None) -> str | PathProblem | None:
    """Why FlashInfer may not build or load code here (P2, P4): ``jit_dir`` breaks the path rule, or a level of a
    directory it reads code from (the JIT directory's ``tmp`` included) fails the trust rule, with its variable."""
    from flashinfer_sm120.safety.fs.statedir import jit_dir_problem

    problem = jit_dir_problem(jit_dir)
    for var, value, path, fix in code_dirs(jit_dir, env):
        what = f"{var}={shown(value, 200)} names where FlashInfer reads code from:"
        problem = problem or check_place(os.path.join(path, "tmp") if path == jit_dir else path, what, fix)
    return problem
