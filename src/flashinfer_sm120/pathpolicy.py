"""Which paths FlashInfer's generated ``build.ninja`` can carry unquoted (the cache root,
``CUDA_HOME``, FlashInfer's JIT directory), and the message when one cannot."""

from __future__ import annotations

import os
import re

from .formats import shown, some

__all__ = ["SAFE_PATH_RE", "path_problem", "jit_dir_problem"]

#: Characters a path may hold to be used unquoted in FlashInfer's generated
#: ``build.ninja`` (``cuda_home = $path``, expanded into ``/bin/sh -c`` command
#: lines: ``flashinfer/jit/cpp_ext.py`` ``generate_ninja_build_for_op``) and by
#: ninja itself (``$`` and ``:`` are ninja syntax, whitespace splits shell words).
SAFE_PATH_RE = re.compile(r"^/[A-Za-z0-9_./+@%=,~-]*$")


def path_problem(path: str, what: str) -> str | None:
    """Why ``path`` cannot be used unquoted as a cache or ``CUDA_HOME`` path.

    Args:
        path: the path to check.
        what: how to name it in the message, e.g. ``"$FLASHINFER_SM120_CACHE_DIR"``.

    Returns:
        ``None`` when usable, else a sentence naming the value and the fix.
    """
    if not os.path.isabs(path):
        return (f"{what}={shown(path)} is a relative path: builds and child processes run in other "
                f"directories; set it to an absolute path")
    if not SAFE_PATH_RE.match(path):
        bad = sorted({c for c in path if not re.match(r"[A-Za-z0-9_./+@%=,~-]", c)})
        return (f"{what}={shown(path)} contains {some(bad, 8)}, which FlashInfer's "
                f"generated build.ninja does not quote (the compile would fail); set it to a path "
                f"without spaces or shell/ninja characters")
    return None


def jit_dir_problem(jit_dir: str) -> str | None:
    """Why FlashInfer's JIT directory cannot be used: FlashInfer writes it unquoted into every
    ``build.ninja`` (0.7.x ``generate_ninja_build_for_op``: ``build {obj}: ...``), where a space or
    ``:`` breaks the line and ``$x`` is a ninja variable (the build lands in another directory)."""
    fix = ("Fix: set FLASHINFER_WORKSPACE_BASE (or SGLANG_CACHE_DIR, which SGLang copies into it) to an "
           "absolute directory whose path has only letters, digits and '_./+@%=,~-'")
    if not os.path.isabs(jit_dir):
        return (f"FlashInfer's JIT directory {shown(jit_dir)} is a relative path: each working directory "
                f"gets a JIT cache of its own. {fix}")
    if SAFE_PATH_RE.match(jit_dir):
        return None
    bad = sorted({c for c in jit_dir if not re.match(r"[A-Za-z0-9_./+@%=,~-]", c)})
    return (f"FlashInfer's JIT directory {shown(jit_dir)} contains {some(bad, 8)}: FlashInfer writes it "
            f"unquoted into every build.ninja, where a blank or ':' breaks the line and '$x' is a ninja "
            f"variable (the build would fail, or land in another directory). {fix}")
