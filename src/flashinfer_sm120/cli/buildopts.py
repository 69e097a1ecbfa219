"""``build``'s compiler cache: act on ``--compiler-cache`` before FlashInfer is set up
(:func:`apply`), say whether a requested cache was refused (:func:`refused`), and count
the hits and misses of this build (:func:`cache_stats`, :func:`cache_report`).
The flags themselves are registered in :mod:`flashinfer_sm120.cli.build`."""

from __future__ import annotations

import os

from flashinfer_sm120.core.jitenv.toolchain import CACHE_ENV as _ENV

_flag_only = {"on": False}  # --compiler-cache sccache given, the variable not set for the servers

__all__ = ["apply", "refused", "cache_stats", "cache_report"]


def apply(compiler_cache: str | None) -> dict:
    """Act on ``--compiler-cache`` (``sccache``, ``none`` or ``None``) before FlashInfer is set up;
    returns the user's environment as it was (for the jobs plan: ``MAX_JOBS`` the user set, not ours)."""
    user_env = dict(os.environ)
    _flag_only["on"] = bool(compiler_cache == "sccache" and not user_env.get(_ENV))
    if compiler_cache:
        os.environ[_ENV] = "off" if compiler_cache == "none" else compiler_cache
        if compiler_cache == "sccache":
            from flashinfer_sm120.core.jitenv import toolchain

            toolchain.request_from_flag("--compiler-cache sccache")
    return user_env


def setup_of(sess):
    """The toolchain set-up of this process (:class:`flashinfer_sm120.core.jitenv.toolchain.Setup`); made here when
    FlashInfer's hooks made none (a FlashInfer that is not patched exports nothing)."""
    from flashinfer_sm120.core.jitenv import environ, toolchain

    environ.prepare_builds()  # what the patch leaves to the first JIT build, done now
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
    if setup is None:
        return None
    if setup.cache.get("refused") and (kind or os.environ.get("FLASHINFER_NVCC_LAUNCHER") is None):
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
    """Hits and misses of the launcher's server since ``before`` (other builds sharing the
    server count too; ``None`` when sccache did not report them), where it keeps its cache, its
    version, and whether only the flag asked for it (the servers would compile again);
    ``None`` without a launcher."""
    from flashinfer_sm120.core.jitenv import launcher

    if before is None:
        return None
    after = cache_stats()
    b, a = launcher.hits_misses(before), launcher.hits_misses(after)
    out = {"hits": None, "misses": None, "location": (after or {}).get("cache_location") or "?",
           "version": (after or {}).get("version", "?"), "flag_only": _flag_only["on"], "env": _ENV}
    if a is not None:
        out.update(hits=a[0] - (b or (0, 0))[0], misses=a[1] - (b or (0, 0))[1])
    return out
