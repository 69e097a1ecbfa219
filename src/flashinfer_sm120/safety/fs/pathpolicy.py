"""Which paths FlashInfer's generated ``build.ninja`` and the shell lines it runs can carry unquoted
(the cache root, ``CUDA_HOME``, FlashInfer's JIT directory: :data:`flashinfer_sm120.safety.formats.PATH_RULE`),
and the message when one cannot."""

from __future__ import annotations

import os

from flashinfer_sm120.safety.formats import PATH_RULE, path_chars_problem, shown, some

__all__ = ["path_problem", "jit_dir_problem"]


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
    bad = path_chars_problem(path)
    if bad:
        return (f"{what}={shown(path)} contains {some(bad, 8)}, which FlashInfer's generated build.ninja "
                f"and the shell lines it runs do not quote (the compile would fail); set it to a path of "
                f"{PATH_RULE}")
    return None


def jit_dir_problem(jit_dir: str) -> str | None:
    """Why FlashInfer's JIT directory cannot be used: FlashInfer writes it unquoted into every
    ``build.ninja`` (0.7.x ``generate_ninja_build_for_op``: ``build {obj}: ...``), where a space or
    ``:`` breaks the line and ``$x`` is a ninja variable (the build lands in another directory)."""
    fix = ("Fix: set FLASHINFER_WORKSPACE_BASE (or SGLANG_CACHE_DIR, which SGLang copies into it) to an "
           f"absolute directory whose path has only {PATH_RULE}")
    if not os.path.isabs(jit_dir):
        return (f"FlashInfer's JIT directory {shown(jit_dir)} is a relative path: each working directory "
                f"gets a JIT cache of its own. {fix}")
    bad = path_chars_problem(jit_dir)
    if not bad:
        return None
    return (f"FlashInfer's JIT directory {shown(jit_dir)} contains {some(bad, 8)}: FlashInfer writes it "
            f"unquoted into every build.ninja, where a blank or ':' breaks the line, '$x' is a ninja "
            f"variable and the shell reads its own syntax (the build would fail, or land in another "
            f"directory). {fix}")
