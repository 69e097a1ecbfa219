"""``build``'s compiler-cache and memory options, and the hits/misses line at its end.

Kept here so that ``cli/build.py`` only calls in: :func:`add_arguments` registers
``--compiler-cache``, ``--mem-limit`` and ``--mem-per-compile``; :func:`apply` runs
before FlashInfer is set up (``--compiler-cache`` sets ``FLASHINFER_SM120_COMPILER_CACHE``
for this process, so the same checked path as a server's is taken);
:func:`refused` says, after set-up, whether a requested cache was refused (``build``
then stops: you asked for a cached build); :func:`cache_report` gives the hits and
misses of this build.
"""

from __future__ import annotations

import argparse
import os

#: ``launcher.ENV``, named here so that registering the flags imports nothing else (``cli``
#: must still list its commands when a part of the package is broken).
_ENV = "FLASHINFER_SM120_COMPILER_CACHE"
_flag_only = {"on": False}  # --compiler-cache sccache given, the variable not set for the servers

__all__ = ["add_arguments", "apply", "refused", "cache_stats", "cache_report"]


def _size(flag: str, lo: int):
    """:func:`flashinfer_sm120.formats.cli_size`, imported when a value is parsed, not when
    the flag is registered."""
    def convert(text: str) -> int:
        from .. import formats

        return formats.cli_size(flag, lo=lo)(text)
    convert.__name__ = flag
    return convert


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compiler-cache", choices=("sccache", "none"),
                        help="compile through a shared compile cache (sccache; its backend is sccache's own "
                             f"SCCACHE_* configuration); default: ${_ENV}, else none")
    parser.add_argument("--mem-limit", type=_size("--mem-limit", 64 << 20), metavar="SIZE",
                        help="memory the compiles may use together, e.g. 8G (default: what this process "
                             "may use, from cgroups and /proc/meminfo, less 15%%)")
    parser.add_argument("--mem-per-compile", type=_size("--mem-per-compile", 16 << 20),
                        metavar="SIZE", help="memory one compile takes, e.g. 2G (default: per module family, "
                                             "refined from the peaks recorded by earlier builds)")


def apply(args: argparse.Namespace) -> dict:
    """Act on ``--compiler-cache`` before FlashInfer is set up; returns the user's
    environment as it was (for the jobs plan: ``MAX_JOBS`` the user set, not ours)."""
    user_env = dict(os.environ)
    _flag_only["on"] = bool(getattr(args, "compiler_cache", None) == "sccache" and not user_env.get(_ENV))
    if getattr(args, "compiler_cache", None):
        os.environ[_ENV] = "off" if args.compiler_cache == "none" else args.compiler_cache
        if args.compiler_cache == "sccache":
            from . import launcher

            launcher.request_from_flag("--compiler-cache sccache")
    return user_env


def _ensure_configured(sess):
    """The toolchain set-up of this process (:class:`.toolchain.Setup`); made here when
    FlashInfer's hooks made none (a FlashInfer that is not patched exports nothing)."""
    from . import toolchain

    setup = toolchain.last()
    if setup is not None:
        return setup
    targets = [(int(t.split(".")[0]), t.split(".")[1]) for t in sess.targets if "." in t]
    setup = toolchain.configure(sess.cuda_home, os.path.join(sess.cuda_home, "bin", "nvcc"), targets)
    for name in setup.pop:
        os.environ.pop(name, None)
    os.environ.update(setup.set)
    return setup


def refused(args: argparse.Namespace, sess=None) -> str | None:
    """The refusal of a compiler cache that was asked for (flag or variable), else ``None``."""
    from . import launcher, toolchain

    setup = _ensure_configured(sess) if sess is not None else toolchain.last()
    kind, problem = launcher.requested()
    if problem:
        return problem
    if setup is None:
        return None
    if setup.cache.get("refused") and (kind or os.environ.get("FLASHINFER_NVCC_LAUNCHER") is None):
        return setup.cache["refused"]
    return None


def cache_stats() -> dict | None:
    """sccache's stats now, when FlashInfer's nvcc launcher is an sccache; else ``None``."""
    from . import launcher

    path = os.environ.get("FLASHINFER_NVCC_LAUNCHER")
    if not path or not os.path.basename(path.split()[0]).startswith("sccache"):
        return None
    return launcher.stats(path.split()[0]) or {}


def cache_report(before: dict | None) -> dict | None:
    """Hits and misses of the launcher's server since ``before`` (other builds sharing the
    server count too), with a line for people; ``None`` without a launcher."""
    from .. import formats
    from . import launcher

    if before is None:
        return None
    after = cache_stats()
    b, a = launcher.hits_misses(before), launcher.hits_misses(after)
    where = (after or {}).get("cache_location") or "?"
    if a is None:
        return {"hits": None, "misses": None, "location": where,
                "line": "compiler cache: sccache did not report its stats"}
    hits, misses = a[0] - (b or (0, 0))[0], a[1] - (b or (0, 0))[1]
    note = (f"\nnote: set {_ENV}=sccache for the servers that load these modules too: the launcher is part "
            "of the compile line ninja records, so a server without it compiles them again") if _flag_only["on"] else ""
    return {"hits": hits, "misses": misses, "location": where,
            "line": f"compiler cache: {hits} hits, {misses} misses in this build "
                    f"(sccache {(after or {}).get('version', '?')}, {formats.shown(where, 120)})" + note}

