"""Decide afresh, before touching FlashInfer (nothing is patched here; run outside the patch lock): the GPUs,
the arch list, the toolkit and its linkable home.  A first process and ``doctor`` only: later ones replay."""

from __future__ import annotations

import os
from typing import Sequence

from flashinfer_sm120.core.facts.releases import ReleaseInfo, release_info
from flashinfer_sm120.core.patch.state import Resolution, arch_specs, flashinfer_version
from flashinfer_sm120.core.toolkit.model import Choice, Setting, Toolkit
from flashinfer_sm120.errors import ToolkitError
from flashinfer_sm120.safety.formats.base import bounded

#: Characters of ``FLASHINFER_CUDA_ARCH_LIST`` kept in :attr:`Resolution.arch_list` (messages; the parse sees all).
ARCH_LIST_SHOWN = 200


def for_messages(value: str | None) -> str | None:
    if value is None or len(value) <= ARCH_LIST_SHOWN:
        return value
    return f"{value[:ARCH_LIST_SHOWN]}... ({len(value)} characters)"


def refused_settings(env: dict[str, str], choice: Choice | None = None) -> tuple[Setting, ...]:
    """Each setting of a toolkit not used as given (P1, P8): a ``CUDA_HOME``/``CUDA_PATH`` that
    ``sources.clean_home`` had to change (``:/usr/local/cuda-13.0``, ``.../bin``), or one ``choice`` refused."""
    from flashinfer_sm120.core.toolkit.policy import EXPLICIT_SOURCES
    from flashinfer_sm120.core.toolkit.probe import NO_NVCC_FIX
    from flashinfer_sm120.core.toolkit.sources import clean_home

    out = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        val = env.get(var) or ""
        if (cleaned := clean_home(val)).rstrip("/") != val.rstrip("/"):
            out.append(Setting(var, val, f"malformed, read as {cleaned!r}", f"export {var}={cleaned}"))
    for r in choice.rejected if choice else ():
        for var in (v for v in EXPLICIT_SOURCES if v in r.toolkit.sources and r.refused):
            fix = NO_NVCC_FIX[var]
            why = bounded(r.why.removeprefix(f"{r.toolkit.given_as}: ").removesuffix(f"; {fix}"))  # P8
            out.append(Setting(var, env.get(var, ""), f"{why}; the toolkit was chosen as if it were unset", fix))
    return tuple(out)


def own_nvcc(naive_root: str | None) -> str | None:
    """The real path of the nvcc FlashInfer alone runs (``$naive_root/bin/nvcc``, wrappers and links followed,
    read, not run), else ``None``."""
    if not naive_root:
        return None
    from flashinfer_sm120.safety.trust import trace

    nvcc = os.path.join(naive_root, "bin", "nvcc")
    return os.path.realpath(trace(nvcc).target or nvcc) if os.path.isfile(nvcc) else None


def resolve(env: dict[str, str] | None = None, *, toolkits: Sequence[Toolkit] | None = None,
            release: ReleaseInfo | None = None, guard: bool = False) -> Resolution:
    """Find the GPUs, parse the arch list, choose a toolkit among ``toolkits`` (default: discovered) and a linkable
    home in ``env``; nothing is patched.  Raises ``ToolkitError`` when none fits (``guard``: returned instead)."""
    from flashinfer_sm120.core.facts.gpus import query
    from flashinfer_sm120.core.toolkit.policy import EXPLICIT_SOURCES, choose, other_major_allowed, torch_cuda_version
    from flashinfer_sm120.core.toolkit.sources import discover, flashinfer_naive_root
    from flashinfer_sm120.core.view.build import linkable_home
    from flashinfer_sm120.core.view.meta import lacks

    env = dict(os.environ if env is None else env)
    if release is None:
        release = release_info(flashinfer_version())
    arch_list = env.get("FLASHINFER_CUDA_ARCH_LIST")
    specs, arch_err = arch_specs(arch_list)
    gq = query()
    gpus = tuple(gq.gpus)
    naive = flashinfer_naive_root(env)
    unset = {k: v for k, v in env.items() if k not in EXPLICIT_SOURCES}
    common = dict(gpus=gpus, arch_list=for_messages(arch_list), arch_list_error=arch_err, naive_root=naive,
                  naive_lacks=tuple(lacks(naive)) if naive else (), release=release, gpu_query=gq,
                  targets_from="gpus" if specs is None else "arch_list")
    candidates = discover(env) if toolkits is None else toolkits
    try:
        choice = choose(candidates, specs, [g.capability for g in gpus], torch_cuda_version(),
                        min_nvcc=release.min_nvcc, min_nvcc_why=release.min_nvcc_why,
                        allow_other_major=other_major_allowed(env),
                        own=(own := None if "FLASHINFER_NVCC" in env else own_nvcc(naive)),
                        own_unset=own_nvcc(flashinfer_naive_root(unset)) if unset != env else None)
    except ToolkitError as exc:
        if not guard:
            raise
        return Resolution(None, None, error=str(exc), fix=getattr(exc, "fix", None), settings=refused_settings(env),
                          **common)
    home = linkable_home(choice.toolkit)
    return Resolution(choice, home, own=own == os.path.realpath(choice.toolkit.nvcc),
                      settings=refused_settings(env, choice), **common)
