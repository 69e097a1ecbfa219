"""Every fix line and refusal message about toolkits and targets, from one place.

A fix line is the one command (or one action) that makes a refused setup work.
Which one is right depends on what torch was built for, because the JIT module
links ``libcudart`` of the nvcc's CUDA major while torch has already loaded its
own (``torch.version.cuda``):

=====================  ==========================================================
torch build            fix line (``X.Y`` = the newer of torch's CUDA release and
                       the nvcc the targets / FlashInfer release need)
=====================  ==========================================================
CUDA 13.x (cu13x)      ``pip install 'cuda-toolkit[nvcc,cccl,curand]==13.Y.*'``
CUDA 12.x (cu12x)      install CUDA 12.Y from NVIDIA or conda
                       (``conda install -c nvidia cuda-toolkit=12.Y``) and set
                       ``CUDA_HOME``, or use a CUDA 13 build of torch.  Never a pip
                       12.x toolkit: no pip wheel before CUDA 13.0 ships nvcc
                       (``nvidia-cuda-nvcc-cu12`` has only ptxas), and the pip
                       prefix ``site-packages/nvidia/cu13`` is 13-only.
CUDA 12.x, target      use a CUDA 13 build of torch and the pip toolkit (no
needs CUDA 13          CUDA 12 nvcc builds e.g. sm_110a)
CPU only (None)        ``pip install 'cuda-toolkit[nvcc,cccl,curand]>=13.0,<14'``
any, unknown target    upgrade flashinfer-sm120 (its target table is
                       older than the GPU), or an explicit suffix in
                       ``FLASHINFER_CUDA_ARCH_LIST`` if nvcc lists the target
=====================  ==========================================================

A pip fix that is already installed (a clean pip toolkit of that release was
found) is never printed: the fix is then to repair that toolkit, or whatever
else is in the way.  Sources: pip prefixes measured on PyPI wheels (see
DESIGN/README "Facts"); CUDA 12.9/13.0 release notes for the target minimums
(:mod:`flashinfer_sm120.core.facts.arch`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from flashinfer_sm120.core.facts import arch as _arch
from flashinfer_sm120.core.toolkit.model import Toolkit

__all__ = [
    "PIP_TOOLKIT",
    "ALLOW_OTHER_MAJOR_ENV",
    "pip_install",
    "upgrade_fix",
    "toolkit_fix",
    "choose_fix",
    "need_for",
    "target_need",
    "unbuildable_message",
    "major_mismatch_reason",
    "torch_major_why",
    "min_nvcc_reason",
    "consistent_set_fix",
]

#: The pip distribution (with extras) that installs one consistent CUDA 13 set
#: (nvcc, nvvm, crt, cudart headers, CCCL, cuRAND) into ``site-packages/nvidia/cu13``.
PIP_TOOLKIT = "cuda-toolkit[nvcc,cccl,curand]"

#: Opt-in to accept an nvcc whose CUDA major differs from torch's (default: never).
ALLOW_OTHER_MAJOR_ENV = "FLASHINFER_SM120_ALLOW_OTHER_CUDA_MAJOR"

#: First CUDA release whose pip wheels ship nvcc.
FIRST_PIP_NVCC = Version("13.0")


def pip_install(spec: str) -> str:
    """``pip install 'cuda-toolkit[nvcc,cccl,curand]<spec>'`` for a spec like ``==13.0.*``."""
    return f"pip install '{PIP_TOOLKIT}{spec}'"


def upgrade_fix(targets: Iterable[tuple[int, str]]) -> str:
    """Fix line for targets missing from :data:`flashinfer_sm120.core.facts.arch.MIN_NVCC`
    (a GPU newer than this flashinfer-sm120): upgrade first; the explicit-suffix
    arch list is the escape hatch until then."""
    targets = list(targets)
    names = ", ".join(_arch.format_target(t) for t in targets)
    hatch = " ".join(f"{t[0]}.{t[1]}" if t[1][-1:] in ("a", "f") else f"{t[0]}.{t[1]}a" for t in targets)
    return (f"upgrade flashinfer-sm120 (this release's target table does not know {names}); "
            f"until then, if `nvcc --list-gpu-arch` lists it, FLASHINFER_CUDA_ARCH_LIST='{hatch}' "
            f"with an nvcc >= {_arch.NEWEST_KNOWN_NVCC} builds it as given")


def target_need(target: tuple[int, str]) -> Version | None:
    """Minimum nvcc for ``target`` (``None`` when not in the table)."""
    return _arch.min_nvcc_for(target)


def need_for(targets: Iterable[tuple[int, str]], min_nvcc: Version | None = None,
             explicit: Iterable[tuple[int, str]] = ()) -> Version | None:
    """The oldest nvcc that builds every known target and meets ``min_nvcc``;
    an ``explicit`` target missing from the table counts as needing
    :data:`~flashinfer_sm120.core.facts.arch.NEWEST_KNOWN_NVCC` (the escape hatch's rule)."""
    explicit = set(explicit)
    needs = [n for n in (target_need(t) or (_arch.NEWEST_KNOWN_NVCC if t in explicit else None)
                         for t in targets) if n is not None]
    if min_nvcc is not None:
        needs.append(min_nvcc)
    return max(needs) if needs else None


def torch_major_why(torch_cuda: str) -> str:
    """Why an nvcc must share torch's CUDA major (the reason behind the default policy)."""
    tmm = _arch.major_minor(torch_cuda)
    major = tmm.major if tmm else torch_cuda
    return f"the JIT module links the nvcc's libcudart major, and torch loads libcudart.so.{major}"


def major_mismatch_reason(nvcc_version: Version, torch_cuda: str) -> str:
    """Reason a toolkit of another CUDA major than torch is rejected (no fix: the
    error's one fix line comes at the end; the opt-in is named)."""
    return (f"CUDA {nvcc_version.major}, but torch is built for CUDA {torch_cuda} "
            f"(another libcudart major; {ALLOW_OTHER_MAJOR_ENV}=1 accepts it anyway)")


def min_nvcc_reason(nvcc_version: Version, min_nvcc: Version, why: str | None) -> str:
    """Reason a toolkit older than the FlashInfer release's own minimum is rejected."""
    return f"nvcc {nvcc_version} is older than {min_nvcc}, needed because {why or 'of this FlashInfer release'}"


def _pip_found(found: Sequence[Toolkit], spec: str) -> Toolkit | None:
    """A pip toolkit among ``found`` whose nvcc release satisfies ``spec``."""
    ss = SpecifierSet(spec)
    for tk in found:
        if "pip" in tk.sources and tk.nvcc_version is not None and ss.contains(
                Version(f"{tk.nvcc_version}.0"), prereleases=True):
            return tk
    return None


def _pip_or_repair(spec: str, found: Sequence[Toolkit], need: Version | None) -> str:
    have = _pip_found(found, spec)
    if have is None:
        return pip_install(spec)
    if have.problem and have.nvcc_version and have.header_version and have.nvcc_version != have.header_version:
        # a mixed set (nvcc 13.0, headers 13.5): the same fix its own rejection names, said once
        return (f"make the pip toolkit at {have.root} one release (nvcc {have.nvcc_version}, headers "
                f"{have.header_version}): {consistent_set_fix(have.nvcc_version, True)}")
    if have.problem:
        return (f"repair the pip toolkit at {have.root} ({have.problem.rstrip('.')}): "
                f"pip install --force-reinstall '{PIP_TOOLKIT}{spec}'")
    # installed and clean, yet refused: only a newer release can help
    newer = Version(f"{have.nvcc_version.major}.{have.nvcc_version.minor + 1}")
    want = max(newer, need) if need is not None else newer
    return pip_install(f">={want},<{want.major + 1}")


def consistent_set_fix(nvcc_version: Version, pip: bool) -> str:
    """Fix line for a toolkit whose parts disagree (nvcc vs ``CUDART_VERSION``
    headers, or a missing ``libcudart``): the pip set of the same release when it
    is a pip toolkit (``cuda-toolkit[...]`` pins nvcc, headers and CCCL to one
    release), else a reinstall of that system toolkit — never a pip 12.x set.

    Args:
        nvcc_version: the toolkit's nvcc ``major.minor``.
        pip: whether it lives in ``site-packages/nvidia/cu13`` (source ``pip``).
    """
    v = Version(f"{nvcc_version.major}.{nvcc_version.minor}")
    if pip and v >= FIRST_PIP_NVCC:
        return pip_install(f"=={v}.*")
    return (f"reinstall CUDA {v} as one set from NVIDIA or conda (conda install -c nvidia "
            f"cuda-toolkit={v}), or set CUDA_HOME to another toolkit")


def toolkit_fix(need: Version | None, torch_cuda: str | None,
                found: Sequence[Toolkit] = ()) -> str:
    """The one fix line that installs a toolkit able to build what is needed.

    Args:
        need: oldest nvcc ``major.minor`` the targets and the FlashInfer release
            need (:func:`need_for`), or ``None`` when nothing in particular.
        torch_cuda: ``torch.version.cuda`` (``None`` for a CPU build of torch).
        found: every toolkit candidate seen, so that a pip toolkit that is
            already installed is never the printed fix.

    Returns:
        One line, without a ``Fix:`` prefix (see the module table).
    """
    tmm = _arch.major_minor(torch_cuda)
    if tmm is None:  # CPU torch: any major; pip 13.x is the one that installs with pip
        lo = max(need, FIRST_PIP_NVCC) if need is not None else FIRST_PIP_NVCC
        if lo.major > FIRST_PIP_NVCC.major:
            return pip_install(f">={lo},<{lo.major + 1}")
        return _pip_or_repair(f">={lo},<{lo.major + 1}", found, need)
    want = max(need, tmm) if need is not None else tmm
    if want.major > tmm.major:
        return (f"use a torch built for CUDA {want.major} (e.g. pip install torch --index-url "
                f"https://download.pytorch.org/whl/cu{want.major}{want.minor}) and "
                f"{pip_install(f'=={want.major}.{want.minor}.*')}: nvcc >= {need} is needed, "
                f"which no CUDA {tmm.major}.x toolkit has")
    if want >= FIRST_PIP_NVCC:
        return _pip_or_repair(f"=={want.major}.{want.minor}.*", found, need)
    return (f"install CUDA {want} from NVIDIA (https://developer.nvidia.com/cuda-toolkit-archive) "
            f"or conda (conda install -c nvidia cuda-toolkit={want}) and set CUDA_HOME to it, "
            f"or use a CUDA 13 build of torch; no pip wheel before CUDA 13.0 ships nvcc")


def choose_fix(wanted: Sequence[tuple[int, str]], torch_cuda: str | None, found: Sequence[Toolkit],
               *, min_nvcc: Version | None = None, explicit: Iterable[tuple[int, str]] = ()) -> str:
    """The fix line when :func:`~flashinfer_sm120.core.toolkit.choose` finds nothing.

    Priority: targets unknown to this release (upgrade flashinfer-sm120), then
    explicit targets no nvcc of torch's major builds (change the arch list),
    then the toolkit to install (:func:`toolkit_fix`).

    Args:
        wanted: the preferred targets (explicit arch-list ones as given).
        torch_cuda: ``torch.version.cuda`` or ``None``.
        found: every candidate seen.
        min_nvcc: the FlashInfer release's minimum nvcc for its own flags.
        explicit: targets given with a suffix in ``FLASHINFER_CUDA_ARCH_LIST``.
    """
    explicit = set(explicit)
    unknown = [t for t in wanted if target_need(t) is None and t not in explicit]
    unknown += [t for t in wanted if t in explicit and target_need(t) is None
                and not any(tk.nvcc_version and _arch.target_supported(t, tk.nvcc_version, explicit=True)
                            for tk in found)]
    if unknown:
        return upgrade_fix(unknown)
    tmm = _arch.major_minor(torch_cuda)
    dropped = [t for t in wanted if _arch.dropped_in(t) is not None
               and (tmm is None or tmm.major >= _arch.dropped_in(t))]
    if dropped:
        return "; ".join(_drop_fix(t) for t in dropped)
    return toolkit_fix(need_for(wanted, min_nvcc, explicit), torch_cuda, found)


def _entry(t: tuple[int, str]) -> str:
    return f"{t[0]}.{t[1]}"


def _drop_fix(t: tuple[int, str]) -> str:
    repl = _arch.RENAMED.get(_arch.target_key(t))
    if repl:
        return (f"write '{_entry(repl)}' instead of '{_entry(t)}' in FLASHINFER_CUDA_ARCH_LIST "
                f"(CUDA {_arch.dropped_in(t)}.0 renamed {_arch.format_target(t)} to {_arch.format_target(repl)})")
    return (f"remove '{_entry(t)}' from FLASHINFER_CUDA_ARCH_LIST (CUDA {_arch.dropped_in(t)}.0 dropped "
            f"{_arch.format_target(t)}), or use a CUDA {_arch.dropped_in(t) - 1} build of torch and toolkit")


def unbuildable_message(target: tuple[int, str], nvcc_version: Version) -> str | None:
    """Why nvcc ``nvcc_version`` cannot build ``target`` given explicitly (arch
    list), with the fix; ``None`` when it can.

    The fix prefers the target's own fallback when this nvcc builds it (e.g.
    ``12.0a`` for ``12.0f`` on nvcc 12.8), else a newer toolkit.
    """
    if _arch.target_supported(target, nvcc_version, explicit=True):
        return None
    name = _arch.format_target(target)
    head = f"{name} cannot be built by nvcc {nvcc_version}"
    if _arch.dropped_in(target) is not None and nvcc_version.major >= _arch.dropped_in(target):
        return f"{head}. Fix: {_drop_fix(target)}."
    need = target_need(target)
    if need is None:
        return (f"{head}: {name} is not in flashinfer-sm120's table of targets and nvcc "
                f"{nvcc_version} is older than {_arch.NEWEST_KNOWN_NVCC}. Fix: {upgrade_fix([target])}.")
    major, minor = target[0], int(target[1][0])
    alt = next((t for t in _arch.candidate_targets(major, minor)
                if t != target and _arch.target_supported(t, nvcc_version)), None)
    fix = f"use a toolkit with nvcc >= {need} (set CUDA_HOME to it)"
    if alt is not None:
        fix = (f"write '{_entry(alt)}' in FLASHINFER_CUDA_ARCH_LIST (nvcc {nvcc_version} builds "
               f"{_arch.format_target(alt)}), or unset it, or " + fix)
    return f"{head} ({name} needs nvcc >= {need}). Fix: {fix}."
