"""``build``'s compiler cache: act on ``--compiler-cache`` before FlashInfer is set up (:func:`apply`),
say whether a requested cache was refused (:func:`refused`), and count this build's hits and misses
(:func:`cache_stats` before, :func:`cache_report` after)."""

from __future__ import annotations

import os

from flashinfer_sm120.core.jitenv.toolchain import CACHE_ENV as _ENV
from flashinfer_sm120.safety.formats.base import shown

_flag_only = {"on": False}  # --compiler-cache sccache given, the variable not set for the servers


def apply(compiler_cache: str | None) -> dict:
    """Act on ``--compiler-cache``; the user's environment as it was (the plan reads their ``MAX_JOBS``)."""
    user_env = dict(os.environ)
    _flag_only["on"] = bool(compiler_cache == "sccache" and not user_env.get(_ENV))
    if compiler_cache:
        os.environ[_ENV] = "off" if compiler_cache == "none" else compiler_cache
        if compiler_cache == "sccache":
            from flashinfer_sm120.core.jitenv import toolchain

            toolchain.request_from_flag("--compiler-cache sccache")
    return user_env


def setup_of(sess):
    """This process's toolchain ``Setup``, made here when FlashInfer's hooks made none (not patched)."""
    from flashinfer_sm120.core.jitenv import toolchain

    setup = toolchain.last()
    if setup is not None:
        return setup
    targets = [(int(t.split(".")[0]), t.split(".")[1]) for t in sess.targets if "." in t]
    setup = toolchain.configure(sess.cuda_home, os.path.join(sess.cuda_home, "bin", "nvcc"), targets)
    for name in setup.pop:
        os.environ.pop(name, None)
    os.environ.update(setup.set)
    return setup


def refused(sess=None) -> str | None:
    """The refusal of a compiler cache that was asked for (flag or variable), else ``None``."""
    from flashinfer_sm120.core.jitenv import toolchain

    setup = setup_of(sess) if sess is not None else toolchain.last()
    kind, problem = toolchain.requested()
    if problem:
        return problem
    if setup is not None and setup.cache.get("refused") and (kind or os.environ.get("FLASHINFER_NVCC_LAUNCHER") is None):
        return setup.cache["refused"]
    return None


def cache_stats() -> dict | None:
    """sccache's stats now, when FlashInfer's nvcc launcher is an sccache; else ``None``."""
    from flashinfer_sm120.core.jitenv import launcher

    path = os.environ.get("FLASHINFER_NVCC_LAUNCHER")
    if not path or not os.path.basename(path.split()[0]).startswith("sccache"):
        return None
    return launcher.stats(path.split()[0]) or {}


def cache_report(before: dict | None) -> dict | None:
    """``build --json``'s ``compiler_cache``: hits and misses of the launcher's server since ``before``
    (other builds sharing it count too; ``None`` when sccache did not say), where it keeps its cache,
    and the ``line`` printed for people; ``None`` without a launcher."""
    from flashinfer_sm120.core.jitenv import launcher

    if before is None:
        return None
    after = cache_stats() or {}
    b, a = launcher.hits_misses(before) or (0, 0), launcher.hits_misses(after)
    location = after.get("cache_location") or "?"
    if a is None:
        return {"hits": None, "misses": None, "location": location,
                "line": "compiler cache: sccache did not report its stats"}
    hits, misses = a[0] - b[0], a[1] - b[1]
    line = (f"compiler cache: {hits} hits, {misses} misses in this build (sccache {after.get('version', '?')}, "
            f"{shown(location, 120)})")
    if _flag_only["on"]:
        line += (f"\nnote: set {_ENV}=sccache for the servers that load these modules too: the launcher is part "
                 "of the compile line ninja records, so a server without it compiles them again")
    return {"hits": hits, "misses": misses, "location": location, "line": line}
